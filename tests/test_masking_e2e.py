"""Masking end to end, through each front door: batches, pairs kept, a stable prefix, no summary call needed.

An agent runs many tool steps with sizeable outputs against a fake upstream
that enforces a window and checks what its API checks (Chat: a strict chat
template; Responses: reasoning followed by its item, calls paired with outputs;
Messages: signed thinking, every ``tool_use`` answered in the next message).
Masking keeps the run under the threshold, so no summary is ever asked for;
between two reductions every view is a byte-identical prefix of the next; the
last ``--keep-tool-outputs`` outputs are always verbatim; and every placeholder
names the log entry that holds its output whole.
"""

from __future__ import annotations

import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from proxy.app import create_app
from proxy.constants import HEADER_COMPACTED
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT, MESSAGES, RESPONSES, Dialect
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import STEP, Script
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import read_log, replay, same_conversation
from tests.test_compaction_e2e import prose

WINDOW = 40_000
STEPS = 40
KEY = "sk-masking"
PLACEHOLDER = re.compile(r"^\[output of (\S+) (.*) elided: ([\d,]+) lines, ([\d,]+) tokens; log entry (\d+); "
                         r"re-run the tool if you need it again\]$")


@dataclass
class Run:
    """What an agent run sent and got: each upstream turn's items, and the proxy's compaction header per step."""

    dialect: Dialect
    views: list[list[dict[str, Any]]] = field(default_factory=list)
    compacted: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    summaries: int = 0


def output_text(step: int, rng: random.Random) -> str:
    return f"step-{step}\n" + prose(rng, 1000)


async def post(proxy: TestClient[Any, Any], path: str, body: dict[str, Any], run: Run) -> dict[str, Any]:
    resp = await proxy.post(path, data=orjson.dumps(body), headers={"Authorization": f"Bearer {KEY}",
                                                                     "x-api-key": KEY, "X-Session-Id": "masked"})
    raw = await resp.read()
    assert resp.status == 200, raw[:300]
    run.compacted.append(resp.headers[HEADER_COMPACTED])
    answer: dict[str, Any] = orjson.loads(raw)
    return answer


async def chat_run(proxy: TestClient[Any, Any], fake: FakeUpstream) -> Run:
    run = Run(CHAT)
    rng = random.Random(3)
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {}}}}]
    run.messages = [{"role": "system", "content": "You are a coding agent."},
                    {"role": "user", "content": "Make the test suite pass."}]
    for step in range(1, STEPS + 1):
        call = {"id": f"call_{step}", "type": "function",
                "function": {"name": "run", "arguments": orjson.dumps({"cmd": f"pytest -k step{step}"}).decode()}}
        fake.script.append(Reply(tool_calls=[call]))
        answer = await post(proxy, "/v1/chat/completions", {"model": "m", "messages": run.messages, "tools": tools},
                            run)
        reply = answer["choices"][0]["message"]
        run.outputs.append(output_text(step, rng))
        run.messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                                 "content": run.outputs[-1]}]
    run.views = [request["messages"] for request in fake.requests]
    run.summaries = len(fake.summary_requests)
    assert fake.role_errors == [] and fake.refused == 0
    return run


async def responses_run(proxy: TestClient[Any, Any], fake: FakeResponses) -> Run:
    run = Run(RESPONSES)
    rng = random.Random(4)
    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}]
    run.messages = [{"type": "message", "role": "developer", "content": "You are a coding agent."},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]}]
    for _ in range(STEPS):
        answer = await post(proxy, "/v1/responses", {"model": "m", "input": run.messages, "tools": tools,
                                                     "store": False}, run)
        call = answer["output"][-1]
        step = int(STEP.search(call["arguments"]).group(1))  # type: ignore[union-attr]
        run.outputs.append(output_text(step, rng))
        run.messages += [*answer["output"], {"type": "function_call_output", "call_id": call["call_id"],
                                             "output": run.outputs[-1]}]
    run.views = [r.body["input"] for r in fake.turns()]
    run.summaries = len([r for r in fake.requests if r.kind == "summary"])
    assert [r.status for r in fake.turns()] == [200] * STEPS, "no refusal, no history the API rejects"
    return run


async def messages_run(proxy: TestClient[Any, Any], fake: FakeMessages) -> Run:
    run = Run(MESSAGES)
    rng = random.Random(5)
    tools = [{"name": "Bash", "input_schema": {"type": "object", "properties": {}}}]
    run.messages = [{"role": "user", "content": [{"type": "text", "text": "Make the test suite pass."}]}]
    for _ in range(STEPS):
        answer = await post(proxy, "/v1/messages", {"model": "m", "max_tokens": 1024, "system": "You code.",
                                                    "messages": run.messages, "tools": tools}, run)
        use = answer["content"][-1]
        step = int(STEP.search(use["input"]["command"]).group(1))  # type: ignore[union-attr]
        run.outputs.append(output_text(step, rng))
        run.messages += [{"role": "assistant", "content": answer["content"]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                       "content": run.outputs[-1]}]}]
    run.views = [r.body["messages"] for r in fake.turns()]
    run.summaries = len([r for r in fake.requests if r.kind == "summary"])
    assert [r.status for r in fake.turns()] == [200] * STEPS, "no refusal, no history the API rejects"
    return run


Driver = Callable[[TestClient[Any, Any], Any], Awaitable[Run]]
FAKES: dict[str, tuple[Callable[[], Any], Driver]] = {
    "chat": (FakeUpstream, chat_run),
    "responses": (lambda: FakeResponses(Script(steps=STEPS + 5), window=WINDOW), responses_run),
    "messages": (lambda: FakeMessages(Script(steps=STEPS + 5), window=WINDOW), messages_run),
}


def outputs_of(dialect: Dialect, view: list[dict[str, Any]]) -> list[str]:
    """The text of every tool output in a view, in order."""
    texts = []
    for item in view:
        for path in dialect.result_paths(item):
            value: Any = item
            for step in path:
                value = value[step]
            texts.append(value if isinstance(value, str) else "\n".join(p["text"] for p in value))
    return texts


@pytest.mark.parametrize("api", list(FAKES))
async def test_masking_keeps_a_long_run_under_the_window_in_batches_with_a_stable_prefix(
        aiohttp_server: Any, aiohttp_client: Any, store_url: str, api: str) -> None:
    make_fake, drive = FAKES[api]
    fake = make_fake()
    if api == "chat":
        fake.window, fake.strict_roles = WINDOW, True
    upstream = await aiohttp_server(fake.app())
    root = str(upstream.make_url("")).rstrip("/")
    proxy = await aiohttp_client(create_app(Settings(upstream=root + "/v1", anthropic_upstream=root,
                                                     store=store_url, context_window=WINDOW,
                                                     keep_tool_output_share=1.0)))  # ten kept, by count
    run = await drive(proxy, fake)

    counter = TokenCounter()
    assert sum(counter.message_tokens(run.dialect, m) for m in run.messages) > WINDOW, "unmasked, it would not fit"
    assert run.summaries == 0, "masking alone kept the run under the threshold: no summary call"
    reductions = [i for i, header in enumerate(run.compacted) if header != "none"]
    # Mid-burst a batch waits for the trigger (proxy.context.view.worth): in this run it comes once.
    assert 1 <= len(reductions) <= STEPS // 5, f"masking moves in batches: {reductions}"
    for i in range(1, len(run.views)):
        if run.compacted[i] == "none":
            assert run.views[i][: len(run.views[i - 1])] == run.views[i - 1], f"step {i} rewrote its prefix"
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "masked"))
    by_seq = {f.seq: f for f in facts}
    for view, sent in zip(run.views, range(STEPS), strict=True):
        shown = outputs_of(run.dialect, view)
        assert shown[-10:] == run.outputs[:sent][-10:], "the last 10 outputs are always verbatim"
        for text in shown[:-10]:
            match = PLACEHOLDER.match(text)
            if match is None:
                assert text in run.outputs
                continue
            entry = by_seq[int(match.group(5))]
            assert entry.kind == "message"
            original = outputs_of(run.dialect, [dict(entry.message or {})])
            assert original and original[0] in run.outputs, "the placeholder names the entry holding it whole"
            assert int(match.group(3)) == original[0].count("\n") + 1
    assert {f.kind for f in facts} == {"message", "checkpoint"}, "masking logs checkpoints, no summary entries"
    assert same_conversation(replay(facts), run.messages[:-1])
