"""Anthropic's ``cache_control`` breakpoints through the proxy: never more than four, the client's own never moved,
and the proxy's at the end of the compacted prefix (the summary block, the last masked item) while there is room."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from proxy.context.view.projection import SUMMARY_HEADER, FrozenEnds
from proxy.dialects import MESSAGES
from proxy.dialects.breakpoints import (
    OPENAI_FIELD,
    breakpoints,
    marks,
    takes_explicit_breakpoints,
    with_breakpoints,
)
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import STEP, Script
from tests.fakeupstream import FakeUpstream
from tests.proxyfixtures import MASKING_OFF
from tests.test_compaction_e2e import HEADERS, TOOLS, prose, tool_call
from tests.test_prompt_cache import AUTH, proxy_for

EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
PLACEHOLDER = re.compile(r"^\[output of .* elided: ")
RESPONSES_TOOLS = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}]


@dataclass(frozen=True)
class Layout:
    """Where a client puts its own breakpoints: on its first ``system`` blocks, its last tool, the last block of its
    last message (moved every turn, as Claude Code does), inside that message's ``tool_result``, at the top level."""

    system: int = 0
    tool: bool = False
    last: dict[str, Any] | None = None
    nested: bool = False
    top: bool = False


LAYOUTS = {
    "none": Layout(),
    "last": Layout(last=EPHEMERAL),
    "system+last": Layout(system=1, last=EPHEMERAL),
    "claude-code": Layout(system=2, last=EPHEMERAL),
    "four": Layout(system=2, tool=True, last=EPHEMERAL),
    "nested-in-a-result": Layout(system=2, tool=True, nested=True),
    "top-level": Layout(system=2, tool=True, top=True),
    "an-hour-last": Layout(system=1, last=HOUR),
}


def marked(messages: list[dict[str, Any]], layout: Layout) -> list[dict[str, Any]]:
    """The messages as the client sends them: its breakpoints on the last message only."""
    *earlier, last = messages
    content = list(last["content"])
    if layout.nested and content[-1]["type"] == "tool_result":
        inner = content[-1]["content"]
        content[-1] = {**content[-1], "content": [*inner[:-1], {**inner[-1], "cache_control": EPHEMERAL}]}
    if layout.last is not None:
        content[-1] = {**content[-1], "cache_control": layout.last}
    return [*earlier, {**last, "content": content}]


async def run(proxy: TestClient[Any, Any], steps: int, layout: Layout, words: int) -> list[dict[str, Any]]:
    """A Claude-like session of ``steps`` tool steps; the bodies the client sent."""
    rng = random.Random(6)
    system = [{"type": "text", "text": f"You code, part {i}.", **({"cache_control": EPHEMERAL} if i < layout.system
                                                                 else {})} for i in range(3)]
    tools = [{"name": "Bash", "input_schema": {"type": "object", "properties": {}},
              **({"cache_control": EPHEMERAL} if layout.tool else {})}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Go."}]}]
    sent = []
    for _ in range(steps):
        body = {"model": "m", "max_tokens": 512, "system": system, "tools": tools,
                "messages": marked(messages, layout), **({"cache_control": EPHEMERAL} if layout.top else {})}
        sent.append(body)
        resp = await proxy.post("/v1/messages", data=orjson.dumps(body), headers={**AUTH, "X-Session-Id": "marks"})
        raw = await resp.read()
        assert resp.status == 200, raw[:300]
        content = orjson.loads(raw)["content"]
        step = int(STEP.search(content[-1]["input"]["command"]).group(1))  # type: ignore[union-attr]
        output = [{"type": "text", "text": f"step-{step}\n" + prose(rng, words)}]
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": content[-1]["id"], "content": output}]}]
    return sent


def check_the_clients_own(upstream: dict[str, Any], client: dict[str, Any]) -> None:
    """The client's breakpoints reach the upstream on the same blocks, byte for byte."""
    for field in ("system", "tools", "cache_control"):
        assert orjson.dumps(upstream.get(field)) == orjson.dumps(client.get(field)), field
    assert orjson.dumps(upstream["messages"][-1]) == orjson.dumps(client["messages"][-1])


def summarised(body: dict[str, Any]) -> bool:
    first = body["messages"][0]["content"][0]
    return str(first.get("text", "")).startswith(SUMMARY_HEADER)


@pytest.mark.parametrize("name", LAYOUTS)
async def test_a_summarised_view_gets_one_on_its_summary_block_while_the_client_leaves_room(
        aiohttp_server: Any, aiohttp_client: Any, store_url: str, name: str) -> None:
    layout = LAYOUTS[name]
    fake = FakeMessages(Script(steps=40), window=16_000)
    proxy = await proxy_for(aiohttp_server, aiohttp_client, fake, store_url, context_window=16_000, **MASKING_OFF)
    sent = await run(proxy, 24, layout, 700)
    turns = [turn.body for turn in fake.turns()]
    assert len(turns) == len(sent)
    for upstream, client in zip(turns, sent, strict=True):
        own = breakpoints(client, client["messages"])
        room = 4 - own
        assert breakpoints(upstream, upstream["messages"]) == own + (room > 0 and summarised(upstream))
        check_the_clients_own(upstream, client)
        ours = marks(upstream["messages"][:-1])  # the client marks only its last message
        if summarised(upstream) and room:
            want = HOUR if layout.last == HOUR else EPHEMERAL  # an hour's breakpoint after it: one hour too
            assert upstream["messages"][0]["content"][0]["cache_control"] == want
            assert ours == [want]
        else:
            assert ours == []
    assert any(summarised(body) for body in turns), "the run was summarised"


@pytest.mark.parametrize("name", ["claude-code", "none"])
async def test_a_view_that_only_masks_gets_one_on_its_last_masked_item(
        aiohttp_server: Any, aiohttp_client: Any, store_url: str, name: str) -> None:
    layout = LAYOUTS[name]
    fake = FakeMessages(Script(steps=40), window=40_000)
    proxy = await proxy_for(aiohttp_server, aiohttp_client, fake, store_url, context_window=40_000,
                            keep_tool_output_share=1.0)
    sent = await run(proxy, 30, layout, 1000)
    turns = [turn.body for turn in fake.turns()]
    masked = 0
    for upstream, client in zip(turns, sent, strict=True):
        assert not summarised(upstream), "masking was enough"
        check_the_clients_own(upstream, client)
        messages = upstream["messages"]
        results = [(i, block) for i, m in enumerate(messages) for block in m["content"]
                   if block["type"] == "tool_result"]
        placeholders = [i for i, block in results if PLACEHOLDER.match(str(block["content"]))]
        ours = [i for i, m in enumerate(messages[:-1]) if marks(m)]
        assert breakpoints(upstream, messages) == breakpoints(client, client["messages"]) + len(ours) <= 4
        if not placeholders:
            assert ours == []
            continue
        masked += 1
        assert len(ours) == 1
        end = ours[0]  # the last masked item: an assistant turn, the next message the first output kept whole
        assert end >= placeholders[-1] and messages[end]["role"] == "assistant"
        assert messages[end]["content"][-1] == {**messages[end]["content"][-1], "cache_control": EPHEMERAL}
        assert not any(PLACEHOLDER.match(str(block["content"])) for i, block in results if i > end)
        assert end + 1 in [i for i, _ in results]
    assert masked >= 3, "the run was masked"


SUMMARY = {"role": "user", "content": [{"type": "text", "text": f"{SUMMARY_HEADER}\n\nS"},
                                       {"type": "text", "text": "go on"}]}
THOUGHT = {"type": "thinking", "thinking": "t", "signature": "s"}
CALL = {"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "ls"}}
ASSISTANT = {"role": "assistant", "content": [THOUGHT, CALL]}
RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "a.py"}]}


def test_every_breakpoint_counts_wherever_it_sits() -> None:
    nested = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": [
        {"type": "text", "text": "a.py", "cache_control": EPHEMERAL}]}]}
    payload = {"cache_control": EPHEMERAL, "system": [{"type": "text", "text": "s", "cache_control": EPHEMERAL}],
               "tools": [{"name": "Bash", "input_schema": {}, "cache_control": EPHEMERAL}], "messages": []}
    assert breakpoints(payload, [nested]) == 4
    assert MESSAGES.cache_hints(payload, [SUMMARY, nested], FrozenEnds(summary=0), adds_fields=True) == [
        SUMMARY, nested], "no room"


def test_the_summary_block_comes_first_and_the_masked_end_takes_what_room_is_left() -> None:
    items = [SUMMARY, ASSISTANT, RESULT]
    both = with_breakpoints({}, items, FrozenEnds(summary=0, masked=1))
    assert both[0]["content"][0]["cache_control"] == EPHEMERAL
    assert both[1]["content"] == [THOUGHT, {**CALL, "cache_control": EPHEMERAL}], "not on the thinking block"
    assert items[1]["content"] == [THOUGHT, CALL], "the view's items are not changed in place"
    three = {"system": [{"type": "text", "text": str(i), "cache_control": EPHEMERAL} for i in range(3)]}
    one = with_breakpoints(three, items, FrozenEnds(summary=0, masked=1))
    assert marks(one) == [EPHEMERAL] and "cache_control" in one[0]["content"][0]


def test_none_goes_where_the_clients_own_already_sits() -> None:
    own = {"role": "assistant", "content": [THOUGHT, {**CALL, "cache_control": EPHEMERAL}]}
    assert with_breakpoints({}, [own, RESULT], FrozenEnds(masked=0)) == [own, RESULT]
    thinking_only = {"role": "assistant", "content": [THOUGHT]}
    assert with_breakpoints({}, [thinking_only], FrozenEnds(masked=0)) == [thinking_only], "no block takes one"


def openai_marks(body: dict[str, Any]) -> list[tuple[int, int]]:
    """Where a Chat or Responses body carries ``prompt_cache_breakpoint``: (item, part) positions."""
    items = body.get("messages") or body.get("input") or []
    return [(i, p) for i, item in enumerate(items) if isinstance(item.get("content"), list)
            for p, part in enumerate(item["content"]) if isinstance(part, dict) and OPENAI_FIELD in part]


def holds_summary(item: dict[str, Any]) -> bool:
    return SUMMARY_HEADER in orjson.dumps(item.get("content")).decode()


@pytest.mark.parametrize(("model", "placement", "own", "taken"), [
    ("gpt-5.6", "user", {}, True), ("gpt-5.6", "system", {}, True),
    ("gpt-5.5", "user", {}, False),  # writes are not billed before GPT-5.6: no explicit breakpoints
    ("gpt-5.6", "user", {"prompt_cache_options": {"mode": "implicit"}}, False),  # the client manages its own
])
async def test_a_summarised_chat_view_gets_openais_breakpoint_on_the_models_that_take_it(
        make_proxy: Any, fake: FakeUpstream, model: str, placement: str, own: dict[str, Any], taken: bool) -> None:
    proxy = await make_proxy(context_window=16_000, summary_placement=placement, add_fields="always", **MASKING_OFF)
    fake.window = 16_000
    rng = random.Random(5)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You code."}, {"role": "user", "content": "Go."}]
    for step in range(30):
        fake.script.append(tool_call(step))
        body = {"model": model, "messages": messages, "tools": TOOLS, **own}
        resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                                headers={**HEADERS, "X-Session-Id": f"bp-{model}-{placement}"})
        assert resp.status == 200
        reply = (await resp.json())["choices"][0]["message"]
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": prose(rng, 450)}]
    turns = [body for body in fake.requests if body not in fake.summary_requests]
    summarised = [body for body in turns if any(holds_summary(m) for m in body["messages"])]
    assert summarised, "the run was summarised"
    for body in turns:
        at = [i for i, m in enumerate(body["messages"]) if holds_summary(m)]
        if taken and at:
            summary = body["messages"][at[0]]
            assert openai_marks(body) == [(at[0], len(summary["content"]) - 1)]
            assert summary["content"][-1][OPENAI_FIELD] == {"mode": "explicit"}
            assert summary["role"] == placement
        else:
            assert openai_marks(body) == []


async def test_a_summarised_responses_view_gets_openais_breakpoint_only_where_fields_may_be_added(
        aiohttp_server: Any, aiohttp_client: Any, store_url: str) -> None:
    for add_fields, taken in (("always", True), ("never", False)):
        fake = FakeResponses(Script(steps=40), window=16_000)
        proxy = await proxy_for(aiohttp_server, aiohttp_client, fake, store_url, context_window=16_000,
                                add_fields=add_fields, **MASKING_OFF)
        rng = random.Random(2)
        items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Go."}]
        for _ in range(24):
            body = {"model": "gpt-5.6", "input": items, "tools": RESPONSES_TOOLS, "store": False}
            resp = await proxy.post("/v1/responses", data=orjson.dumps(body), headers={**AUTH, "X-Session-Id": "r"})
            raw = await resp.read()
            assert resp.status == 200, raw[:300]
            output = orjson.loads(raw)["output"]
            step = STEP.search(output[-1]["arguments"]).group(1)  # type: ignore[union-attr]
            items += [*output, {"type": "function_call_output", "call_id": output[-1]["call_id"],
                                "output": f"step-{step}\n" + prose(rng, 700)}]
        turns = [turn.body for turn in fake.turns()]
        summarised = [body for body in turns if any(holds_summary(item) for item in body["input"])]
        assert summarised, "the run was summarised"
        for body in turns:
            at = [i for i, item in enumerate(body["input"]) if holds_summary(item)]
            want = [(at[0], len(body["input"][at[0]]["content"]) - 1)] if taken and at else []
            assert openai_marks(body) == want
            assert all(part["type"] == "input_text" for i, _ in want for part in body["input"][i]["content"])


def test_only_the_openai_families_that_bill_writes_take_explicit_breakpoints() -> None:
    assert takes_explicit_breakpoints("gpt-5.6") and takes_explicit_breakpoints("openai/gpt-5.6-terra")
    for model in ("gpt-5.5", "gpt-4o", "ft:gpt-4o-2024-11-20", "claude-sonnet-4-5", "my-model", ""):
        assert not takes_explicit_breakpoints(model), model


def test_the_proxys_breakpoint_lasts_an_hour_when_a_later_one_of_the_clients_does() -> None:
    """Anthropic wants longer TTLs before shorter ones: after the proxy's, an hour's breakpoint of the client's (on a
    later block, or the top-level one that goes on the last block) makes the proxy's an hour's too."""
    later = {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": HOUR}]}
    assert marks(with_breakpoints({}, [SUMMARY, later], FrozenEnds(summary=0))[0]) == [HOUR]
    assert marks(with_breakpoints({"cache_control": HOUR}, [SUMMARY], FrozenEnds(summary=0))) == [HOUR]
    earlier = {"system": [{"type": "text", "text": "s", "cache_control": HOUR}]}
    assert marks(with_breakpoints(earlier, [SUMMARY], FrozenEnds(summary=0))) == [EPHEMERAL], "only later ones count"
