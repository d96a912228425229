"""The admin API: off unless configured, admin token only, every tenant visible, logs streamed, views exact."""

from __future__ import annotations

import logging
import random
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.keys import store_key, throttle_key
from proxy.sessions import tenant_of
from proxy.settings import Secret
from proxy.store.base import NewFact, SessionKey
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import read_log, replay
from tests.test_compaction_e2e import prose
from tests.test_metrics import scrape, value

TOKEN = "admin-secret-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
TENANT_KEY = "sk-tenant-a"
TENANT = tenant_of(TENANT_KEY)
PATHS = [
    ("GET", "/admin/sessions"),
    ("GET", f"/admin/sessions/{TENANT}/s1/log"),
    ("GET", f"/admin/sessions/{TENANT}/s1/view"),
    ("POST", f"/admin/sessions/{TENANT}/s1/compact"),
    ("POST", f"/admin/sessions/{TENANT}/s1/uncompact"),
    ("GET", "/admin"),
    ("GET", "/admin/not-a-route"),
]


class HeaderRecordingUpstream(FakeUpstream):
    """The fake upstream, also keeping the headers of summary requests (the admin compaction sends those)."""

    def __init__(self) -> None:
        super().__init__()
        self.chat_headers: list[dict[str, str]] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.chat_headers.append(dict(request.headers))
        return await super().chat(request)


@pytest.fixture
def fake() -> FakeUpstream:
    return HeaderRecordingUpstream()


def forgive(proxy: Any) -> None:
    """Clear this client's failed admin tokens, so its next one is checked at once (tests/test_ui_signin.py tests
    the delay a wrong token brings)."""
    proxy.app[throttle_key].succeeded("127.0.0.1")


async def admin_proxy(make_proxy: Any, **overrides: Any) -> Any:
    return await make_proxy(admin_token=Secret(TOKEN), **overrides)


async def chat(proxy: Any, messages: list[dict[str, Any]], session: str, key: str = TENANT_KEY) -> Any:
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps({"model": "gpt-4o", "messages": messages}),
                            headers={"Authorization": f"Bearer {key}", "X-Session-Id": session})
    assert resp.status == 200, await resp.text()
    return resp


async def converse(proxy: Any, fake: FakeUpstream, session: str, rounds: int, seed: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for n in range(rounds):
        fact = " Remember FACT-Kestrel5." if n == 0 else ""
        messages.append({"role": "user", "content": f"Round {n}: " + prose(rng, 220) + fact})
        fake.script.append(Reply(content=prose(rng, 160)))
        resp = await chat(proxy, messages, session)
        messages.append((await resp.json())["choices"][0]["message"])
    return messages


async def error_of(resp: Any) -> dict[str, Any]:
    body = await resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    return error


@pytest.mark.parametrize("headers", [{}, ADMIN], ids=["anonymous", "with-token"])
async def test_every_admin_path_is_404_when_no_admin_token_is_configured(proxy, headers: dict[str, str]) -> None:
    for method, path in PATHS:
        resp = await proxy.request(method, path, headers=headers)
        assert resp.status == 404, (method, path)
        assert (await error_of(resp))["type"] == "not_found_error"


@pytest.mark.parametrize("auth", [None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer "],
                         ids=["missing", "wrong", "wrong-scheme", "longer", "empty"])
async def test_every_admin_path_needs_the_admin_token(make_proxy, auth: str | None) -> None:
    proxy = await admin_proxy(make_proxy)
    for method, path in PATHS:
        resp = await proxy.request(method, path, headers={"Authorization": auth} if auth else {})
        assert resp.status == 401, (method, path)
        assert (await error_of(resp))["type"] == "authentication_error"
        forgive(proxy)


async def test_a_tenant_key_never_opens_the_admin_api_not_even_for_its_own_sessions(make_proxy, fake) -> None:
    proxy = await admin_proxy(make_proxy)
    await chat(proxy, [{"role": "user", "content": "mine"}], "s1")
    for method, path in PATHS:
        resp = await proxy.request(method, path, headers={"Authorization": f"Bearer {TENANT_KEY}"})
        assert resp.status == 401, (method, path)
        forgive(proxy)
    resp = await proxy.get(f"/admin/sessions/{TENANT}/s1/log", headers=ADMIN)
    assert resp.status == 200


async def test_session_list_shows_every_tenant(make_proxy, fake) -> None:
    proxy = await admin_proxy(make_proxy)
    await chat(proxy, [{"role": "user", "content": "a"}], "shared")
    await chat(proxy, [{"role": "user", "content": "b"}], "shared", key="sk-tenant-b")
    await chat(proxy, [{"role": "user", "content": "c"}], "other")
    resp = await proxy.get("/admin/sessions", headers=ADMIN)
    assert resp.status == 200 and resp.content_type == "application/json"
    rows = await resp.json()
    assert {(r["tenant"], r["session"], r["messages"], r["checkpoints"]) for r in rows} == {
        (TENANT, "shared", 2, 0), (tenant_of("sk-tenant-b"), "shared", 2, 0), (TENANT, "other", 2, 0)}
    assert all(set(r) == {"tenant", "session", "messages", "checkpoints", "updated_at"} for r in rows)
    assert [r["updated_at"] for r in rows] == sorted((r["updated_at"] for r in rows), reverse=True)
    _, samples = await scrape(proxy)
    assert value(samples, "ctxproxy_requests_total", route="admin", status="200") == 1


async def test_a_large_log_streams_as_ndjson_line_by_line(make_proxy) -> None:
    proxy = await admin_proxy(make_proxy)
    store = proxy.app[store_key]
    key = SessionKey(TENANT, "big")
    total = 5_000
    for start in range(0, total, 500):
        facts = [NewFact(kind="message", index=i, source="client", message={"role": "user", "content": f"m{i}"},
                         hash=f"h{i}", extra={"n": i}) for i in range(start, start + 500)]
        await store.append(key, start, facts, ts=1_700_000_000.0 + start)
    resp = await proxy.get(f"/admin/sessions/{TENANT}/big/log", headers=ADMIN)
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/x-ndjson"
    assert "Content-Length" not in resp.headers
    assert resp.headers["Transfer-Encoding"] == "chunked"
    seqs = []
    while line := await resp.content.readline():
        entry = orjson.loads(line)
        assert entry["message"] == {"role": "user", "content": f"m{entry['seq']}"}
        assert (entry["kind"], entry["index"], entry["source"], entry["n"]) == ("message", entry["seq"], "client",
                                                                               entry["seq"])
        seqs.append(entry["seq"])
    assert seqs == list(range(total))
    stored = await store.read(key, after=41, limit=1)
    resp = await proxy.get(f"/admin/sessions/{TENANT}/big/log", headers=ADMIN)
    assert orjson.loads((await resp.read()).splitlines()[42]) == stored[0].to_json()


async def test_unknown_and_invalid_sessions(make_proxy) -> None:
    proxy = await admin_proxy(make_proxy)
    for method, action in (("GET", "log"), ("GET", "view"), ("POST", "compact")):
        resp = await proxy.request(method, f"/admin/sessions/{TENANT}/nobody/{action}", headers=ADMIN)
        assert resp.status == 404
        assert "nobody" in (await error_of(resp))["message"]
    resp = await proxy.get(f"/admin/sessions/{TENANT}/bad$id/view", headers=ADMIN)
    assert resp.status == 400 and (await error_of(resp))["param"] == "session"


async def test_view_is_what_the_next_request_sends_upstream(make_proxy, fake: FakeUpstream) -> None:
    proxy = await admin_proxy(make_proxy, context_window=4000)
    await converse(proxy, fake, "viewed", 12)
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "viewed"))
    checkpoints = [f for f in facts if f.kind == "checkpoint"]
    assert checkpoints, "the conversation must have compacted for this test to mean anything"

    resp = await proxy.get(f"/admin/sessions/{TENANT}/viewed/view", headers=ADMIN)
    assert resp.status == 200
    view = await resp.json()
    assert set(view) == {"messages", "estimate", "checkpoint", "usage"}
    assert view["checkpoint"] == checkpoints[-1].extra["checkpoint"]
    replies = [f for f in facts if f.kind == "message" and f.source == "upstream"]
    usage = view["usage"]
    prompt = sum(f.extra["usage"]["prompt_tokens"] for f in replies)
    assert {k: usage[k] for k in ("replies", "cached_tokens", "prompt_tokens", "model_tokens")} == {
        "replies": len(replies), "cached_tokens": 0, "prompt_tokens": prompt, "model_tokens": prompt}
    assert usage["gross_saved_tokens"] > 0 and usage["client_tokens"] == prompt + usage["gross_saved_tokens"]
    assert usage["saved_tokens"] == (usage["gross_saved_tokens"] - usage["summary_tokens"]
                                    - usage["caused_write_tokens"])
    assert "FACT-Kestrel5" in orjson.dumps(view["messages"]).decode()

    resp = await chat(proxy, replay(facts), "viewed")  # the client resends exactly what the log holds
    assert resp.headers["X-Ctxproxy-Compacted"] == "none"
    assert fake.requests[-1]["messages"] == view["messages"]
    assert int(resp.headers["X-Ctxproxy-View-Tokens"]) == view["estimate"]


async def test_view_without_a_checkpoint_is_the_conversation(make_proxy, fake) -> None:
    proxy = await admin_proxy(make_proxy)
    hello = {"role": "user", "content": "hello"}
    resp = await chat(proxy, [hello], "plain")
    reply = (await resp.json())["choices"][0]["message"]
    view = await (await proxy.get(f"/admin/sessions/{TENANT}/plain/view", headers=ADMIN)).json()
    prompt = fake.count({"messages": [hello]})  # what the fake reports: its tokenizer's count of the request
    # an upstream that reports no cache writes: they are the proxy's estimate, and the peak its count of the request
    sent = int(resp.headers["X-Ctxproxy-View-Tokens"])
    assert view == {"messages": [hello, reply], "estimate": view["estimate"],
                    "checkpoint": None, "usage": {"replies": 1, "prompt_tokens": prompt, "cached_tokens": 0,
                                                  "client_tokens": prompt, "model_tokens": prompt, "saved_tokens": 0,
                                                  "cost_saved": 0.0, "gross_saved_tokens": 0, "gross_cost_saved": 0.0,
                                                  "summary_calls": 0, "summary_tokens": 0, "summary_cost": None,
                                                  # a first request writes its whole prompt to the cache
                                                  "cache_write_tokens": sent, "ttl_write_tokens": 0,
                                                  "peak_tokens": sent,
                                                  "rewrite_factor": 1.0,
                                                  "prefix_changes": {"compaction": 0, "masking": 0, "client": 0,
                                                                     "ttl": 0},
                                                  "caused_write_tokens": 0, "caused_write_cost": None}}
    assert view["estimate"] > 0


async def test_compact_now_with_instructions(make_proxy, fake: HeaderRecordingUpstream, caplog) -> None:
    proxy = await admin_proxy(make_proxy, min_retain_rounds=1)
    caplog.set_level(logging.DEBUG)
    messages = await converse(proxy, fake, "manual", 4)
    assert not fake.summary_requests
    resp = await proxy.post(f"/admin/sessions/{TENANT}/manual/compact",
                            data=orjson.dumps({"instructions": "Keep every FACT- token verbatim."}),
                            headers={**ADMIN, "X-Upstream-Authorization": "Bearer sk-upstream-for-a"})
    assert resp.status == 200
    result = await resp.json()
    assert result["outcome"] == "ok"
    assert result["tokens_before"] > result["tokens_after"] > 0
    assert "Keep every FACT- token verbatim." in fake.summary_requests[-1]["messages"][-1]["content"]
    summary_headers = fake.chat_headers[-1]
    assert summary_headers["Authorization"] == "Bearer sk-upstream-for-a"
    assert all(TOKEN not in v for v in summary_headers.values())
    assert "sk-upstream-for-a" not in caplog.text

    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "manual"))
    assert [f.kind for f in facts[-2:]] == ["summary", "checkpoint"]
    assert facts[-1].extra["checkpoint"] == result["checkpoint"]
    view = await (await proxy.get(f"/admin/sessions/{TENANT}/manual/view", headers=ADMIN)).json()
    assert view["checkpoint"] == result["checkpoint"]
    assert len(view["messages"]) < len(messages)
    _, samples = await scrape(proxy)
    assert value(samples, "ctxproxy_compactions_total", trigger="manual", outcome="ok") == 1


async def test_compact_uses_the_proxy_upstream_key_and_never_the_admin_token(make_proxy, fake) -> None:
    proxy = await admin_proxy(make_proxy, min_retain_rounds=1, upstream_key=Secret("sk-proxy-owned"))
    await converse(proxy, fake, "keyed", 4)
    resp = await proxy.post(f"/admin/sessions/{TENANT}/keyed/compact", headers=ADMIN)
    assert (await resp.json())["outcome"] == "ok"
    assert fake.chat_headers[-1]["Authorization"] == "Bearer sk-proxy-owned"


async def test_compact_without_upstream_credentials_sends_none(make_proxy, fake) -> None:
    proxy = await admin_proxy(make_proxy, min_retain_rounds=1)
    await converse(proxy, fake, "bare", 4)
    resp = await proxy.post(f"/admin/sessions/{TENANT}/bare/compact", headers=ADMIN)
    assert (await resp.json())["outcome"] == "ok"
    assert "Authorization" not in fake.chat_headers[-1]


@pytest.mark.parametrize("body", [b"[1]", b"{not json", b'{"instructions": 7}'])
async def test_compact_refuses_a_malformed_body(make_proxy, fake, body: bytes) -> None:
    proxy = await admin_proxy(make_proxy)
    await chat(proxy, [{"role": "user", "content": "x"}], "s1")
    resp = await proxy.post(f"/admin/sessions/{TENANT}/s1/compact", data=body, headers=ADMIN)
    assert resp.status == 400
    assert (await error_of(resp))["type"] == "invalid_request_error"
    assert not fake.summary_requests
