"""One session, several conversations: the log is a tree of lineages, and checkpoints follow their lineage.

opencode sends its title-generation call (another system prompt, no tools)
under the run's own session header: it shares no message with the run and
opens with another system prompt, so it is a conversation of its own
(``proxy.http.subagents``). Agents fan out or switch between histories that
open alike. Returning to a known branch must cost one ``rewind`` entry and
re-log nothing, and a checkpoint must keep serving the lineage it covers.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import orjson

from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey, StoredFact
from tests.fakeresponses import FakeResponses
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import MASKING_OFF, ProxyFactory, read_log, replay, same_conversation
from tests.scripted import KEY, rig
from tests.test_compaction_e2e import prose

API_KEY = "sk-lineages"
TENANT = tenant_of(API_KEY)
WINDOW = 4000
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
ROLLING = "<previous-summary>"


async def send(proxy: Any, session: str, messages: list[dict[str, Any]], tools: bool = True) -> tuple[str, Any]:
    """``X-Ctxproxy-Compacted`` and the reply."""
    body: dict[str, Any] = {"model": "gpt-4o", "messages": messages}
    if tools:
        body["tools"] = TOOLS
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={"Authorization": f"Bearer {API_KEY}", "X-Session-Id": session})
    raw = await resp.read()
    assert resp.status == 200, raw[:300]
    return resp.headers["X-Ctxproxy-Compacted"], orjson.loads(raw)["choices"][0]["message"]


def call(n: int) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{n}", "type": "function", "function": {
        "name": "read_file", "arguments": orjson.dumps({"n": n}).decode()}}]}


def result(n: int, rng: random.Random) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"call_{n}", "content": f"file {n}: " + prose(rng, 120)}


async def step(proxy: Any, fake: FakeUpstream, session: str, messages: list[dict[str, Any]], n: int,
               rng: random.Random) -> str:
    """One tool step of an agent: the model calls a tool, the client appends its result."""
    fake.script.append(Reply(tool_calls=call(n)["tool_calls"]))
    compacted, reply = await send(proxy, session, messages)
    messages += [reply, result(n, rng)]
    return compacted


def entries(facts: list[StoredFact], kind: str) -> list[StoredFact]:
    return [f for f in facts if f.kind == kind]


async def test_a_title_call_mid_run_leaves_the_main_checkpoint_in_use(make_proxy: ProxyFactory,
                                                                      fake: FakeUpstream) -> None:
    # No output masked: masking (tier 1) would keep the run under the trigger; this is about summaries. With honest
    # usage, the batches below the threshold alone push the first summary past 30 steps.
    proxy = await make_proxy(context_window=WINDOW, min_retain_rounds=2, **MASKING_OFF)
    rng = random.Random(3)
    main: list[dict[str, Any]] = [{"role": "system", "content": "You are opencode, an agent for coding tasks."},
                                  {"role": "user", "content": "Refactor the parser module."}]
    n = 0
    while await step(proxy, fake, "run", main, n, rng) != "proactive":
        n += 1
        assert n < 30, "the main run never compacted"
    summaries = len(fake.summary_requests)

    title = [{"role": "system", "content": "You are a title generator. Reply with a title of at most 50 characters."},
             {"role": "user", "content": "Generate a title for this conversation: Refactor the parser module."}]
    _, title_reply = await send(proxy, "run", title, tools=False)

    resent = len(main)
    assert await step(proxy, fake, "run", main, n + 1, rng) == "none"
    assert len(fake.summary_requests) == summaries
    assert len(fake.requests[-1]["messages"]) < resent, "the main lineage's checkpoint is still in use"
    while len(fake.summary_requests) == summaries:
        n += 1
        await step(proxy, fake, "run", main, n + 1, rng)
        assert n < 60, "the main run never compacted again"
    assert ROLLING in fake.summary_requests[-1]["messages"][-1]["content"], "the next compaction is a rolling update"

    # The title call shares no message with the run and has its own system prompt: a conversation of its own
    # (proxy.http.subagents), logged as the session run/<its fingerprint>; the run's head never moved away and back.
    store = proxy.app[store_key]
    sessions = sorted([info.session async for info in store.sessions()])
    assert sessions[0] == "run" and len(sessions) == 2 and sessions[1].startswith("run/auto-")
    facts = await read_log(store, SessionKey(TENANT, "run"))
    assert entries(facts, "rewind") == []
    logged = [f.hash for f in entries(facts, "message")]
    assert len(logged) == len(set(logged)) == len(main) - 1, "nothing was logged twice"
    assert same_conversation(replay(facts), main[:-1])
    aside = await read_log(store, SessionKey(TENANT, sessions[1]))
    assert same_conversation(replay(aside), [*title, title_reply])


async def test_two_lineages_alternating_cost_one_entry_per_switch(make_proxy: ProxyFactory,
                                                                  fake: FakeUpstream) -> None:
    proxy = await make_proxy(context_window=WINDOW, min_retain_rounds=2)
    rng = random.Random(5)
    lineages: list[list[dict[str, Any]]] = []
    for name in ("A", "B"):
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are an auditing agent."},
                                         {"role": "user", "content": f"Audit repository {name}."}]
        for n in range(24):  # resumed with a history over the threshold: the first request compacts
            history += [call(n), result(n, rng)]
        lineages.append(history)
    summaries_by_lineage = [0, 0]
    for request in range(12):
        which = request % 2
        before = len(fake.summary_requests)
        await step(proxy, fake, "alternating", lineages[which], 100 + request, rng)
        summaries_by_lineage[which] += len(fake.summary_requests) - before

    assert summaries_by_lineage == [0, 0], "masking old tool outputs was enough: no summary call"
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "alternating"))
    sent = sum(len(history) - 1 for history in lineages) - 1  # they share their start; each last result unsent
    kinds = Counter(f.kind for f in facts)
    # Only new messages, one rewind per switch, and one reduction (a masking checkpoint) per lineage, which
    # keeps serving its lineage across the switches.
    assert kinds == {"message": sent, "rewind": 11, "checkpoint": 2}
    assert same_conversation(replay(facts), lineages[1][:-1])


# -- previous_response_id: the request sends only what is new; the log continues the lineage it extends -------------


def user_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def test_a_previous_response_id_request_continues_the_lineage_of_that_response(
        aiohttp_server: Any, aiohttp_client: Any, tmp_path: Any) -> None:
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeResponses())
    headers = {"Authorization": f"Bearer {KEY}", "session_id": "stateful"}

    async def turn(items: list[dict[str, Any]], previous: str | None, stream: bool) -> tuple[str, list[Any]]:
        body = {"model": "gpt-5.5", "input": items, "store": True, "stream": stream,
                **({"previous_response_id": previous} if previous else {})}
        resp = await proxy.post("/v1/responses", data=orjson.dumps(body), headers=headers)
        assert resp.status == 200, await resp.text()
        if not stream:
            answer = await resp.json()
            return answer["id"], answer["output"]
        events = [orjson.loads(line[6:]) for line in (await resp.read()).split(b"\n") if line.startswith(b"data: ")]
        done = next(e["response"] for e in events if e["type"] == "response.completed")
        return done["id"], done["output"]

    first, second, third, aside = (user_item(t) for t in ("Start.", "Go on.", "And then?", "Or rather this."))
    id1, out1 = await turn([first], None, False)
    id2, out2 = await turn([second], id1, True)
    _, out3 = await turn([third], id2, False)
    facts = await read_log(proxy.server.app[store_key], SessionKey(tenant_of(KEY), "stateful"))
    assert [f.kind for f in facts] == ["message"] * (3 + len(out1) + len(out2) + len(out3)), "no rewind at all"
    assert replay(facts) == [first, *out1, second, *out2, third, *out3]
    assert [f.index for f in facts] == list(range(len(facts)))

    # From the first response again (a user who went back): one rewind to its last item, nothing logged twice.
    _, out4 = await turn([aside], id1, False)
    logged = len(await read_log(proxy.server.app[store_key], SessionKey(tenant_of(KEY), "stateful")))
    await turn([aside], id1, False)  # the same step retried, answered the same: all of it is the log's already
    facts = await read_log(proxy.server.app[store_key], SessionKey(tenant_of(KEY), "stateful"))
    assert len(facts) == logged
    rewinds = [f for f in facts if f.kind == "rewind"]
    last_of_first = max(f.seq for f in facts if f.extra.get("response_id") == id1)
    assert [(r.index, r.extra["from_seq"]) for r in rewinds] == [(1 + len(out1), last_of_first)]
    assert replay(facts) == [first, *out1, aside, *out4]
    assert all(f.extra.get("response_id") for f in facts if f.source == "upstream")


async def test_a_previous_response_id_the_log_does_not_know_starts_a_lineage(
        aiohttp_server: Any, aiohttp_client: Any, tmp_path: Any) -> None:
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeResponses())
    body = {"model": "gpt-5.5", "input": [user_item("Go on.")], "previous_response_id": "resp_from_before"}
    resp = await proxy.post("/v1/responses", data=orjson.dumps(body),
                            headers={"Authorization": f"Bearer {KEY}", "session_id": "stateful"})
    assert resp.status == 200
    facts = await read_log(proxy.server.app[store_key], SessionKey(tenant_of(KEY), "stateful"))
    assert [(f.kind, f.index) for f in facts] == [("message", 0), ("message", 1)]
