"""Sessions of the Responses and Messages doors: where their ids come from, sub-agents as sessions of their own
(ids with a '/'), and reading such sessions back through the admin API, the CLI and the inspector."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from click.testing import CliRunner, Result

from proxy.cli import main
from proxy.constants import HEADER_COMPACTED, HEADER_SESSION
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Secret
from proxy.store.base import SessionKey
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script
from tests.proxyfixtures import read_log
from tests.scripted import INSTRUCTIONS, KEY, TASK, Claude, Codex, rig
from tests.test_ui import sign_in

TOKEN = "admin-token-for-doors"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
TENANT = tenant_of(KEY)
WINDOW = 4000
ENV = {"CTXPROXY_CONTEXT_WINDOW": str(WINDOW), "CTXPROXY_COMPRESSION_THRESHOLD": None, "CTXPROXY_ESTIMATOR": None,
       "CTXPROXY_SUMMARY_PLACEMENT": None, "CTXPROXY_SUMMARY_MODEL": None, "CTXPROXY_STORE": None}


def fake_for(api: str, steps: int = 20) -> FakeResponses | FakeMessages:
    return FakeResponses(Script(steps=steps)) if api == "responses" else FakeMessages(Script(steps=steps))


def agent(api: str, proxy: Any, session: str, headers: dict[str, str] | None = None) -> Codex | Claude:
    return (Codex if api == "responses" else Claude)(proxy, session=session, headers=headers or {})


async def sessions(proxy: Any) -> list[str]:
    return sorted([info.session async for info in proxy.server.app[store_key].sessions()])


# -- where a session comes from -------------------------------------------------------------------


@pytest.mark.parametrize(("headers", "expected"), [({"session_id": "hdr-1"}, "hdr-1"),
                                                   ({"session-id": "hdr-2"}, "hdr-2"),
                                                   ({}, "cache-key-3")])
async def test_codex_sessions_come_from_its_header_else_its_prompt_cache_key(
        aiohttp_server, aiohttp_client, tmp_path: Path, headers: dict[str, str], expected: str) -> None:
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeResponses())
    body = Codex(proxy, session="cache-key-3").body(stream=False)
    resp = await proxy.post("/v1/responses", data=orjson.dumps(body),
                            headers={"Authorization": f"Bearer {KEY}", **headers})
    assert (resp.status, resp.headers[HEADER_SESSION]) == (200, expected)
    assert await sessions(proxy) == [expected]


@pytest.mark.parametrize(("headers", "expected"), [({"X-Claude-Code-Session-Id": "hdr-1"}, "hdr-1"),
                                                   ({}, "metadata-2")])
async def test_claude_sessions_come_from_its_header_else_metadata_user_id(
        aiohttp_server, aiohttp_client, tmp_path: Path, headers: dict[str, str], expected: str) -> None:
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeMessages())
    body = Claude(proxy, session="metadata-2").body(stream=False)
    resp = await proxy.post("/v1/messages?beta=true", data=orjson.dumps(body),
                            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", **headers})
    assert (resp.status, resp.headers[HEADER_SESSION]) == (200, expected)
    assert await sessions(proxy) == [expected]


@pytest.mark.parametrize(("api", "header"), [("responses", "x-openai-subagent"),
                                             ("messages", "x-claude-code-agent-id")])
async def test_a_sub_agent_is_its_own_session_and_never_rewinds_its_parent(
        aiohttp_server, aiohttp_client, tmp_path: Path, api: str, header: str) -> None:
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake_for(api))
    parent = agent(api, proxy, "run-9")
    child = agent(api, proxy, "run-9", {header: "explore"})
    if isinstance(child, Codex):
        child.items[0]["content"][0]["text"] = "Look around the repository first."
    else:
        child.messages[0]["content"] = "Look around the repository first."
    for client in (parent, child, parent, child, parent):
        resp = await client.step()
        assert resp.headers[HEADER_SESSION] == ("run-9/explore" if client is child else "run-9")
    assert await sessions(proxy) == ["run-9", "run-9/explore"]
    for session, client in (("run-9", parent), ("run-9/explore", child)):
        facts = await read_log(proxy.server.app[store_key], SessionKey(TENANT, session))
        assert [f.kind for f in facts] == ["message"] * len(facts)  # no rewind: one lineage each
        logged = [f.message for f in facts]
        assert len(logged) == len(client.items if isinstance(client, Codex) else client.messages) - 1


# -- sessions with a '/' (and both doors) read back ------------------------------------------------


async def logged_session(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path, api: str, session: str,
                         headers: dict[str, str] | None = None) -> tuple[Any, Codex | Claude, Any]:
    """A proxy with an admin token and one session of ``api`` logged, eight steps long: under the window's
    threshold, never compacted, but more than its tail may keep."""
    fake = fake_for(api)
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, admin_token=Secret(TOKEN),
                      context_window=WINDOW)
    client = agent(api, proxy, session, headers)
    for _ in range(8):
        assert (await client.step()).headers[HEADER_COMPACTED] == "none"
    return proxy, client, fake


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_admin_log_view_and_compact_for_a_sub_agent_of_each_api(aiohttp_server, aiohttp_client,
                                                                      tmp_path: Path, api: str) -> None:
    header = "x-openai-subagent" if api == "responses" else "x-claude-code-agent-id"
    proxy, client, fake = await logged_session(aiohttp_server, aiohttp_client, tmp_path, api, "run-4",
                                               {header: "a1"})
    conversation = client.items if isinstance(client, Codex) else client.messages
    logged = conversation[:-1]  # the last tool output is not sent yet
    for session in ("run-4%2Fa1", "run-4/a1"):
        base = f"/admin/sessions/{TENANT}/{session}"
        log = await proxy.get(base + "/log", headers=ADMIN)
        lines = [orjson.loads(line) for line in (await log.read()).splitlines()]
        assert (log.status, [line["message"] for line in lines]) == (200, logged)
        assert {line["dialect"] for line in lines} == {api}
        view = await proxy.get(base + "/view?model=m", headers=ADMIN)
        assert (view.status, (await view.json())["messages"]) == (200, logged)

    compact = await proxy.post(f"/admin/sessions/{TENANT}/run-4%2Fa1/compact?model=m",
                               headers={**ADMIN, "X-Upstream-Authorization": "sk-upstream"})
    assert (compact.status, (await compact.json())["outcome"]) == (200, "ok")
    (summary,) = [r for r in fake.requests if r.kind == "summary"]  # in the session's own API, as the tenant
    sent = {k.lower(): v for k, v in summary.headers.items()}
    if api == "messages":
        assert (summary.path, sent["x-api-key"], sent["anthropic-version"]) == ("/v1/messages", "sk-upstream",
                                                                                "2023-06-01")
        assert "authorization" not in sent
    else:
        assert (summary.path, sent["authorization"]) == ("/v1/responses", "Bearer sk-upstream")
        assert not {"x-api-key", "anthropic-version"} & set(sent)
    view = await (await proxy.get(f"/admin/sessions/{TENANT}/run-4/a1/view?model=m", headers=ADMIN)).json()
    assert view["checkpoint"] is not None and len(view["messages"]) < len(logged)
    assert view["messages"][-1] == logged[-1]
    first = view["messages"][0]
    text = first["content"][0]["text"]
    assert text.startswith("[ctxproxy]") and (TASK in orjson.dumps(first).decode())
    assert (await proxy.get(f"/admin/sessions/{TENANT}/run-4%2Fa1%2Fb2/view", headers=ADMIN)).status == 400
    assert (await proxy.get(f"/admin/sessions/{TENANT}/run-4/no-such/view", headers=ADMIN)).status == 404


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=ENV, catch_exceptions=False)


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_cli_log_and_view_for_a_sub_agent_of_each_api(aiohttp_server, aiohttp_client, tmp_path: Path,
                                                            api: str) -> None:
    header = "x-openai-subagent" if api == "responses" else "x-claude-code-agent-id"
    _, client, _ = await logged_session(aiohttp_server, aiohttp_client, tmp_path, api, "run-5", {header: "a2"})
    logged = (client.items if isinstance(client, Codex) else client.messages)[:-1]
    store = f"sqlite:///{tmp_path}/facts.db"
    listed = await asyncio.to_thread(cli, "sessions", "list", "--json", "--store", store)
    assert [s["session"] for s in orjson.loads(listed.output)] == ["run-5/a2"]
    log = await asyncio.to_thread(cli, "sessions", "log", "run-5/a2", "--store", store)
    assert log.exit_code == 0, log.output
    assert log.output.startswith(f"# Session run-5/a2 (tenant {TENANT})\n")
    assert "echo step-8" in log.output
    view = await asyncio.to_thread(cli, "sessions", "view", "run-5/a2", "--json", "--store", store)
    assert view.exit_code == 0, view.output
    assert orjson.loads(view.output)["messages"] == logged
    text = await asyncio.to_thread(cli, "sessions", "view", "run-5/a2", "--store", store)
    assert text.output.startswith(f"# View of session run-5/a2 (tenant {TENANT})\n")
    assert INSTRUCTIONS not in text.output  # the system prompt is a request field in both APIs, not an item


async def test_the_inspector_links_and_serves_a_sub_agents_pages(aiohttp_server, aiohttp_client,
                                                                 tmp_path: Path) -> None:
    proxy, _, _ = await logged_session(aiohttp_server, aiohttp_client, tmp_path, "messages", "run-6",
                                    {"x-claude-code-agent-id": "a3"})
    path = f"/ui/sessions/{TENANT}/run-6%2Fa3"
    resp = await proxy.get(path, allow_redirects=False)
    assert (resp.status, resp.headers["Location"]) == (303, "/ui/signin?next=" + quote(path, safe=""))
    assert (await sign_in(proxy, path, TOKEN)).headers["Location"] == path
    listing = await (await proxy.get("/ui")).text()
    assert f'href="{path}"' in listing
    page = await proxy.get(path)
    assert page.status == 200
    assert "run-6/a3" in await page.text()
    for tail in ("/entries/0", "/live?since=0"):
        assert (await proxy.get(path + tail)).status == 200, tail
    assert (await proxy.get(f"/ui/sessions/{TENANT}/run-6%2Fa3%2Fx")).status == 400
