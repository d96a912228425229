"""Proactive compaction end to end: a fake upstream that enforces a 16k window and writes summaries."""

from __future__ import annotations

import random
from typing import Any

import orjson

from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import assistant_from_sse, read_log, replay, same_conversation

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
    proxy = await make_proxy(context_window=WINDOW)
    fake.window = WINDOW
    rng = random.Random(7)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Refactor the parser module."}]
    compacted = set()
    for step in range(60):
        fake.script.append(tool_call(step))
        resp, reply = await send(proxy, messages, "tools60", stream=step % 3 == 0)
        compacted.add(resp.headers["X-Ctxproxy-Compacted"])
        messages.append(reply)
        fact = " The secret build flag is FACT-Zebra42." if step == 0 else ""
        messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                         "content": prose(rng, 450) + fact})
    fake.script.append(Reply(content="All done."))
    _, final = await send(proxy, messages, "tools60", stream=False)
    messages.append(final)

    assert fake.refused == 0 and max(fake.prompt_tokens) <= WINDOW
    assert "proactive" in compacted
    assert fake.summary_requests, "a summary was written"
    last_view = orjson.dumps(fake.requests[-1]["messages"]).decode()
    assert "FACT-Zebra42" in last_view
    assert fake.requests[-1]["messages"][0] == messages[0]
    assert {"role": "user", "content": "Refactor the parser module."} in fake.requests[-1]["messages"]
    await check_log(proxy, "tools60", messages)


async def test_thirty_short_rounds_stay_inside_the_window(make_proxy, fake: FakeUpstream) -> None:
    proxy = await make_proxy(context_window=WINDOW)
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
