"""Sessions that outlive a credential: an OAuth token refreshed mid-run keeps the session, its checkpoints and
Codex's compaction item; a request under another token that does not hold the conversation gets nothing of it.

The scripted Claude Code (Messages door) and Codex (Responses door) of tests/scripted.py run against the fake
upstreams with a bearer token, as on a subscription, long enough for the proxy to compact; then the token
changes, as Claude Code's and Codex's OAuth refresh does, and the run goes on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.constants import HEADER_COMPACTED, HEADER_SESSION
from proxy.context.log.continuity import PROOF_MAX_NEW, PROOF_MIN_TOKENS, Proof, holds, proof
from proxy.context.log.lineage import ConversationState
from proxy.dialects import CHAT
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey, StoredFact
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script
from tests.proxyfixtures import read_log
from tests.scripted import Claude, Codex, rig

WINDOW = 4000
SECRET = "a-secret-of-sixteen-or-more"
TOKENS = ["oauth-access-1st-5b1f0c", "oauth-access-2nd-9e77d2", "oauth-access-3rd-41aa6e"]
STRANGER = "oauth-access-someone-c3d8e1"
RUN = "run-refreshed"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class OAuthClaude(Claude):
    """Claude Code on a subscription: its OAuth access token as a bearer token, no API key."""

    def request_headers(self) -> dict[str, str]:
        return {name: value for name, value in super().request_headers().items() if name != "x-api-key"}


def agent_for(api: str, proxy: Any, token: str) -> Codex | Claude:
    return (Codex if api == "responses" else OAuthClaude)(proxy, session=RUN, headers=bearer(token))


def texts(value: Any) -> str:
    """Every string in a request body, one a line: where a summary's text would be."""
    if isinstance(value, dict):
        return "\n".join(texts(v) for v in value.values())
    if isinstance(value, list):
        return "\n".join(texts(v) for v in value)
    return value if isinstance(value, str) else ""


def conversation(client: Codex | Claude) -> list[dict[str, Any]]:
    return client.items if isinstance(client, Codex) else client.messages


async def proxy_for(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path, api: str,
                    fake: FakeResponses | FakeMessages | None = None, **overrides: Any) -> Any:
    if fake is None:
        fake = FakeResponses(Script(steps=40)) if api == "responses" else FakeMessages(Script(steps=40))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=WINDOW, **overrides)
    return proxy, fake


async def compacted_run(proxy: Any, api: str, token: str) -> tuple[Codex | Claude, list[StoredFact]]:
    """A run under ``token``, stepped until its view stands on a summary (a ready one waits for the trigger
    mid-burst: ``proxy.context.view.worth``); the agent and its log."""
    client = agent_for(api, proxy, token)
    for _ in range(40):
        resp = await client.step()
        facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(token), RUN))
        if resp.headers[HEADER_COMPACTED] != "none" and any(summaries(facts)):
            return client, facts
    raise AssertionError("the run was never compacted")


def summaries(facts: list[StoredFact]) -> list[str]:
    return [f.extra["checkpoint"]["summary"] for f in facts if f.kind == "checkpoint"]


async def stored_sessions(proxy: Any) -> list[tuple[str, str]]:
    return sorted([(info.tenant, info.session) async for info in proxy.app[store_key].sessions()])


@pytest.mark.parametrize("api", ["messages", "responses"])
async def test_a_token_refreshed_mid_run_keeps_the_session_and_its_checkpoints(aiohttp_server, aiohttp_client,
                                                                              tmp_path: Path, api: str) -> None:
    proxy, fake = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, api)
    client, facts = await compacted_run(proxy, api, TOKENS[0])
    original = SessionKey(tenant_of(TOKENS[0]), RUN)
    summary_calls = len([r for r in fake.requests if r.kind == "summary"])

    for token in TOKENS[1:]:  # refreshed, and refreshed again
        client.headers = bearer(token)
        resp = await client.step()
        assert resp.headers[HEADER_SESSION] == RUN
        made = [summary for summary in summaries(await read_log(proxy.app[store_key], original)) if summary]
        assert any(summary in texts(fake.turns()[-1].body) for summary in made), "the session's view, compacted"
        link = await proxy.app[store_key].link_of(SessionKey(tenant_of(token), RUN))
        assert link is not None and link.tenant == original.tenant

    after = await read_log(proxy.app[store_key], original)
    assert after[:len(facts)] == facts and len(after) > len(facts), "the same log, extended"
    assert [f.message for f in after if f.kind == "message"][-1] == conversation(client)[-2], "the last reply"
    assert await stored_sessions(proxy) == [original], "no new session under the new tenants"
    assert len([r for r in fake.requests if r.kind == "summary"]) <= summary_calls + 1, "no summary from scratch"


async def test_a_link_outlives_the_process(aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """A second proxy on the same store (another replica, or after a restart) resolves the new token at once."""
    proxy, fake = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, "messages")
    client, _ = await compacted_run(proxy, "messages", TOKENS[0])
    original = SessionKey(tenant_of(TOKENS[0]), RUN)
    client.headers = bearer(TOKENS[1])
    await client.step()
    replica, _ = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, "messages", fake)
    # A side call (a title, a quota probe) does not hold what proved the link: it is its own key's, and gets
    # nothing of the session.
    side = OAuthClaude(replica, session=RUN, headers=bearer(TOKENS[1]),
                       messages=[{"role": "user", "content": "Write a five-word title for this session."}])
    assert (await side.step()).headers[HEADER_SESSION] == RUN
    assert await stored_sessions(replica) == sorted([original, SessionKey(tenant_of(TOKENS[1]), RUN)])
    before = await read_log(replica.app[store_key], original)
    client.client = replica
    await client.step()
    after = await read_log(replica.app[store_key], original)
    assert after[:len(before)] == before and len(after) > len(before), "the run goes on in its own log"


@pytest.mark.parametrize("route", ["endpoint", "trigger"])
async def test_codexs_compaction_item_works_after_a_refresh(aiohttp_server, aiohttp_client, tmp_path: Path,
                                                            route: str) -> None:
    """After Codex's remote compaction its history is the item and what it kept: the item itself proves the
    session (nothing else of the history could) for each request that carries it, and expands under the new
    token."""
    proxy, fake = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, "responses")
    client, _ = await compacted_run(proxy, "responses", TOKENS[0])
    assert isinstance(client, Codex)
    if route == "endpoint":
        resp = await proxy.post("/v1/responses/compact", headers={**bearer(TOKENS[0]), "session_id": RUN},
                                json={"model": "gpt-5.5", "input": client.items})
        [item] = (await resp.json())["output"]
    else:
        resp = await proxy.post("/v1/responses", headers={**bearer(TOKENS[0]), "session_id": RUN}, data=orjson.dumps(
            client.body(input=[*client.items, {"type": "compaction_trigger"}], stream=False)))
        [item] = (await resp.json())["output"]
    assert item["type"] == "compaction"
    original = SessionKey(tenant_of(TOKENS[0]), RUN)
    before = await read_log(proxy.app[store_key], original)
    summary = before[-1]
    assert summary.kind == "summary"

    client.items = [item, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]}]
    client.headers = bearer(TOKENS[1])
    resp = await client.step()
    assert resp.headers[HEADER_SESSION] == RUN
    assert fake.turns()[-1].body["input"][0] == summary.message, "the upstream got the summary text"
    assert await proxy.app[store_key].link_of(SessionKey(tenant_of(TOKENS[1]), RUN)) is None, "proved: this request"
    after = await read_log(proxy.app[store_key], original)
    assert after[:len(before)] == before and after[-1].kind == "message", "the run goes on in its own log"
    assert await stored_sessions(proxy) == [original]

    token = item["encrypted_content"]
    middle = len(token) // 2
    altered = token[:middle] + ("B" if token[middle] == "A" else "A") + token[middle + 1:]
    resp = await proxy.post("/v1/responses", headers={**bearer(TOKENS[1]), "session_id": RUN}, data=orjson.dumps(
        client.body(input=[{**item, "encrypted_content": altered}])))
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "invalid_compaction_reference"


async def test_a_reference_expands_after_the_store_lost_its_entry(aiohttp_server, aiohttp_client,
                                                                 tmp_path: Path) -> None:
    """With ``--secret``, a reference carries its summary: a proxy on an empty store still expands it."""
    proxy, _ = await proxy_for(aiohttp_server, aiohttp_client, tmp_path / "first", "responses", secret=SECRET)
    client, _ = await compacted_run(proxy, "responses", TOKENS[0])
    resp = await proxy.post("/v1/responses/compact", headers={**bearer(TOKENS[0]), "session_id": RUN},
                            json={"model": "gpt-5.5", "input": conversation(client)})
    [item] = (await resp.json())["output"]
    summary = (await read_log(proxy.app[store_key], SessionKey(tenant_of(TOKENS[0]), RUN)))[-1]

    carried = [item, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]}]
    for secret in (SECRET, None):
        empty, fake = await proxy_for(aiohttp_server, aiohttp_client, tmp_path / f"empty-{secret}", "responses",
                                      secret=secret)
        assert await stored_sessions(empty) == []
        resp = await empty.post("/v1/responses", headers={**bearer(TOKENS[1]), "session_id": RUN},
                                data=orjson.dumps(Codex(empty, session=RUN).body(input=carried, stream=False)))
        if secret is None:  # the new store made a new secret: nothing it did not make opens
            assert resp.status == 400
            continue
        assert resp.status == 200, await resp.text()
        assert fake.turns()[-1].body["input"][0] == summary.message


@pytest.mark.parametrize("api", ["messages", "responses"])
async def test_another_token_without_the_conversation_gets_nothing_of_the_session(aiohttp_server, aiohttp_client,
                                                                                 tmp_path: Path, api: str) -> None:
    """The session id alone, or the session's opening steps word for word, prove nothing: the stranger gets a
    session of its own, the original's log, checkpoints and summaries stay out of its view and untouched."""
    proxy, fake = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, api)
    client, facts = await compacted_run(proxy, api, TOKENS[0])
    original = SessionKey(tenant_of(TOKENS[0]), RUN)
    secret = summaries(facts)
    history = conversation(client)
    sent = len(fake.turns())

    stranger = agent_for(api, proxy, STRANGER)
    stranger_history = conversation(stranger)
    results = [n for n, item in enumerate(history) if item.get("type") == "function_call_output" or any(
        block.get("type") == "tool_result" for block in item.get("content") or () if isinstance(block, dict))]
    assert len(results) > 6
    opening = history[:results[1] + 1]  # the first two steps, as they were: how it started, not where it is
    attempts = [opening, list(stranger_history)]  # the opening; its own run, only the session id in common
    for attempt in attempts:
        stranger_history[:] = attempt
        resp = await stranger.step()
        assert resp.headers[HEADER_SESSION] == RUN
    for body in (turn.body for turn in fake.turns()[sent:]):
        assert not any(summary in texts(body) for summary in secret), "a summary of the session"
    assert await read_log(proxy.app[store_key], original) == facts, "the session is untouched"
    assert await proxy.app[store_key].link_of(SessionKey(tenant_of(STRANGER), RUN)) is None
    assert await stored_sessions(proxy) == sorted([original, SessionKey(tenant_of(STRANGER), RUN)])
    assert [info.checkpoints async for info in proxy.app[store_key].sessions()
            if info.tenant == tenant_of(STRANGER)] == [0]

    # The stranger's session opens as the run does; the run's own refresh still finds the run, not that one.
    client.headers = bearer(TOKENS[1])
    await client.step()
    link = await proxy.app[store_key].link_of(SessionKey(tenant_of(TOKENS[1]), RUN))
    assert link is not None and link.tenant == original.tenant


# -- the rule itself (proxy.context.log.continuity) ------------------------------------------------------------------

def folded(messages: list[dict[str, Any]]) -> ConversationState:
    state = ConversationState()
    for seq, message in enumerate(messages):
        state.apply(StoredFact(str(seq), seq, "message", seq, "client", message, 0.0, CHAT.hash(message)))
    return state


def counted(item: dict[str, Any], digest: str) -> int:
    return len(str(item.get("content"))) // 4


def run_of(length: int) -> list[dict[str, Any]]:
    words = " ".join(f"word{n}" for n in range(PROOF_MIN_TOKENS))  # enough tokens in one message
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                 {"role": "user", "content": f"Fix the build. {words}"}]
    for n in range(length):
        out.append({"role": "assistant", "content": f"step {n} done"} if n % 2 == 0 else
                   {"role": "user", "content": f"go on {n}"})
    return out


def proof_of(state: ConversationState, items: list[dict[str, Any]]) -> Proof | None:
    return proof(state, CHAT, items, [CHAT.hash(i) for i in items], counted)


def test_the_whole_conversation_proves_and_a_reply_the_client_never_got_may_be_missing() -> None:
    messages = run_of(6)
    state = folded(messages)
    assert proof_of(state, [*messages, {"role": "user", "content": "next"}]) == Proof(len(messages), ())
    assert proof_of(state, messages[:-1]) == Proof(len(messages) - 1, (len(messages) - 1,))  # the last reply


def test_a_short_guessable_or_stale_history_proves_nothing() -> None:
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "thanks"}]
    assert proof_of(folded(chat), chat) is None, "a one-line conversation with a stock reply: too few tokens"
    messages = run_of(12)
    state = folded(messages)
    assert proof_of(state, messages[:2]) is None, "no assistant reply"
    assert proof_of(state, messages[:6]) is None, "how it started, not where it is"
    assert proof_of(state, [messages[0], {"role": "user", "content": "other"}, *messages[2:]]) is None
    assert proof_of(ConversationState(), messages) is None
    assert proof_of(folded(run_of(4)), run_of(4 + PROOF_MAX_NEW)) is not None
    assert proof_of(folded(run_of(4)), run_of(5 + PROOF_MAX_NEW)) is None, "a session that is only its start"
    assert holds(state, CHAT, messages[:3], [CHAT.hash(i) for i in messages[:3]])
    assert not holds(state, CHAT, messages[:2], [CHAT.hash(i) for i in messages[:2]])
