"""The recording tap on its own: it forwards unchanged and records what went each way."""

from __future__ import annotations

import orjson

from tests.fakemessages import FakeMessages
from tests.tap import Tap

BODY = {"model": "claude-opus-5-5", "max_tokens": 100, "stream": True,
        "messages": [{"role": "user", "content": "Go."}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}


async def test_a_streamed_answer_and_an_error_pass_through_and_are_recorded(aiohttp_server, aiohttp_client) -> None:
    fake = FakeMessages()
    upstream = await aiohttp_server(fake.app())
    tap = Tap(str(upstream.make_url("")))
    client = await aiohttp_client(tap.app())
    raw = orjson.dumps(BODY)
    resp = await client.post("/v1/messages?beta=true", data=raw,
                             headers={"X-Claude-Code-Session-Id": "s1", "anthropic-version": "2023-06-01"})
    received = await resp.read()
    missing = await client.get("/v1/nothing")

    assert (resp.status, resp.headers["Content-Type"], missing.status) == (200, "text/event-stream", 404)
    first, second = tap.exchanges
    assert (first.method, first.path_qs, first.body, first.json()) == ("POST", "/v1/messages?beta=true", raw, BODY)
    assert (first.status, first.response) == (200, received)
    assert first.response_headers["content-type"] == "text/event-stream"
    assert (second.method, second.path_qs, second.status) == ("GET", "/v1/nothing", 404)
    turn = fake.requests[0]
    assert (turn.path, turn.query, turn.body) == ("/v1/messages", {"beta": "true"}, BODY)
    assert (turn.headers["X-Claude-Code-Session-Id"], turn.headers["anthropic-version"]) == ("s1", "2023-06-01")
    assert turn.headers["Host"] == f"{upstream.host}:{upstream.port}"
