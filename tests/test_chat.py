"""End to end: a client drives the proxy, which talks to the fake upstream and logs to a real store."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import read_log, replay, same_conversation

SHELL_PARAMS = {"type": "object", "properties": {"cmd": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "run_shell", "description": "Run a command",
                                             "parameters": SHELL_PARAMS}}]
AUTH = {"Authorization": "Bearer sk-test-key"}
TENANT = tenant_of("sk-test-key")


def sse_events(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[len(b"data: "):]
            out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


def assemble(events: list[Any]) -> dict[str, Any]:
    """What a client does with a stream: content and tool calls by index."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    calls: dict[int, dict[str, Any]] = {}
    for event in events:
        if event == "[DONE]" or not event["choices"]:
            continue
        delta = event["choices"][0]["delta"]
        if delta.get("content"):
            message["content"] = (message["content"] or "") + delta["content"]
        for tc in delta.get("tool_calls") or []:
            call = calls.setdefault(tc["index"], {"id": None, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
            call["id"] = tc.get("id") or call["id"]
            call["function"]["name"] += tc.get("function", {}).get("name") or ""
            call["function"]["arguments"] += tc.get("function", {}).get("arguments") or ""
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


async def post_chat(proxy: Any, body: dict[str, Any], headers: dict[str, str] | None = None,
                    path: str = "/v1/chat/completions") -> tuple[Any, dict[str, Any]]:
    resp = await proxy.post(path, data=orjson.dumps(body), headers={**AUTH, **(headers or {})})
    raw = await resp.read()
    if body.get("stream") and resp.status == 200:
        return resp, assemble(sse_events(raw))
    return resp, orjson.loads(raw)


async def log_of(proxy: Any, session: str, tenant: str = TENANT) -> list[Any]:
    return await read_log(proxy.app[store_key], SessionKey(tenant, session))


async def test_non_streaming_forwards_every_field_and_relays_the_answer(proxy, fake: FakeUpstream) -> None:
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "response_format": {"type": "text"}, "max_tokens": 55, "some_future_field": {"nested": [1, 2]}}
    resp, answer = await post_chat(proxy, body, {"X-Session-Id": "s1"})
    assert resp.status == 200
    assert fake.bodies == [orjson.dumps(body)], "byte for byte: the upstream is not one known to take added fields"
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "run_shell"
    assert resp.headers["X-Session-Id"] == "s1"
    assert resp.headers["X-Ctxproxy-Compacted"] == "none"
    assert int(resp.headers["X-Ctxproxy-View-Tokens"]) >= 0
    assert fake.headers[0]["Authorization"] == "Bearer sk-test-key"
    facts = await log_of(proxy, "s1")
    assert [(f.seq, f.kind, f.index, f.source) for f in facts] == [(0, "message", 0, "client"),
                                                                   (1, "message", 1, "upstream")]
    assert facts[1].message == answer["choices"][0]["message"]
    assert facts[1].extra["usage"] == answer["usage"]


async def test_stream_relays_events_and_hides_the_usage_chunk_it_asked_for(make_proxy, fake: FakeUpstream) -> None:
    proxy = await make_proxy(add_fields="always")
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "tell me a story"}]}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={**AUTH, "X-Session-Id": "st"})
    raw = await resp.read()
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    assert all(e == "[DONE]" or e["choices"] for e in events), "usage-only chunk leaked to the client"
    assert fake.requests[0]["stream_options"] == {"include_usage": True}
    facts = await log_of(proxy, "st")
    reply = facts[-1]
    assert reply.source == "upstream" and reply.message is not None
    assert reply.message["content"] == assemble(events)["content"]
    assert reply.extra["usage"]["completion_tokens"] == 7
    assert "partial" not in reply.extra


async def test_stream_keeps_the_usage_chunk_a_client_asked_for(proxy, fake: FakeUpstream) -> None:
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}]}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body), headers=AUTH)
    events = sse_events(await resp.read())
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 7
    assert fake.bodies == [orjson.dumps(body)], "the client's stream_options, as it sent them"


async def test_stream_assembles_parallel_tool_calls_and_unknown_fields(proxy, fake: FakeUpstream) -> None:
    calls = [{"id": f"call_{i}", "type": "function",
              "function": {"name": f"tool_{i}", "arguments": orjson.dumps({"arg": "x" * (i + 7)}).decode()}}
             for i in range(3)]
    fake.script.append(Reply(content=None, tool_calls=calls, extra={"reasoning_content": "thinking hard"}))
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}], "tools": TOOLS}
    _resp, message = await post_chat(proxy, body, {"X-Session-Id": "par"})
    assert message["tool_calls"] == calls
    facts = await log_of(proxy, "par")
    assert facts[-1].message == {"role": "assistant", "content": "", "tool_calls": calls,
                                 "reasoning_content": "thinking hard"}


@pytest.mark.parametrize("stream_every", [1, 2, 3])
async def test_forty_step_tool_session_replays_exactly(proxy, fake: FakeUpstream, stream_every: int) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Fix the failing test."}]
    for step in range(40):
        body = {"model": "m", "messages": messages, "tools": TOOLS, "stream": step % stream_every == 0}
        resp, answer = await post_chat(proxy, body, {"X-Session-Id": "long"})
        assert resp.status == 200
        reply = answer if body["stream"] else answer["choices"][0]["message"]
        messages.append(reply)
        if reply.get("tool_calls"):
            for call in reply["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"output of step {step}"})
        else:
            messages.append({"role": "user", "content": f"Now step {step}."})
    facts = await log_of(proxy, "long")
    assert [f.seq for f in facts] == list(range(len(facts)))
    assert all(f.kind == "message" for f in facts), "a resent conversation must never look like an edit"
    assert len(facts) == len(messages) - 1  # the last user message was never sent
    assert same_conversation(replay(facts), messages[:-1])
    assert {f.source for f in facts if f.message and f.message["role"] == "assistant"} == {"upstream"}


async def test_openai_sdk_round_trip_logs_each_message_once(proxy, fake: FakeUpstream) -> None:
    import openai

    sdk = openai.AsyncOpenAI(base_url=str(proxy.make_url("/s/sdk-run/v1")), api_key="sk-test-key", max_retries=0)
    messages: list[Any] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "start"}]
    try:
        for step in range(6):
            if step % 2:
                stream = await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True)
                content, calls = "", {}
                async for chunk in stream:
                    if not chunk.choices:
                        continue
                    delta = chunk.choices[0].delta
                    content += delta.content or ""
                    for tc in delta.tool_calls or []:
                        entry = calls.setdefault(tc.index, {"id": tc.id, "type": "function",
                                                            "function": {"name": tc.function.name, "arguments": ""}})
                        entry["function"]["arguments"] += tc.function.arguments or ""
                reply: dict[str, Any] = {"role": "assistant", "content": content or None}
                if calls:
                    reply["tool_calls"] = [calls[i] for i in sorted(calls)]
            else:
                completion = await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)
                reply = completion.choices[0].message.model_dump(exclude_none=True)
            messages.append(reply)
            for call in reply.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
            if not reply.get("tool_calls"):
                messages.append({"role": "user", "content": f"next {step}"})
    finally:
        await sdk.close()
    facts = await log_of(proxy, "sdk-run")
    assert all(f.kind == "message" for f in facts)
    assert same_conversation(replay(facts), messages[:-1])


async def test_retry_regenerate_and_edit_produce_rewinds(proxy, fake: FakeUpstream) -> None:
    base = [{"role": "user", "content": "one"}]
    _, a1 = await post_chat(proxy, {"model": "m", "messages": base}, {"X-Session-Id": "rw"})
    first = a1["choices"][0]["message"]
    conv = [*base, first, {"role": "user", "content": "two"}]
    _, a2 = await post_chat(proxy, {"model": "m", "messages": conv}, {"X-Session-Id": "rw"})
    # Retry / regenerate the same request: the old reply is abandoned, the new one logged.
    _, a3 = await post_chat(proxy, {"model": "m", "messages": conv}, {"X-Session-Id": "rw"})
    # Edit in the middle: the first user message changes.
    edited = [{"role": "user", "content": "one, edited"}]
    _, a4 = await post_chat(proxy, {"model": "m", "messages": edited}, {"X-Session-Id": "rw"})
    facts = await log_of(proxy, "rw")
    shape = [(f.kind, f.index, f.source) for f in facts]
    assert shape == [
        ("message", 0, "client"), ("message", 1, "upstream"),
        ("message", 2, "client"), ("message", 3, "upstream"),
        ("rewind", 3, "client"), ("message", 3, "upstream"),
        ("rewind", 0, "client"), ("message", 0, "client"), ("message", 1, "upstream"),
    ]
    assert same_conversation(replay(facts), [*edited, a4["choices"][0]["message"]])
    assert facts[3].message == a2["choices"][0]["message"]  # the abandoned reply stays in the log
    assert facts[5].message == a3["choices"][0]["message"]  # the regenerated one follows the rewind


async def test_echo_with_cosmetic_differences_is_recognised(proxy, fake: FakeUpstream) -> None:
    fake.script.append(Reply(content=None, tool_calls=[{"id": "c1", "type": "function",
                                                        "function": {"name": "f", "arguments": '{"a": 1, "b": 2}'}}]))
    _, answer = await post_chat(proxy, {"model": "m", "messages": [{"role": "user", "content": "x"}]},
                                {"X-Session-Id": "cos"})
    echoed = {"tool_calls": [{"function": {"arguments": '{"b":2,"a":1}', "name": "f"}, "id": "c1"}],
              "role": "assistant", "content": ""}
    conv = [{"role": "user", "content": [{"type": "text", "text": "x  "}]}, echoed,
            {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    await post_chat(proxy, {"model": "m", "messages": conv}, {"X-Session-Id": "cos"})
    facts = await log_of(proxy, "cos")
    assert [(f.kind, f.index, f.source) for f in facts] == [
        ("message", 0, "client"), ("message", 1, "upstream"), ("message", 2, "client"), ("message", 3, "upstream")]
    assert facts[1].message == answer["choices"][0]["message"]


async def test_client_disconnect_cancels_upstream_and_logs_partial(proxy, fake: FakeUpstream) -> None:
    release = asyncio.Event()
    fake.script.append(Reply(content="a long answer that never finishes", pause_after=3, hang=release))
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body), headers={**AUTH, "X-Session-Id": "dc"})
    await resp.content.readuntil(b"\n\n")
    await asyncio.wait_for(fake.paused.wait(), 10)
    resp.close()
    await asyncio.wait_for(fake.stream_aborted.wait(), 10)
    store = proxy.app[store_key]
    for _ in range(500):
        facts = await read_log(store, SessionKey(TENANT, "dc"))
        if len(facts) == 2:
            break
        await asyncio.sleep(0.01)
    assert facts[-1].extra.get("partial") is True
    assert facts[-1].message is not None and facts[-1].message["content"].startswith("a lo")
    release.set()


async def test_upstream_error_is_relayed_byte_for_byte(proxy, fake: FakeUpstream) -> None:
    raw = b'{"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}'
    fake.script.append(Reply(error=(429, raw, "application/json")))
    resp = await proxy.post("/v1/chat/completions", headers=AUTH,
                            data=orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                               "stream": True}))
    assert resp.status == 429
    assert await resp.read() == raw

