"""An event stream under another content type (the ChatGPT Codex backend sends one) is still a stream.

A real aiohttp upstream streams fixed events under ``application/json``,
``text/plain`` or no content type at all, and stops half-way until the test
lets it go on: the client must get the first events while the upstream is
still stopped (relayed as they arrive, not held back whole), then every byte
as sent, and the reply must be in the log. A JSON body is still a body.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.sse import looks_like_sse
from proxy.store.base import SessionKey
from tests.fakescript import sse
from tests.proxyfixtures import read_log

KEY = "sk-mislabelled"
AUTH = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY, "anthropic-version": "2023-06-01"}
TEXT = "Hello from a mislabelled stream."
#: Guards a read that hangs for good when the proxy holds the stream back whole: a failure, not a measure.
GUARD = 30


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return b"data: " + orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + b"\n\n"


MESSAGE = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": TEXT, "annotations": []}]}
RESPONSE = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "m", "output": []}
#: Per API: (path, the events up to the first one that commits, the rest, the reply the log must hold).
STREAMS: dict[str, tuple[str, list[bytes], list[bytes], dict[str, Any]]] = {
    "chat": ("/v1/chat/completions",
             [b"\xef\xbb\xbf: a comment opens the stream\n\n", chat_chunk({"role": "assistant", "content": ""})],
             [chat_chunk({"content": TEXT[:9]}), chat_chunk({"content": TEXT[9:]}), chat_chunk({}, "stop"),
              b"data: [DONE]\n\n"],
             {"role": "assistant", "content": TEXT}),
    "responses": ("/v1/responses",
                  [sse({"type": "response.created", "response": RESPONSE}),
                   sse({"type": "response.output_item.added", "output_index": 0,
                        "item": {**MESSAGE, "status": "in_progress", "content": []}})],
                  [sse({"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1",
                        "content_index": 0, "delta": TEXT}),
                   sse({"type": "response.output_item.done", "output_index": 0, "item": MESSAGE}),
                   sse({"type": "response.completed", "response": {**RESPONSE, "status": "completed",
                                                                   "output": [MESSAGE]}})],
                  MESSAGE),
    "messages": ("/v1/messages",
                 [sse({"type": "message_start", "message": {"id": "m1", "type": "message", "role": "assistant",
                                                            "content": [], "model": "m", "usage": {
                                                                "input_tokens": 3, "output_tokens": 1}}}),
                  sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})],
                 [sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": TEXT}}),
                  sse({"type": "content_block_stop", "index": 0}),
                  sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}}),
                  sse({"type": "message_stop"})],
                 {"role": "assistant", "content": [{"type": "text", "text": TEXT}]}),
}
REQUESTS = {
    "chat": {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "stream": True, "input": [{"type": "message", "role": "user", "content": "hi"}]},
    "messages": {"model": "m", "stream": True, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
}


class Mislabelled:
    """Streams ``head``, waits for ``gate``, streams ``tail``: under ``content_type`` (None: no Content-Type)."""

    def __init__(self, path: str, head: list[bytes], tail: list[bytes], content_type: str | None) -> None:
        self.path, self.head, self.tail, self.content_type = path, head, tail, content_type
        self.gate = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(self.path, self.stream)
        app.on_response_prepare.append(self.label)
        return app

    async def label(self, request: web.Request, response: web.StreamResponse) -> None:
        if self.content_type is None:  # aiohttp would send application/octet-stream
            response.headers.popall("Content-Type", None)
        else:
            response.headers["Content-Type"] = self.content_type

    async def stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for chunk in self.head:
            await resp.write(chunk)
        await self.gate.wait()
        for chunk in self.tail:
            await resp.write(chunk)
        await resp.write_eof()
        return resp


async def proxy_over(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path,
                     app: web.Application) -> TestClient[Any, Any]:
    upstream: TestServer = await aiohttp_server(app)
    root = str(upstream.make_url("")).rstrip("/")
    client: TestClient[Any, Any] = await aiohttp_client(create_app(Settings(
        upstream=root + "/v1", anthropic_upstream=root, store=f"sqlite:///{tmp_path}/facts.db",
        precompact_threshold=1.0)))
    return client


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", None])
@pytest.mark.parametrize("api", list(STREAMS))
async def test_a_stream_under_another_content_type_is_relayed_as_it_arrives_and_logged(
        aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path, api: str, content_type: str | None) -> None:
    path, head, tail, reply = STREAMS[api]
    upstream = Mislabelled(path, head, tail, content_type)
    proxy = await proxy_over(aiohttp_server, aiohttp_client, tmp_path, upstream.app())
    resp = await asyncio.wait_for(proxy.post(path, data=orjson.dumps(REQUESTS[api]),
                                             headers={**AUTH, "X-Session-Id": api}), GUARD)
    assert resp.status == 200
    first = await asyncio.wait_for(resp.content.readexactly(len(b"".join(head))), GUARD)
    assert first == b"".join(head), "relayed while the upstream is still streaming"
    upstream.gate.set()
    assert first + await resp.read() == b"".join(head + tail), "every event, byte for byte"
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), api))
    assert [(f.source, f.message) for f in facts if f.kind == "message"][-1] == ("upstream", reply)
    assert "partial" not in facts[-1].extra


async def test_a_json_body_to_a_streamed_request_is_still_a_body(aiohttp_server: Any, aiohttp_client: Any,
                                                                 tmp_path: Path) -> None:
    completion = orjson.dumps({"id": "c1", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": TEXT}}]})
    upstream = Mislabelled("/v1/chat/completions", [b"  \n" + completion], [], "application/json")
    upstream.gate.set()
    proxy = await proxy_over(aiohttp_server, aiohttp_client, tmp_path, upstream.app())
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(REQUESTS["chat"]),
                            headers={**AUTH, "X-Session-Id": "body"})
    assert (resp.status, resp.content_type, await resp.read()) == (200, "application/json", b"  \n" + completion)
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "body"))
    assert facts[-1].message == {"role": "assistant", "content": TEXT}


def test_an_event_stream_is_told_by_its_first_bytes() -> None:
    for head in (b"data: {}", b"event: response.created\n", b": keep-alive\n", b"id: 1\n", b"retry: 10\n",
                 b"\xef\xbb\xbfdata:", b" \r\n\n data: x", b"data:"):
        assert looks_like_sse(head) is True, head
    for head in (b'{"id": 1}', b"[1]", b"\n {", b"Internal error", b"dat x", b"\xef\xbb\xbf{"):
        assert looks_like_sse(head) is False, head
    for head in (b"", b"  \n", b"\xef", b"\xef\xbb\xbf", b"da", b"\n ev", b"ret"):
        assert looks_like_sse(head) is None, head
