"""The providers' own context management, through the proxy, against fakes that implement it.

Anthropic's ``context_management`` edits (``compact_20260112``,
``clear_tool_uses_20250919``, ``clear_thinking_20251015``) and the Responses
API's ``context_management`` compaction and ``truncation: "auto"``
(tests/fakemessages.py, tests/fakeresponses.py): the fields and the betas reach
the upstream unchanged; a request that asks the upstream to compact or clear
goes as the client sent it (logged all the same, rescued if still refused); the
``compaction`` blocks and items the upstream returns are logged, come back
byte-identical and are never split from what follows them; ``applied_edits``
and ``usage.iterations`` reach the client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.constants import HEADER_COMPACTED
from proxy.context.items import cut_points
from proxy.dialects import MESSAGES, RESPONSES
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from proxy.summarycall import ClientRequest, summary_request
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script, parse_sse
from tests.fakeupstream import SUMMARY_MARKER
from tests.proxyfixtures import read_log, replay
from tests.scripted import KEY, Claude, Codex, rig

BETAS = "claude-code-20250219,context-management-2025-06-27,compact-2026-01-12,interleaved-thinking-2025-05-14"
THINKING = {"type": "adaptive"}
CLEAR_THINKING = {"type": "clear_thinking_20251015", "keep": "all"}
#: Each edit over a trigger the scripted run passes within a few steps (the fakes count as the proxy does).
COMPACT = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 1500}}
CLEAR_TOOL_USES = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 1500},
                   "keep": {"type": "tool_uses", "value": 2}}
RESPONSES_COMPACTION = [{"type": "compaction", "compact_threshold": 1500}]


def claude(proxy: Any, session: str = "claude-run") -> Claude:
    return Claude(proxy, session=session, headers={"anthropic-beta": BETAS})


async def logged(proxy: Any, session: str) -> list[Any]:
    facts = await read_log(proxy.server.app[store_key], SessionKey(tenant_of(KEY), session))
    return [f for f in facts if f.kind == "message"]


# -- what reaches the upstream ----------------------------------------------------------------------

async def test_clear_thinking_alone_is_compacted_by_the_proxy_its_fields_and_betas_unchanged(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """Claude Code's every request: ``clear_thinking`` asks the upstream to compact nothing, so the proxy does;
    ``context_management`` and ``anthropic-beta`` reach the upstream as the client sent them all the same."""
    fake = FakeMessages(Script(steps=20))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=3000)
    client = claude(proxy)
    management = {"edits": [CLEAR_THINKING]}
    compacted = [(await client.step(context_management=management, thinking=THINKING)).headers[HEADER_COMPACTED]
                 for _ in range(8)]
    assert "proactive" in compacted
    turns = fake.turns()
    assert len(turns) == 8 and all(t.status == 200 for t in turns)
    assert any(len(t.body["messages"]) < len(client.messages) - 1 for t in turns)  # a view, not the history
    assert all(t.body["context_management"] == management and t.headers["anthropic-beta"] == BETAS for t in turns)


@pytest.mark.parametrize("edit", [COMPACT, CLEAR_TOOL_USES], ids=["compact", "clear_tool_uses"])
async def test_a_messages_request_asking_the_upstream_to_compact_or_clear_goes_as_sent(
        aiohttp_server, aiohttp_client, tmp_path: Path, edit: dict[str, Any]) -> None:
    """Under a window the proxy would compact in, the upstream gets the client's conversation, byte for byte,
    and manages it itself; every message is logged."""
    fake = FakeMessages(Script(steps=12))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=3000)
    client = claude(proxy)
    management = {"edits": [CLEAR_THINKING, edit]}
    sent, headers = [], []
    for _ in range(13):
        body = client.body(context_management=management, thinking=THINKING)
        sent.append(orjson.loads(orjson.dumps(body)))
        headers.append((await client.step(context_management=management, thinking=THINKING)).headers)
    assert client.messages[-1]["content"][-1] == {"type": "text", "text": "All 12 steps done."}
    assert {h[HEADER_COMPACTED] for h in headers} == {"none"}
    turns = fake.turns()
    assert [t.body for t in turns] == sent and not [r for r in fake.requests if r.kind == "summary"]
    assert all(t.headers["anthropic-beta"] == BETAS for t in turns)
    whole = sum(fake.prompt_counts(turns[-1].body)[1])
    assert whole > 3000 and (turns[-1].tokens or whole) < whole  # the upstream made it smaller, not the proxy
    assert [m.message for m in await logged(proxy, client.session)] == client.messages


@pytest.mark.parametrize("field", [{"context_management": RESPONSES_COMPACTION}, {"truncation": "auto"}],
                         ids=["compaction", "truncation"])
async def test_a_responses_request_asking_the_upstream_to_compact_or_truncate_goes_as_sent(
        aiohttp_server, aiohttp_client, tmp_path: Path, field: dict[str, Any]) -> None:
    fake = FakeResponses(Script(steps=12), window=3000)
    # Under the upstream's: the proxy would compact long before the upstream compacts or truncates.
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=1500)
    codex = Codex(proxy)
    sent, compacted = [], []
    for _ in range(13):
        sent.append(orjson.loads(orjson.dumps(codex.body(**field))))
        compacted.append((await codex.step(**field)).headers[HEADER_COMPACTED])
    assert codex.items[-1]["content"][0]["text"] == "All 12 steps done."
    assert set(compacted) == {"none"}
    turns = fake.turns()
    assert [t.body for t in turns] == sent and not [r for r in fake.requests if r.kind == "summary"]
    if "truncation" in field:
        assert fake.truncated > 0
    else:
        assert any(item["type"] == "compaction" for item in codex.items)
    assert [m.message for m in await logged(proxy, codex.session)] == codex.items


async def test_a_request_the_upstream_still_refuses_is_rescued_with_its_context_management(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """An upstream whose own compaction does not trigger before its window refuses: the proxy compacts
    reactively and retries, the client's ``context_management`` kept."""
    fake = FakeMessages(Script(steps=20), window=2500)
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=200_000)
    client = claude(proxy)
    late = {"edits": [CLEAR_THINKING, {**COMPACT, "trigger": {"type": "input_tokens", "value": 100_000}}]}
    compacted = [(await client.step(context_management=late, thinking=THINKING)).headers[HEADER_COMPACTED]
                 for _ in range(12)]
    assert "reactive" in compacted and "proactive" not in compacted
    refused = [t for t in fake.turns() if t.status == 400]
    retried = [t for t in fake.turns() if t.status == 200 and len(t.body["messages"]) < len(client.messages) - 1]
    assert refused and retried and all(t.body["context_management"] == late for t in retried)
    summaries = [r for r in fake.requests if r.kind == "summary"]
    assert summaries and all(r.body["context_management"] == {"edits": [CLEAR_THINKING]} for r in summaries)


@pytest.mark.parametrize(("dialect", "payload", "kept"), [
    (MESSAGES, {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "go"}],
                "context_management": {"edits": [CLEAR_THINKING, COMPACT, CLEAR_TOOL_USES]}, "thinking": THINKING},
     {"edits": [CLEAR_THINKING]}),
    (MESSAGES, {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "go"}],
                "context_management": {"edits": [CLEAR_THINKING]}, "thinking": THINKING}, {"edits": [CLEAR_THINKING]}),
    (RESPONSES, {"model": "m", "input": "go", "truncation": "auto",
                 "context_management": [*RESPONSES_COMPACTION, {"type": "other"}]}, [{"type": "other"}]),
], ids=["messages-compacting", "messages-clear-thinking", "responses"])
def test_a_summary_call_is_never_compacted_or_cleared_by_the_upstream(dialect: Any, payload: dict[str, Any],
                                                                       kept: Any) -> None:
    """The transcript is what the summary is made of: the edits that compact or clear it are left out."""
    request = ClientRequest(dialect.parse(orjson.dumps(payload)))
    body = summary_request(dialect, request, "m", SUMMARY_MARKER + " PROMPT", 1_000)
    assert body["context_management"] == kept
    assert body.get("truncation") == payload.get("truncation")


async def test_count_tokens_counts_a_request_the_upstream_compacts_as_sent(aiohttp_server, aiohttp_client,
                                                                          tmp_path: Path) -> None:
    fake = FakeMessages(Script(steps=20))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=3000)
    client = claude(proxy)
    for _ in range(8):  # the proxy compacts this session: it has a checkpoint
        await client.step()
    assert [r for r in fake.requests if r.kind == "summary"]
    body = {k: v for k, v in client.body(context_management={"edits": [COMPACT]}).items()
            if k not in ("stream", "max_tokens")}
    resp = await proxy.post("/v1/messages/count_tokens?beta=true", data=orjson.dumps(body),
                            headers=client.request_headers())
    assert resp.status == 200, await resp.text()
    counted = [r for r in fake.requests if r.kind == "count_tokens"][-1]
    assert counted.body == body


# -- what the upstream returns ------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_compaction_block_is_logged_and_comes_back_byte_identical(
        aiohttp_server, aiohttp_client, tmp_path: Path, stream: bool) -> None:
    """The block the upstream returned is logged whole (streamed: from its ``compaction_delta``), and after the
    proxy compacts (the client no longer asks the upstream to) the kept tail carries it as it was."""
    fake = FakeMessages(Script(steps=20))
    # A window the proxy's estimate (text only, no signatures) passes one step after the upstream compacted.
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=1200,
                      keep_tool_output_share=1.0)  # the summary path: its tail is what keeps the block
    client = claude(proxy)
    management = {"edits": [CLEAR_THINKING, COMPACT]}
    while not any(b["type"] == "compaction" for m in client.messages for b in m["content"] if isinstance(b, dict)):
        await client.step(context_management=management, thinking=THINKING, stream=stream)
    holder = client.messages[-2]
    block = holder["content"][0]
    assert block["type"] == "compaction" and "Ran steps 1 to" in block["content"]
    assert [m.message for m in await logged(proxy, client.session) if m.source == "upstream"][-1] == holder
    follower = client.messages[-1]
    # Claude Code's own requests again: the proxy compacts, and keeps the last step (the block's) verbatim; the
    # fake refuses a compaction block it did not issue, byte for byte.
    resp = await client.step(context_management={"edits": [CLEAR_THINKING]}, thinking=THINKING, stream=stream)
    view = fake.turns()[-1].body["messages"]
    assert resp.headers[HEADER_COMPACTED] == "proactive" and len(view) < len(client.messages) - 2
    assert view[view.index(holder) + 1] == follower


async def test_a_paused_compaction_is_logged_as_a_finished_reply_and_the_run_goes_on(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """``pause_after_compaction``: a streamed answer holding only the block, ``stop_reason: "compaction"``; the
    log has the block whole and the reply as finished, and the client's next request (the block last) continues."""
    fake = FakeMessages(Script(steps=12))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=200_000)
    client = claude(proxy)
    management = {"edits": [CLEAR_THINKING, {**COMPACT, "pause_after_compaction": True}]}
    stops = []
    while "All 12 steps done." not in str(client.messages[-1]["content"]):
        raw = await (await client.step(context_management=management, thinking=THINKING)).read()
        stops.append([e for e in parse_sse(raw) if e["type"] == "message_delta"][-1]["delta"]["stop_reason"])
    assert "compaction" in stops and all(t.status == 200 for t in fake.turns())
    paused = [m for m in client.messages if m["role"] == "assistant" and m["content"][0]["type"] == "compaction"]
    assert paused and all(len(m["content"]) == 1 and m["content"][0]["content"] for m in paused)
    facts = await logged(proxy, client.session)
    replies = [f for f in facts if f.source == "upstream" and f.message in paused]
    assert len(replies) == len(paused) and not any(f.to_json().get("partial") for f in replies)
    assert [f.message for f in facts] == client.messages  # each once: the client's echo matched the reply logged


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_applied_edits_and_iterations_reach_the_client_and_the_log(
        aiohttp_server, aiohttp_client, tmp_path: Path, stream: bool) -> None:
    fake = FakeMessages(Script(steps=20))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=200_000)
    client = claude(proxy)
    management = {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
                            COMPACT]}
    answers = []
    for _ in range(10):
        resp = await client.step(context_management=management, thinking=THINKING, stream=stream)
        raw = await resp.read()
        if stream:
            final = [e for e in parse_sse(raw) if e["type"] == "message_delta"][-1]
            answers.append((final["context_management"], final["usage"]))
        else:
            answer = orjson.loads(raw)
            answers.append((answer["context_management"], answer["usage"]))
        if "iterations" in answers[-1][1]:
            break
    usage = answers[-1][1]
    assert [i["type"] for i in usage["iterations"]] == ["compaction", "message"]
    applied = [edit for m, _ in answers for edit in m["applied_edits"]]
    assert applied and {e["type"] for e in applied} == {"clear_thinking_20251015"}
    assert all(e["cleared_thinking_turns"] > 0 and e["cleared_input_tokens"] > 0 for e in applied)
    replies = [m for m in await logged(proxy, client.session) if m.source == "upstream"]
    assert replies[-1].to_json()["usage"]["iterations"] == usage["iterations"]


async def test_a_responses_compaction_item_is_logged_streamed_and_sent_back_as_it_was(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    fake = FakeResponses(Script(steps=20))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=3000)
    codex = Codex(proxy)
    while not any(item["type"] == "compaction" for item in codex.items):
        await codex.step(context_management=RESPONSES_COMPACTION)
    item = next(i for i in codex.items if i["type"] == "compaction")
    assert item in [m.message for m in await logged(proxy, codex.session) if m.source == "upstream"]
    await codex.step()  # the proxy compacts now: the item goes with what follows it, as it was
    turn = fake.turns()[-1]
    assert turn.status == 200 and len(turn.body["input"]) < len(codex.items)
    at = turn.body["input"].index(item)
    assert turn.body["input"][at + 1] == codex.items[codex.items.index(item) + 1]


async def test_a_client_that_drops_what_a_compaction_item_replaced_loses_nothing_from_the_log(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """OpenAI's advice: after a compaction item, drop the items before it. The request goes as sent (the item
    first), the log keeps the whole conversation and continues it on a new lineage."""
    fake = FakeResponses(Script(steps=20))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=1500)
    codex = Codex(proxy)
    while not any(item["type"] == "compaction" for item in codex.items):
        await codex.step(context_management=RESPONSES_COMPACTION)
    before = list(codex.items)
    codex.items = codex.items[next(i for i, item in enumerate(before) if item["type"] == "compaction"):]
    sent = list(codex.items)
    resp = await codex.step(context_management=RESPONSES_COMPACTION)
    assert resp.headers[HEADER_COMPACTED] == "none"
    assert fake.turns()[-1].body["input"] == sent and fake.turns()[-1].status == 200
    facts = await read_log(proxy.server.app[store_key], SessionKey(tenant_of(KEY), codex.session))
    messages = [f.message for f in facts if f.kind == "message"]
    # The old lineage as it was (its last output reached the proxy only with the new lineage), then one rewind.
    assert messages[:len(before) - 1] == before[:-1] and before[-1] in messages
    assert [f.kind for f in facts].count("rewind") == 1 and replay(facts) == sent + codex.items[len(sent):-1]


# -- the engine's item rules ---------------------------------------------------------------------------

def test_a_compaction_is_never_split_from_what_follows_it() -> None:
    """No cut right after a compaction: the item (or the message holding the block) stays with the next one."""
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": [{"type": "compaction", "content": "Summary."}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Going on."}]},
                {"role": "user", "content": "next"}]
    assert cut_points(MESSAGES, messages) == [0, 1, 3]
    assert MESSAGES.text(messages[1]) == ("Summary.", 0)
    items = [{"type": "message", "role": "user", "content": "go"},
             {"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "On."}]},
             {"type": "message", "role": "user", "content": "next"}]
    assert cut_points(RESPONSES, items) == [0, 1, 3]


@pytest.mark.parametrize(("dialect", "payload", "manages"), [
    (MESSAGES, {"context_management": {"edits": [CLEAR_THINKING]}}, False),
    (MESSAGES, {"context_management": {"edits": [CLEAR_THINKING, COMPACT]}}, True),
    (MESSAGES, {"context_management": {"edits": [CLEAR_TOOL_USES]}}, True),
    (MESSAGES, {"context_management": {"edits": "compact_20260112"}}, False),
    (RESPONSES, {"context_management": RESPONSES_COMPACTION}, True),
    (RESPONSES, {"truncation": "auto"}, True),
    (RESPONSES, {"truncation": "disabled", "context_management": []}, False),
], ids=["clear_thinking", "compact", "clear_tool_uses", "malformed", "compaction", "truncation", "neither"])
def test_which_requests_ask_the_upstream_to_manage_their_context(dialect: Any, payload: dict[str, Any],
                                                                 manages: bool) -> None:
    assert dialect.upstream_manages(payload) is manages
