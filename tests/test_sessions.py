"""Which session and tenant a request lands in."""

from __future__ import annotations

import orjson
import pytest

from proxy.context.log.history import HistoryManager
from proxy.dialects import CHAT
from proxy.keys import history_key
from proxy.sessions import credential, fingerprint_session, tenant_of
from proxy.store.base import SessionKey

BODY = {"model": "m", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]}


async def session_of(proxy, path="/v1/chat/completions", headers=None, body=None) -> str:
    resp = await proxy.post(path, data=orjson.dumps(body or BODY), headers=headers or {})
    assert resp.status == 200
    return resp.headers["X-Session-Id"]


async def test_url_prefix_wins_over_headers(proxy) -> None:
    assert await session_of(proxy, "/s/from-url/v1/chat/completions", {"X-Session-Id": "from-header"}) == "from-url"


async def test_header_then_foreign_headers_then_fingerprint(proxy) -> None:
    assert await session_of(proxy, headers={"X-Session-Id": "mine", "session-id": "codex"}) == "mine"
    assert await session_of(proxy, headers={"session-id": "codex-123"}) == "codex-123"
    assert await session_of(proxy, headers={"x-claude-code-session-id": "cc-9"}) == "cc-9"
    assert await session_of(proxy, headers={"helicone-session-id": "not valid!"}) == fingerprint_session(CHAT,
        BODY["messages"])
    assert (await session_of(proxy)).startswith("auto-")


def test_fingerprint_uses_whole_messages_not_a_prefix() -> None:
    long = "x" * 10_000
    a = [{"role": "system", "content": long + "A"}, {"role": "user", "content": "go"}]
    b = [{"role": "system", "content": long + "B"}, {"role": "user", "content": "go"}]
    assert fingerprint_session(CHAT, a) != fingerprint_session(CHAT, b)
    later = [*a, {"role": "assistant", "content": "done"}, {"role": "user", "content": "more"}]
    assert fingerprint_session(CHAT, a) == fingerprint_session(CHAT, later)


def test_tenant_is_a_hash_of_the_key() -> None:
    assert credential({"Authorization": "Bearer sk-1"}) == "sk-1"
    assert credential({"api-key": "sk-1"}) == "sk-1"
    assert tenant_of("sk-1") == tenant_of("sk-1") != tenant_of("sk-2")
    assert "sk-1" not in tenant_of("sk-1")
    assert len(tenant_of("sk-1")) == 16


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_same_session_under_two_keys_is_two_sessions(proxy) -> None:
    for key in ("sk-a", "sk-b"):
        await session_of(proxy, headers={"X-Session-Id": "shared", "Authorization": f"Bearer {key}"})
    history: HistoryManager = proxy.app[history_key]
    a = await history.state(SessionKey(tenant_of("sk-a"), "shared"), refresh=True)
    b = await history.state(SessionKey(tenant_of("sk-b"), "shared"), refresh=True)
    assert len(a.hashes) == len(b.hashes) == 3
    assert a.seqs == b.seqs == [0, 1, 2]
