"""The fake Messages API upstream on its own: its wire shapes, history checks, overflow and summaries."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.fakemessages import CLIENT_COMPACTION, FakeMessages
from tests.fakescript import SUMMARY_HEADINGS, Script, parse_sse
from tests.fakeupstream import SUMMARY_MARKER

TOOLS = [{"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
USER = {"role": "user", "content": [{"type": "text", "text": "Go."}]}


def body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-opus-5-5", "max_tokens": 1000, "system": [{"type": "text", "text": "You code."}],
            "messages": messages, "tools": TOOLS, "stream": True, **extra}


async def post(client: Any, payload: dict[str, Any], path: str = "/v1/messages?beta=true") -> tuple[int, Any]:
    resp = await client.post(path, data=orjson.dumps(payload), headers={"X-Claude-Code-Session-Id": "s1"})
    raw = await resp.read()
    if resp.content_type == "text/event-stream":
        return resp.status, parse_sse(raw)
    return resp.status, orjson.loads(raw)


def assemble(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The message a client builds from the stream."""
    message: dict[str, Any] = events[0]["message"]
    for event in events:
        if event["type"] == "content_block_start":
            message["content"].append({**event["content_block"], "partial": ""})
        elif event["type"] == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            key = {"thinking_delta": "thinking", "signature_delta": "signature", "text_delta": "text",
                   "input_json_delta": "partial"}[delta["type"]]
            block[key] += delta[key if key != "partial" else "partial_json"]
        elif event["type"] == "message_delta":
            message["stop_reason"] = event["delta"]["stop_reason"]
    for block in message["content"]:
        partial = block.pop("partial")
        if block["type"] == "tool_use":
            block["input"] = orjson.loads(partial)
    return message


def answer(call: dict[str, Any], text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": text}]}


async def test_a_turn_streams_signed_thinking_then_a_bash_call(aiohttp_client) -> None:
    client = await aiohttp_client(FakeMessages().app())
    status, events = await post(client, body([USER]))
    assert status == 200
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"]
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    deltas = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
    assert deltas[0] == "thinking_delta" and "signature_delta" in deltas and "input_json_delta" in deltas
    message = assemble(events)
    thinking, call = message["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "Step 1 next." and thinking["signature"]
    assert (call["name"], call["input"]["command"]) == ("Bash", "echo step-1")
    assert message["stop_reason"] == "tool_use"
    _, hidden = await post(client, body([USER], thinking={"type": "adaptive", "display": "omitted"}))
    assert assemble(hidden)["content"][0]["thinking"] == ""


async def test_the_script_reads_the_last_tool_result_and_passes_over_system_entries(aiohttp_client) -> None:
    client = await aiohttp_client(FakeMessages(Script(steps=2)).app())
    history = [USER, {"role": "system", "content": "Today's date is 2026-11-30."}]
    for step in (1, 2):
        _, events = await post(client, body(history))
        message = assemble(events)
        call = message["content"][-1]
        assert call["input"]["command"] == f"echo step-{step}"
        history = [*history, {"role": "assistant", "content": message["content"]}, answer(call, f"step-{step}"),
                   {"role": "system", "content": "The user hasn't heard from you in a while."}]
    _, events = await post(client, body(history))
    final = assemble(events)
    assert (final["content"][-1], final["stop_reason"]) == ({"type": "text", "text": "All 2 steps done."}, "end_turn")


async def test_a_non_streaming_turn_is_one_message(aiohttp_client) -> None:
    client = await aiohttp_client(FakeMessages().app())
    status, message = await post(client, body([USER], stream=False))
    assert (status, message["type"], message["stop_reason"]) == (200, "message", "tool_use")
    assert [b["type"] for b in message["content"]] == ["thinking", "tool_use"]


async def test_history_the_real_api_refuses_gets_400(aiohttp_client) -> None:
    fake = FakeMessages()
    client = await aiohttp_client(fake.app())
    _, message = await post(client, body([USER], stream=False))
    thinking, call = message["content"]
    turn = {"role": "assistant", "content": [thinking, call]}
    cases = {
        "signature": [USER, {"role": "assistant", "content": [{**thinking, "signature": "forged"}, call]},
                      answer(call, "step-1")],
        "unanswered": [USER, turn, USER],
        "orphan": [USER, {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}, answer(call, "x")],
        "assistant first": [turn, answer(call, "step-1")],
    }
    messages = {}
    for name, conversation in cases.items():
        status, error = await post(client, body(conversation))
        assert (status, error["type"]) == (400, "error"), name
        messages[name] = error["error"]["message"]
    assert messages == {
        "signature": "messages.1.content.0: Invalid `signature` in `thinking` block",
        "unanswered": f"messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: "
                      f"{call['id']}. Each `tool_use` block must have a corresponding `tool_result` block in the "
                      "next message.",
        "orphan": f"messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: {call['id']}. "
                  "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
        "assistant first": 'messages: first message must use the "user" role',
    }


@pytest.mark.parametrize("overflow", ["http", "event"])
async def test_over_the_window_it_says_prompt_is_too_long(aiohttp_client, overflow: str) -> None:
    fake = FakeMessages(window=20, overflow=overflow)
    client = await aiohttp_client(fake.app())
    status, answer_ = await post(client, body([USER]))
    tokens = fake.requests[0].tokens
    error = {"type": "error", "error": {"type": "invalid_request_error",
                                        "message": f"prompt is too long: {tokens} tokens > 20 maximum"}}
    if overflow == "http":
        assert (status, answer_) == (400, error)
    else:
        assert (status, [e["type"] for e in answer_], answer_[-1]) == (200, ["message_start", "ping", "error"], error)
    assert (await post(client, body([USER], stream=False))) == (400, error)


async def test_count_tokens_counts_what_a_turn_is_counted_with(aiohttp_client) -> None:
    fake = FakeMessages()
    client = await aiohttp_client(fake.app())
    status, counted = await post(client, body([USER]), "/v1/messages/count_tokens?beta=true")
    await post(client, body([USER]))
    assert (status, counted) == (200, {"input_tokens": fake.requests[1].tokens})
    assert [r.kind for r in fake.requests] == ["count_tokens", "turn"]


async def test_the_prefix_shared_with_the_previous_turn_is_reported_as_cache_reads(aiohttp_client) -> None:
    client = await aiohttp_client(FakeMessages().app())
    _, first = await post(client, body([USER], stream=False))
    _, second = await post(client, body([USER, {"role": "assistant", "content": first["content"]},
                                         answer(first["content"][-1], "step-1")], stream=False))
    assert first["usage"]["cache_read_input_tokens"] == 0
    whole_first = first["usage"]["input_tokens"]
    assert second["usage"]["cache_read_input_tokens"] == whole_first


async def test_a_summary_call_gets_the_eight_sections(aiohttp_client) -> None:
    fake = FakeMessages()
    client = await aiohttp_client(fake.app())
    shown = {"role": "user", "content": "step-4 ran; keep FACT-z9"}
    for system in (SUMMARY_MARKER + " of an agent.", [{"type": "text", "text": SUMMARY_MARKER + " of an agent."}]):
        status, message = await post(client, body([shown], system=system, stream=False, tools=None))
        text = message["content"][0]["text"]
        assert [line for line in text.splitlines() if line.startswith("## ")] == list(SUMMARY_HEADINGS)
        assert text.endswith("## 8. Identifiers\nFACT-z9") and status == 200
    _, events = await post(client, body([shown], system=SUMMARY_MARKER, tools=None))
    assert assemble(events)["content"][0]["text"] == text
    assert [r.kind for r in fake.requests] == ["summary"] * 3


async def test_the_agents_own_compaction_is_recorded(aiohttp_client) -> None:
    fake = FakeMessages()
    client = await aiohttp_client(fake.app())
    own = {"role": "user", "content": [{"type": "text", "text": f"CRITICAL: text only. {CLIENT_COMPACTION}."}]}
    _, message = await post(client, body([own], stream=False))
    assert [b["type"] for b in message["content"]] == ["text"]
    assert [r.kind for r in fake.requests] == ["client_compaction"]
