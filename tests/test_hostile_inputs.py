"""Hostile inputs that once got a 5xx get a 4xx (or, for a model's tool call, an in-band answer)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.app import create_app
from proxy.http import ui
from proxy.secret import Reference, seal
from proxy.sessions import tenant_of
from proxy.settings import Secret, Settings
from proxy.store.base import MAX_SEQ, as_seq, parse_seq
from tests.test_errors import _closed_port
from tests.test_ui import CSP, TOKEN, agent_session, session_path, sign_in, ui_proxy

NOT_A_STRING: list[Any] = [{}, [], {"a": 1}, [1, "x"]]
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def bodies(kind: Any) -> list[tuple[str, dict[str, Any]]]:
    """Requests of each door with ``kind`` as the ``type`` of an item or of a content part."""
    part = {"type": kind, "text": "x"}
    return [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": [part]}]}),
        ("/v1/chat/completions", {"model": "m", "messages": [
            {"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{**CALL, "type": kind}]}]}),
        ("/v1/responses", {"model": "m", "input": [{"type": kind, "role": "user", "content": "x"}]}),
        ("/v1/responses", {"model": "m", "input": [{"type": "message", "role": "user", "content": [part]}]}),
        ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": [part]}]}),
        ("/v1/responses/input_tokens", {"model": "m", "input": [{"type": kind, "role": "user", "content": "x"}]}),
        ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [part]}]}),
        ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [part]}]}]}),
        ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": [part]}]}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "system", "content": "s"}, {
            "role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": [
                {"type": "text", "text": "x", "content": [{"type": "text", "content": [part]}]}]}]}),
    ]


@pytest.mark.parametrize("kind", NOT_A_STRING, ids=["object", "array", "object2", "array2"])
async def test_a_type_that_is_not_a_string_is_a_400_at_every_door(aiohttp_client, tmp_path: Path, kind: Any) -> None:
    closed = f"http://127.0.0.1:{_closed_port()}"  # nothing may go upstream
    proxy = await aiohttp_client(create_app(Settings(upstream=closed + "/v1", anthropic_upstream=closed,
                                                     store=f"sqlite:///{tmp_path}/f.db")))
    for (path, body), headers in itertools.product(bodies(kind), ({"X-Session-Id": "hostile"}, {})):
        resp = await proxy.post(path, data=orjson.dumps(body), headers=headers)  # no session: it is fingerprinted
        assert resp.status == 400, (path, body, await resp.text())
        text = await resp.text()
        assert "type must be a string" in text, text


HUGE = "9" * 5000


@pytest.mark.parametrize("query", ["page=\u00b2", "page=" + HUGE, "page=-1", "page=1_0", "page=%201", "page=\u0663",
                                   "since=\u00b2", "since=" + HUGE, "since=9223372036854775808"])
async def test_an_inspector_number_that_is_not_one_is_a_400(make_proxy, fake, query: str) -> None:
    proxy = await ui_proxy(make_proxy)
    await sign_in(proxy)
    await agent_session(proxy, fake, "s1", 1)
    path = session_path("s1") + ("/live?" if query.startswith("since") else "?") + query
    resp = await proxy.get(path)
    assert resp.status == 400, (query, await resp.text())
    assert (await resp.json())["error"]["param"] == query.split("=")[0]
    assert resp.headers["Content-Security-Policy"] == CSP and resp.headers["X-Frame-Options"] == "DENY"
    assert (resp.headers["X-Content-Type-Options"], resp.headers["Cache-Control"]) == ("nosniff", "no-store")


@pytest.mark.parametrize("seq", ["9223372036854775807", "9223372036854775808", "9223372036854775809", HUGE])
async def test_an_entry_past_what_a_log_holds_is_a_404(make_proxy, fake, seq: str) -> None:
    proxy = await ui_proxy(make_proxy)
    await sign_in(proxy)
    await agent_session(proxy, fake, "s1", 1)
    for tail in ("/entries/", "/requests/"):
        resp = await proxy.get(session_path("s1") + tail + seq)
        assert resp.status == 404, (tail, await resp.text())
        assert resp.headers["Content-Security-Policy"] == CSP


async def test_the_inspectors_json_errors_and_500s_carry_its_security_headers(aiohttp_client, tmp_path: Path) -> None:
    app = create_app(Settings(store=f"sqlite:///{tmp_path}/f.db", admin_token=Secret(TOKEN)))
    app.router.add_get("/ui/test/fails", ui.guard(fails))  # a failure of ours under the guard
    proxy = await aiohttp_client(app)
    answers = [await proxy.get(session_path("s1") + "/live")]  # 401, JSON
    await sign_in(proxy)
    answers += [await proxy.get("/ui/static/nothing.js"), await proxy.get(session_path("s1") + "/live?since=x"),
                await proxy.get(f"/ui/sessions/{tenant_of('k')}/bad%20id"), await proxy.get("/ui/test/fails")]
    assert [r.status for r in answers] == [401, 404, 400, 400, 500]
    for resp in answers:
        assert resp.content_type == "application/json"
        assert resp.headers["Content-Security-Policy"] == CSP, resp.url
        assert (resp.headers["X-Content-Type-Options"], resp.headers["X-Frame-Options"]) == ("nosniff", "DENY")
        assert resp.headers["Cache-Control"] == "no-store"


async def fails(request: web.Request) -> web.Response:
    raise RuntimeError("a bug")


@pytest.mark.parametrize("seq", [2**63, 2**64 - 1])
async def test_a_validly_sealed_reference_to_a_seq_past_what_a_log_holds_is_a_400(make_proxy, fake, seq: int) -> None:
    proxy = await make_proxy(secret=Secret("s" * 43))
    token = seal(b"s" * 43, Reference(tenant_of("k"), "run-1", seq, "9c1e"))  # names the entry; carries nothing
    body = {"model": "m", "store": False, "input": [
        {"type": "compaction", "encrypted_content": token},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]}]}
    resp = await proxy.post("/v1/responses", data=orjson.dumps(body),
                            headers={"Authorization": "Bearer k", "session-id": "run-1"})
    assert resp.status == 400, await resp.text()
    assert (await resp.json())["error"]["code"] == "invalid_compaction_reference"
    assert fake.requests == []


def test_seqs_are_whole_numbers_a_log_can_hold() -> None:
    assert [as_seq(v) for v in (0, 7, MAX_SEQ, MAX_SEQ + 1, -1, True, 7.0, "7", None)] == [
        0, 7, MAX_SEQ, None, None, None, None, None, None]
    assert [parse_seq(v) for v in ("0", "007", str(MAX_SEQ), str(MAX_SEQ + 1), "\u00b2", "\u0663", "-1", "+1",
                                   " 1", "1_0", "", "9" * 20, HUGE)] == [
        0, 7, MAX_SEQ, None, None, None, None, None, None, None, None, None, None]
