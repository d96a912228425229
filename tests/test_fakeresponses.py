"""The fake Responses API upstream on its own: its wire shapes, history checks, overflow shapes and summaries."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.fakeresponses import CLIENT_COMPACTION, OVERFLOW_ERROR, FakeResponses
from tests.fakescript import SUMMARY_HEADINGS, Script, parse_sse
from tests.fakeupstream import SUMMARY_MARKER

TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}}]
USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]}


def body(items: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-5.5", "input": items, "tools": TOOLS, "store": False, "stream": True,
            "prompt_cache_key": "k", **extra}


async def post(client: Any, payload: dict[str, Any], path: str = "/v1/responses") -> tuple[int, Any]:
    resp = await client.post(path, data=orjson.dumps(payload))
    raw = await resp.read()
    if resp.content_type == "text/event-stream":
        return resp.status, parse_sse(raw)
    return resp.status, orjson.loads(raw)


def output_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert events[-1]["type"] == "response.completed"
    output: list[dict[str, Any]] = events[-1]["response"]["output"]
    return output


def step_output(call: dict[str, Any], text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call["call_id"], "output": text}


async def test_a_turn_streams_reasoning_then_a_shell_call(aiohttp_client) -> None:
    client = await aiohttp_client(FakeResponses().app())
    status, events = await post(client, body([USER]))
    assert status == 200
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed" and "[DONE]" not in kinds
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["reasoning", "function_call"] == [i["type"] for i in added]
    assert added[0]["encrypted_content"] is None and done[0]["encrypted_content"]
    assert (done[1]["name"], orjson.loads(done[1]["arguments"])) == ("exec_command", {"cmd": "echo step-1"})
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert deltas == done[1]["arguments"]
    assert output_of(events) == done
    usage = events[-1]["response"]["usage"]
    assert usage["input_tokens"] > 0 and usage["input_tokens_details"] == {"cached_tokens": 0}


async def test_the_script_reads_the_last_call_and_its_output(aiohttp_client) -> None:
    client = await aiohttp_client(FakeResponses(Script(steps=2)).app())
    history = [USER]
    for step in (1, 2):
        _, events = await post(client, body(history))
        reasoning, call = output_of(events)
        assert orjson.loads(call["arguments"]) == {"cmd": f"echo step-{step}"}
        history = [*history, reasoning, call, step_output(call, f"Output:\nstep-{step}\n")]
    _, events = await post(client, body(history))
    assert output_of(events)[-1]["content"][0]["text"] == "All 2 steps done."
    _, events = await post(client, body([*history[:-1], step_output(history[-2], "command not found")]))
    assert output_of(events)[-1]["content"][0]["text"] == "Step 2 printed nothing I recognise: 'command not found'."


async def test_a_non_streaming_turn_is_one_response_object(aiohttp_client) -> None:
    client = await aiohttp_client(FakeResponses().app())
    status, answer = await post(client, body([USER], stream=False))
    assert (status, answer["object"], answer["status"]) == (200, "response", "completed")
    assert [i["type"] for i in answer["output"]] == ["reasoning", "function_call"]


async def test_history_the_real_api_refuses_gets_400(aiohttp_client) -> None:
    fake = FakeResponses()
    client = await aiohttp_client(fake.app())
    _, events = await post(client, body([USER]))
    reasoning, call = output_of(events)
    answered = step_output(call, "step-1")
    cases = {
        "tampered": [USER, {**reasoning, "encrypted_content": "x"}, call, answered],
        "alone": [USER, call, answered, reasoning],
        "orphan output": [USER, answered],
        "unanswered call": [USER, reasoning, call],
    }
    messages = {}
    for name, items in cases.items():
        status, answer = await post(client, body(items))
        assert status == 400, name
        messages[name] = answer["error"]["message"]
    assert messages == {
        "tampered": f"The encrypted content for item {reasoning['id']} could not be verified.",
        "alone": f"Item '{reasoning['id']}' of type 'reasoning' was provided without its required following item.",
        "orphan output": f"No tool call found for function call output with call_id {call['call_id']}.",
        "unanswered call": f"No tool output found for function call {call['call_id']}.",
    }
    assert [r.status for r in fake.requests] == [200, 400, 400, 400, 400]


@pytest.mark.parametrize("overflow", ["http", "event", "failed"])
async def test_over_the_window_it_refuses_in_each_shape(aiohttp_client, overflow: str) -> None:
    fake = FakeResponses(window=20, overflow=overflow)
    client = await aiohttp_client(fake.app())
    status, answer = await post(client, body([USER]))
    if overflow == "http":
        assert (status, answer) == (400, {"error": OVERFLOW_ERROR})
    elif overflow == "event":
        assert (status, [e["type"] for e in answer]) == (200, ["response.created", "error"])
        assert answer[1]["error"] == OVERFLOW_ERROR
    else:
        assert (status, [e["type"] for e in answer]) == (200, ["response.created", "response.failed"])
        assert answer[1]["response"]["error"] == {"code": "context_length_exceeded",
                                                  "message": OVERFLOW_ERROR["message"]}
    (recorded,) = fake.requests
    assert recorded.tokens is not None and recorded.tokens > 20
    status, answer = await post(client, body([USER], stream=False))
    assert (status, answer) == (400, {"error": OVERFLOW_ERROR})


async def test_the_prefix_shared_with_the_previous_turn_is_reported_cached(aiohttp_client) -> None:
    client = await aiohttp_client(FakeResponses().app())
    long_user = {**USER, "content": [{"type": "input_text", "text": "word " * 3000}]}
    _, first = await post(client, body([long_user]))
    reasoning, call = output_of(first)
    _, second = await post(client, body([long_user, reasoning, call, step_output(call, "step-1")]))
    cached = second[-1]["response"]["usage"]["input_tokens_details"]["cached_tokens"]
    assert first[-1]["response"]["usage"]["input_tokens_details"]["cached_tokens"] == 0
    whole_first = first[-1]["response"]["usage"]["input_tokens"]
    assert (whole_first > 3000, cached) == (True, whole_first // 128 * 128)


async def test_summary_calls_get_the_eight_sections_on_both_routes(aiohttp_client) -> None:
    fake = FakeResponses()
    client = await aiohttp_client(fake.app())
    shown = "step-3 ran; remember FACT-a1 and FACT-b2"
    chat = {"model": "m", "messages": [{"role": "system", "content": SUMMARY_MARKER + " of an agent."},
                                       {"role": "user", "content": shown}]}
    status, answer = await post(client, chat, "/v1/chat/completions")
    assert status == 200
    from_chat = answer["choices"][0]["message"]["content"]
    _, events = await post(client, body([{**USER, "content": [{"type": "input_text", "text": shown}]}],
                                        instructions=SUMMARY_MARKER + " of an agent."))
    from_responses = output_of(events)[0]["content"][0]["text"]
    assert from_chat == from_responses
    assert [line for line in from_chat.splitlines() if line.startswith("## ")] == list(SUMMARY_HEADINGS)
    assert from_chat.endswith("## 8. Identifiers\nFACT-a1 FACT-b2")
    status, _ = await post(client, {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                           "/v1/chat/completions")
    assert status == 404
    assert [r.kind for r in fake.requests] == ["summary", "summary", "other"]


async def test_remote_compaction_answers_one_compaction_item(aiohttp_client) -> None:
    fake = FakeResponses()
    client = await aiohttp_client(fake.app())
    status, answer = await post(client, body([USER], stream=False), "/v1/responses/compact")
    assert status == 200 and [i["type"] for i in answer["output"]] == ["compaction"]
    _, events = await post(client, body([USER, {"type": "compaction_trigger"}]))
    assert [i["type"] for i in output_of(events)] == ["compaction"]
    assert [r.kind for r in fake.requests] == ["compact", "compact"]


async def test_the_agents_own_compaction_and_a_websocket_attempt_are_recorded(aiohttp_client) -> None:
    fake = FakeResponses()
    client = await aiohttp_client(fake.app())
    own = {**USER, "content": [{"type": "input_text", "text": CLIENT_COMPACTION + ". Summarise."}]}
    _, events = await post(client, body([USER, own]))
    assert [i["type"] for i in output_of(events)] == ["message"]
    resp = await client.get("/v1/responses", headers={"Connection": "Upgrade", "Upgrade": "websocket"})
    assert resp.status == 426
    assert [(r.kind, r.status) for r in fake.requests] == [("client_compaction", 200), ("websocket", 426)]
