"""The real Codex CLI and the real Claude Code through the proxy, against fake upstreams with small windows.

Each agent runs 25 tool steps with its own auto-compaction off (tests/agents.py),
through a recording tap (tests/tap.py: the witness of what the agent sent and
received) in front of the proxy (a real listening server over a SQLite file),
to its fake upstream (tests/fakeresponses.py, tests/fakemessages.py), whose
window the whole run does not fit: straight at the fake, the same run stops
with the agent's own context error (tests/test_agents_direct.py). Through the
proxy it must complete, the proxy compacting on the way; every turn the fake
accepted fits its window, and a refusal is only ever seen by the proxy, which
retries the same request smaller; the session's log replays to the agent's last
request plus the reply it got; and the kept tail of the last upstream request is
byte-identical to what the agent sent, encrypted reasoning and thinking
signatures included.

Windows (sizes from docs/CLIENTS.md, counted as the fakes count them): Codex's
first request is about 8,000 tokens and each step adds about 280, 15,000 for 25
steps; Claude Code's is about 3,000 plus 260 a step, 9,700 for 25 steps. The
windows, 12,000 and 7,000, hold the head (tools, instructions, system prompt)
with room to spare but stop a direct run around step 15, so the proxy has to
compact at least once, and its threshold (0.8 of the window) is crossed
around steps 6 and 10.

Each run is repeated for every shape in which its API refuses a prompt as too
long (Responses: HTTP 400, an early ``error`` event, ``response.failed``;
Messages: HTTP 400, an ``error`` event), with the proxy told a window four times
the fake's: it then learns of the real window only from the upstream's refusals,
each of which it must rescue (compact harder, retry) before the agent sees it.
The Anthropic refusal states the window ("… > M maximum"): learned from the
first refusal, the proxy compacts ahead of any other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from proxy.app import create_app
from proxy.constants import HEADER_COMPACTED, HEADER_SESSION, HEADER_VIEW_TOKENS
from proxy.context.checkpoint import Checkpoint
from proxy.keys import store_key
from proxy.sessions import credential, tenant_of
from proxy.settings import Settings
from proxy.store.base import FactLog, SessionKey, StoredFact
from tests.agents import AgentRun, codex_outputs, run_claude, run_codex, without_cache_control
from tests.fakegemini import FakeGemini
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Recorded, Script, final_text, is_summary_prompt, parse_sse
from tests.proxyfixtures import read_log, replay
from tests.scripted import blocks_of
from tests.tap import Exchange, Tap

STEPS = 25
PROMPT = "Run the scripted shell steps one at a time, then say that you are done."
CODEX_WINDOW = 12_000
CLAUDE_WINDOW = 7_000
COMPACTED = {"none", "proactive", "reactive", "background"}
#: "known": the proxy is told the fake's window; otherwise the fake's refusal shape, the proxy told 4 times the window.
CODEX_SHAPES = ["known", "http", "event", "failed"]
CLAUDE_SHAPES = ["known", "http", "event"]


@dataclass
class Rig:
    """The tap in front of the proxy in front of one fake upstream, and the proxy's store."""

    tap: Tap
    url: str
    store: FactLog
    #: The proxy itself (its ``/metrics``).
    proxy: str


async def rig(aiohttp_server: Any, tmp_path: Path, fake: FakeResponses | FakeMessages | FakeGemini, window: int,
              shape: str) -> Rig:
    """Both upstream settings point at the one fake, so a request sent to the wrong API shows as a 404 there.

    Unless ``shape`` is "known", the proxy believes the window is four times what the fake enforces.
    """
    upstream: TestServer = await aiohttp_server(fake.app())
    root = str(upstream.make_url("")).rstrip("/")
    settings = Settings(upstream=root + "/v1", anthropic_upstream=root, gemini_upstream=root,
                        store=f"sqlite:///{tmp_path}/facts.db",
                        context_window=window if shape == "known" else 4 * window)
    proxy: TestServer = await aiohttp_server(create_app(settings))
    tap = Tap(str(proxy.make_url("")).rstrip("/"))
    front: TestServer = await aiohttp_server(tap.app())
    return Rig(tap, str(front.make_url("")).rstrip("/"), proxy.app[store_key], str(proxy.make_url("")).rstrip("/"))


def served(turns: Sequence[Recorded], sent: Sequence[Exchange], window: int, items: str,
           shape: str) -> tuple[list[Recorded], int]:
    """The fake's turns, one group per agent request: refusals the proxy retried, then the one the fake accepted.

    Checks that every accepted turn fits the window, that a refusal was over it,
    came in ``shape`` (a 400, or a 200 stream carrying the error) and was retried
    with the same newest item and fewer tokens, and that the agent was told
    ``reactive`` for each request that needed a retry. Returns the accepted turns
    and the number of refusals.
    """
    groups: list[list[Recorded]] = [[]]
    for turn in turns:
        groups[-1].append(turn)
        if turn.tokens is not None and turn.tokens <= window:
            groups.append([])
    assert groups.pop() == [], "the last turn the fake received was refused"
    assert len(groups) == len(sent), "one accepted upstream turn per agent request"
    refusals = 0
    for group, exchange in zip(groups, sent, strict=True):
        *refused, accepted = group
        assert accepted.status == 200
        for before, after in zip(refused, group[1:], strict=True):
            assert before.status == (400 if shape == "http" else 200)
            assert after.tokens is not None and before.tokens is not None and after.tokens < before.tokens
            assert after.body[items][-1] == before.body[items][-1]
        if refused:
            assert exchange.response_headers[HEADER_COMPACTED] == "reactive"
        refusals += len(refused)
    assert (refusals == 0) == (shape == "known"), "the upstream refused only when the proxy was not told its window"
    return [group[-1] for group in groups], refusals


def check_headers(sent: Sequence[Exchange], session: str) -> None:
    """Every answer was a 200 naming the session (the compactions themselves may all have run in the background:
    the log says they happened, ``check_log``)."""
    assert [x.status for x in sent] == [200] * len(sent)
    assert {x.response_headers[HEADER_SESSION] for x in sent} == {session}
    compacted = [x.response_headers[HEADER_COMPACTED] for x in sent]
    assert set(compacted) <= COMPACTED, compacted
    assert all(int(x.response_headers[HEADER_VIEW_TOKENS]) > 0 for x in sent)


async def session_log(store: FactLog, headers: CIMultiDict[str], session: str) -> list[StoredFact]:
    """The run's log: the store holds that one session and nothing else."""
    key = SessionKey(tenant_of(credential(headers)), session)
    assert [(s.tenant, s.session) async for s in store.sessions()] == [key]
    return await read_log(store, key)


def kept_tail(facts: Sequence[StoredFact], sent: Sequence[Any]) -> list[Any]:
    """What the checkpoint in force for the last request keeps verbatim: ``sent`` from its retained start or, when
    its masking reaches past that, from the end of the masked region.

    The checkpoint in force is the one the final reply's entry names (``view.key``): not always the newest logged,
    since a summary made in the background waits for a cold moment or the trigger (issue 34).
    """
    reply = min((f for f in facts if f.kind == "message" and f.index is not None and f.index >= len(sent)),
                key=lambda f: f.seq)
    key = reply.to_json()["view"]["key"]
    checkpoints = [Checkpoint.from_json(f.to_json()["checkpoint"]) for f in facts
                   if f.kind == "checkpoint" and f.seq < reply.seq]
    start = next(c for c in reversed(checkpoints) if c.view_key == key).covers
    assert 0 < start < len(sent)
    return list(sent[start:])


def check_tail(upstream: Sequence[Any], tail: Sequence[Any]) -> None:
    """The upstream request ends with ``tail``, item for item the same bytes (keys in the same order)."""
    assert len(tail) < len(upstream)
    assert [orjson.dumps(i) for i in upstream[-len(tail):]] == [orjson.dumps(i) for i in tail]


def check_log(facts: Sequence[StoredFact], dialect: str, sent: list[Any], reply: list[Any],
              meaning: Callable[[Any], Any]) -> None:
    """Messages name their API; the proxy compacted; the log replays to the agent's last request plus its reply."""
    assert any(f.kind == "checkpoint" for f in facts), "the proxy compacted on the way"
    assert {f.to_json().get("dialect") for f in facts if f.kind == "message"} == {dialect}
    assert [meaning(i) for i in replay(list(facts))] == [meaning(i) for i in sent + reply]


def check_summaries(requests: Sequence[Recorded], path: str, prompt_field: str, items_field: str) -> None:
    """Summaries were asked for in the request's own API, as the agent's own request (its ``prompt_field`` kept,
    the summariser's prompt in the last item); nothing else reached the fake but turns."""
    summaries = [r for r in requests if r.kind == "summary"]
    assert summaries
    prompts = {orjson.dumps(r.body.get(prompt_field)) for r in requests if r.kind == "turn"}
    assert {(r.path, orjson.dumps(r.body.get(prompt_field)) in prompts,
             is_summary_prompt(r.body[items_field][-1]["content"])) for r in summaries} == {(path, True, True)}
    assert {r.kind for r in requests} == {"turn", "summary"}


# -- Codex ---------------------------------------------------------------------------------------


def responses_reply(raw: bytes) -> list[Any]:
    """The items a streamed Responses answer added: each ``response.output_item.done`` item, in order."""
    return [e["item"] for e in parse_sse(raw) if e["type"] == "response.output_item.done"]


def as_echoed(item: Any) -> Any:
    """A Responses item as Codex sends it back: it adds ``"content": null`` to reasoning items."""
    return {k: v for k, v in item.items() if v is not None}


@pytest.mark.parametrize("shape", CODEX_SHAPES)
async def test_codex_runs_twenty_five_steps_through_the_proxy_in_a_window_that_does_not_hold_them(
        aiohttp_server, tmp_path: Path, shape: str) -> None:
    fake = FakeResponses(Script(steps=STEPS), window=CODEX_WINDOW, overflow="http" if shape == "known" else shape)
    parts = await rig(aiohttp_server, tmp_path, fake, CODEX_WINDOW, shape)
    run: AgentRun = await run_codex(parts.url + "/v1", tmp_path, PROMPT)

    assert (run.returncode, run.errors) == (0, []), run.stderr
    assert run.final_text == final_text(STEPS)
    assert codex_outputs(run) == [f"step-{k}\n" for k in range(1, STEPS + 1)]
    assert "ran out of room" not in run.stdout  # Codex's context error

    sent = parts.tap.exchanges
    assert [(x.method, x.path_qs) for x in sent] == [("POST", "/v1/responses")] * (STEPS + 1)
    session = sent[0].headers["session-id"]
    check_headers(sent, session)
    accepted, _ = served(fake.turns(), sent, CODEX_WINDOW, "input", shape)
    check_summaries(fake.requests, "/v1/responses", "instructions", "input")

    facts = await session_log(parts.store, sent[0].headers, session)
    last, upstream = sent[-1].json(), accepted[-1].body
    check_log(facts, "responses", last["input"], responses_reply(sent[-1].response), as_echoed)
    tail = kept_tail(facts, last["input"])
    check_tail(upstream["input"], tail)
    assert any(i["type"] == "reasoning" and i["encrypted_content"] for i in tail)
    assert {k: v for k, v in upstream.items() if k != "input"} == {k: v for k, v in last.items() if k != "input"}


# -- Claude Code ---------------------------------------------------------------------------------


def messages_reply(raw: bytes) -> list[Any]:
    """The assistant message a streamed Messages answer adds, assembled from its content-block events."""
    return [{"role": "assistant", "content": blocks_of(raw)}]


@pytest.mark.parametrize("shape", CLAUDE_SHAPES)
async def test_claude_runs_twenty_five_steps_through_the_proxy_in_a_window_that_does_not_hold_them(
        aiohttp_server, tmp_path: Path, shape: str) -> None:
    fake = FakeMessages(Script(steps=STEPS), window=CLAUDE_WINDOW, overflow="http" if shape == "known" else shape)
    parts = await rig(aiohttp_server, tmp_path, fake, CLAUDE_WINDOW, shape)
    run: AgentRun = await run_claude(parts.url, tmp_path, PROMPT, max_turns=STEPS + 5)

    assert (run.returncode, run.errors) == (0, []), run.stderr
    assert run.final_text == final_text(STEPS)
    assert run.events[-1]["num_turns"] == STEPS + 1
    assert "prompt is too long" not in run.stdout.lower()

    sent = parts.tap.exchanges
    assert [(x.method, x.path_qs) for x in sent] == [("POST", "/v1/messages?beta=true")] * (STEPS + 1)
    session = sent[0].headers["X-Claude-Code-Session-Id"]
    check_headers(sent, session)
    accepted, refusals = served(fake.turns(), sent, CLAUDE_WINDOW, "messages", shape)
    compacted = [x.response_headers[HEADER_COMPACTED] for x in sent]
    if shape != "known":  # the refusal states the window: learned from the first, the proxy compacts ahead of it
        assert refusals == 1 and compacted.count("reactive") == 1
    check_summaries(fake.requests, "/v1/messages", "system", "messages")

    facts = await session_log(parts.store, sent[0].headers, session)
    last, upstream = sent[-1].json(), accepted[-1].body
    check_log(facts, "messages", last["messages"], messages_reply(sent[-1].response), without_cache_control)
    tail = kept_tail(facts, last["messages"])
    check_tail(upstream["messages"], tail)
    assert any(b["type"] == "thinking" and b["signature"] for m in tail if m["role"] == "assistant"
               for b in m["content"])
    assert {k: v for k, v in upstream.items() if k != "messages"} == {
        k: v for k, v in last.items() if k != "messages"}
    upstream_headers = CIMultiDict(accepted[-1].headers)
    for name in ("anthropic-version", "anthropic-beta", "x-app", "User-Agent", "X-Claude-Code-Session-Id"):
        assert upstream_headers[name] == sent[-1].headers[name], name


# -- long steps --------------------------------------------------------------------------------------------------


def long_step(step: int) -> str:
    """A step whose output is a few hundred tokens (``seq`` prints 150 lines), so 30 of them outgrow 16k."""
    return f"seq 1000 1150 && echo step-{step}"
