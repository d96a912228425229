"""Proactive compaction end to end: a fake upstream that enforces a 16k window and writes summaries."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import MASKING_OFF, assistant_from_sse, read_log, replay, same_conversation

WINDOW = 16_000
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
WORDS = (
    "alpha", "beta", "gamma", "delta", "parser", "module", "config", "request", "handler", "buffer", "cache",
    "retry", "socket", "token", "stream", "vector", "index", "commit", "branch", "merge", "build", "test",
    "fixture", "assert",
)
HEADERS = {"Authorization": "Bearer sk-e2e"}


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def send(proxy: Any, messages: list[dict[str, Any]], session: str, stream: bool) -> tuple[Any, dict]:
    body = {"model": "gpt-4o", "messages": messages, "tools": TOOLS, "stream": stream}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body), headers={**HEADERS,
                                                                                       "X-Session-Id": session})
    raw = await resp.read()
    assert resp.status == 200, raw[:500]
    if not stream:
        return resp, orjson.loads(raw)["choices"][0]["message"]
    return resp, assistant_from_sse(raw)


def tool_call(n: int) -> Reply:
    return Reply(tool_calls=[{"id": f"call_{n}", "type": "function",
                              "function": {"name": "read_file", "arguments": orjson.dumps({"n": n}).decode()}}])


async def check_log(proxy: Any, session: str, messages: list[dict[str, Any]]) -> None:
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of("sk-e2e"), session))
    assert [f.seq for f in facts] == list(range(len(facts)))
    assert same_conversation(replay(facts), messages)
    kinds = {f.kind for f in facts}
    assert {"summary", "checkpoint"} <= kinds


async def test_one_round_of_sixty_tool_steps_stays_inside_the_window(make_proxy, fake: FakeUpstream) -> None:
    # The summary path: masking off, since with honest usage ten kept outputs of 450 words (about 4,600 tokens)
    # plus masked stubs never reach the threshold.
    proxy = await make_proxy(context_window=WINDOW, **MASKING_OFF)
    fake.window = WINDOW
    rng = random.Random(7)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Refactor the parser module."}]
    for step in range(60):
        fake.script.append(tool_call(step))
        _, reply = await send(proxy, messages, "tools60", stream=step % 3 == 0)
        messages.append(reply)
        fact = " The secret build flag is FACT-Zebra42." if step == 0 else ""
        messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                         "content": prose(rng, 450) + fact})
    fake.script.append(Reply(content="All done."))
    _, final = await send(proxy, messages, "tools60", stream=False)
    messages.append(final)

    assert fake.refused == 0 and max(fake.prompt_tokens) <= WINDOW
    assert fake.summary_requests, "a summary was written"
    last_view = orjson.dumps(fake.requests[-1]["messages"]).decode()
    assert "FACT-Zebra42" in last_view
    assert fake.requests[-1]["messages"][0] == messages[0]
    assert fake.requests[-1]["messages"][1]["content"].endswith("\n\nRefactor the parser module."), "led by the summary"
    await check_log(proxy, "tools60", messages)


async def test_thirty_short_rounds_stay_inside_the_window(make_proxy, fake: FakeUpstream) -> None:
    proxy = await make_proxy(context_window=WINDOW, keep_tool_output_share=1.0)  # the summary path
    fake.window = WINDOW
    rng = random.Random(11)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for round_no in range(30):
        fact = " Remember FACT-Lighthouse7 for later." if round_no == 0 else ""
        messages.append({"role": "user", "content": f"Round {round_no}: " + prose(rng, 300) + fact})
        fake.script.append(Reply(content=prose(rng, 250)))
        _, reply = await send(proxy, messages, "rounds30", stream=round_no % 2 == 1)
        messages.append(reply)

    assert fake.refused == 0 and max(fake.prompt_tokens) <= WINDOW
    assert "FACT-Lighthouse7" in orjson.dumps(fake.requests[-1]["messages"]).decode()
    await check_log(proxy, "rounds30", messages)


@pytest.mark.parametrize("placement", ["user", "system"])
@pytest.mark.parametrize("shape", ["rounds", "tool-steps"])
async def test_compacted_views_pass_a_strict_chat_template(make_proxy, fake: FakeUpstream, placement: str,
                                                           shape: str) -> None:
    """No two user messages in a row, no late system message, a user message first; the summary byte-stable.

    Masking is off (``MASKING_OFF``): it would keep the tool steps under the
    threshold without a summary, and summaries are what this test places (tests/test_masking_e2e.py runs masked
    views through the same strict template)."""
    proxy = await make_proxy(context_window=WINDOW, summary_placement=placement, **MASKING_OFF)
    fake.window, fake.strict_roles = WINDOW, True
    rng = random.Random(13)
    session = f"strict-{placement}-{shape}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    if shape == "tool-steps":
        messages.append({"role": "user", "content": "Refactor the parser module."})
    summaries: list[int] = []
    for step in range(36):
        if shape == "rounds":
            messages.append({"role": "user", "content": f"Round {step}: " + prose(rng, 300)})
            fake.script.append(Reply(content=prose(rng, 250)))
        else:
            fake.script.append(tool_call(step))
        _, reply = await send(proxy, messages, session, stream=step % 2 == 1)
        summaries.append(len(fake.summary_requests))
        messages.append(reply)
        if shape == "tool-steps":
            # honest usage: 36 outputs of 450 words (about 16,500 tokens) compact once; 700 words compact twice or more
            messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": prose(rng, 700)})
    if shape == "tool-steps":
        fake.script.append(Reply(content="All done."))
        messages.append((await send(proxy, messages, session, stream=False))[1])
        summaries.append(len(fake.summary_requests))

    assert fake.role_errors == []
    assert fake.refused == 0
    assert summaries[-1] >= 2, "the run compacted at least twice"
    views = [request["messages"] for request in fake.requests]
    # Each compaction changes the prompt prefix once (when its checkpoint is first used); otherwise views grow.
    changed = [i for i in range(len(views) - 1) if views[i + 1][: len(views[i])] != views[i]]
    assert 1 <= len(changed) <= summaries[-1]
    assert len(views) - 1 - len(changed) >= len(views) // 2
    await check_log(proxy, session, messages)
