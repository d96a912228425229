"""Upstream faults: errors are relayed as sent and never retried; silence and resets end in 504 or a cut stream.

The proxy retries only what it owns (a prompt-too-long refusal it can compact
away). A 429 or a 5xx belongs to the client, whose SDK has its own retry
policy: it must arrive unchanged, status, body and headers such as
``Retry-After``, and the upstream must have been asked exactly once.
"""

from __future__ import annotations

import asyncio
import gzip
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import brotli
import orjson
import pytest
from aiohttp import web

from proxy.app import create_app
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import read_log, replay, same_conversation
from tests.test_outage import metric

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

API_KEY = "sk-faults"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TENANT = tenant_of(API_KEY)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ERROR_HEADERS = {"Retry-After": "7", "x-ratelimit-remaining-requests": "0", "x-request-id": "req_abc123",
                 "openai-processing-ms": "12"}


class FaultyUpstream(FakeUpstream):
    """The fake upstream, plus raw scripted handlers (any status, headers, or a dropped connection)."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: deque[Handler] = deque()
        self.passthrough_requests = 0

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_route("*", "/v1/faulty/{tail:.*}", self.faulty)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if self.raw:
            self.requests.append(await request.json(loads=orjson.loads))
            return await self.raw.popleft()(request)
        return await super().chat(request)

    async def faulty(self, request: web.Request) -> web.StreamResponse:
        self.passthrough_requests += 1
        return await self.raw.popleft()(request)


def error_reply(status: int, body: bytes, content_type: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, body=body, headers={**ERROR_HEADERS, "Content-Type": content_type})

    return handler


async def drop_connection(request: web.Request) -> web.StreamResponse:
    """Reset: the upstream closes the socket without a response."""
    assert request.transport is not None
    request.transport.close()
    return web.Response()


@pytest.fixture
def fake() -> FaultyUpstream:
    return FaultyUpstream()


async def post(proxy: Any, session: str, *, stream: bool, content: str = "hi") -> Any:
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": content}]}
    return await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={**AUTH, "X-Session-Id": session})


async def read_cut_stream(resp: Any) -> bytes:
    """Read a stream the proxy must cut: it ends in a payload error, never a clean end with [DONE]."""
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async for chunk in resp.content.iter_any():
            received += chunk
    assert b"[DONE]" not in received
    return received


async def log_of(proxy: Any, session: str) -> list[Any]:
    return await read_log(proxy.app[store_key], SessionKey(TENANT, session))


async def until_logged(proxy: Any, session: str, count: int) -> list[Any]:
    """The partial reply is logged as the relay unwinds, which may trail the client's view of the cut."""
    for _ in range(500):
        facts = await log_of(proxy, session)
        if len(facts) >= count:
            return facts
        await asyncio.sleep(0.01)
    raise AssertionError(f"log of {session} never reached {count} facts: {facts}")


@pytest.mark.parametrize("status", [429, 500, 502, 503, 529])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_rate_limits_and_server_errors_are_relayed_unchanged_and_not_retried(
        proxy, fake: FaultyUpstream, status: int, stream: bool) -> None:
    raw = orjson.dumps({"error": {"message": f"upstream says {status}", "type": "server_error", "code": None}})
    fake.raw.append(error_reply(status, raw, "application/json"))
    resp = await post(proxy, f"err-{status}-{stream}", stream=stream)
    assert resp.status == status
    assert await resp.read() == raw
    for name, value in ERROR_HEADERS.items():
        assert resp.headers.get(name) == value, name
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.headers["X-Session-Id"] == f"err-{status}-{stream}"
    assert len(fake.requests) == 1, "the proxy retried a request the client did not retry"
    assert fake.summary_requests == []
    facts = await log_of(proxy, f"err-{status}-{stream}")
    assert all(f.source != "upstream" for f in facts), "an error is not a reply to log"


async def test_non_json_error_pages_are_relayed_byte_for_byte(proxy, fake: FaultyUpstream) -> None:
    page = b"<html><body><h1>502 Bad Gateway</h1>\xc3\xa9</body></html>\n"
    fake.raw.append(error_reply(502, page, "text/html; charset=utf-8"))
    fake.raw.append(error_reply(503, b"", "text/plain"))
    first = await post(proxy, "html", stream=True)
    assert (first.status, await first.read(), first.headers["Content-Type"]) == (502, page, "text/html; charset=utf-8")
    second = await post(proxy, "empty", stream=False)
    assert (second.status, await second.read(), second.headers["Retry-After"]) == (503, b"", "7")
    assert len(fake.requests) == 2


async def test_passthrough_errors_are_relayed_unchanged_and_not_retried(proxy, fake: FaultyUpstream) -> None:
    raw = b'{"error": {"message": "slow down", "type": "requests"}}'
    fake.raw.append(error_reply(429, raw, "application/json"))
    resp = await proxy.post("/v1/faulty/embeddings", data=b'{"input": "x"}', headers=AUTH)
    assert (resp.status, await resp.read()) == (429, raw)
    assert resp.headers["Retry-After"] == "7" and resp.headers["x-request-id"] == "req_abc123"
    assert fake.passthrough_requests == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_an_upstream_silent_before_headers_gets_504(make_proxy, fake: FaultyUpstream, stream: bool) -> None:
    proxy = await make_proxy(upstream_timeout=0.3)
    never = asyncio.Event()
    fake.script.append(Reply(content="too late", hang=never))
    try:
        resp = await post(proxy, f"silent-{stream}", stream=stream)
        assert resp.status == 504
        body = await resp.json()
        assert body["error"]["code"] == "upstream_timeout" and body["error"]["type"] == "upstream_error"
        assert len(fake.requests) == 1
    finally:
        never.set()


async def test_a_stream_that_stalls_midway_is_cut_and_its_partial_reply_logged(make_proxy,
                                                                              fake: FaultyUpstream) -> None:
    proxy = await make_proxy(upstream_timeout=0.3)
    never = asyncio.Event()
    fake.script.append(Reply(content="a long answer that stalls after a few words", pause_after=4, hang=never))
    try:
        resp = await post(proxy, "stall", stream=True)
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        received = await read_cut_stream(resp)
        assert b'"content":"a lon"' in received, "the events before the stall were relayed"
        facts = await until_logged(proxy, "stall", 2)
    finally:
        never.set()
    reply = facts[-1]
    assert (reply.kind, reply.source, reply.extra.get("partial")) == ("message", "upstream", True)
    assert reply.message == {"role": "assistant", "content": "a long answer t"}  # the 3 content events relayed
    assert len(fake.requests) == 1


@pytest.mark.parametrize("cut_after", [2, 5])
async def test_a_reset_mid_stream_ends_the_client_stream_and_logs_the_partial_reply(
        proxy, fake: FaultyUpstream, cut_after: int) -> None:
    call = {"id": "call_9", "type": "function",
            "function": {"name": "run_shell", "arguments": orjson.dumps({"cmd": "ls -la /srv/app"}).decode()}}
    fake.script.append(Reply(content="Listing.", tool_calls=[call], cut_after=cut_after))
    session = f"reset-{cut_after}"
    resp = await post(proxy, session, stream=True, content="list it")
    assert resp.status == 200
    await read_cut_stream(resp)
    facts = await until_logged(proxy, session, 2)
    reply = facts[-1]
    assert (reply.source, reply.extra.get("partial")) == ("upstream", True)
    assert reply.message is not None and reply.message["role"] == "assistant"
    assert reply.message != {"role": "assistant", "content": "Listing.", "tool_calls": [call]}, "it was cut"
    assert len(fake.requests) == 1

    # The client retries the step: the partial reply is rewound and the whole new one logged in its place.
    fake.script.append(Reply(content="Listing again."))
    retry = await post(proxy, session, stream=False, content="list it")
    answer = (await retry.json())["choices"][0]["message"]
    facts = await log_of(proxy, session)
    assert [(f.kind, f.index) for f in facts[2:]] == [("rewind", 1), ("message", 1)]
    assert same_conversation(replay(facts), [{"role": "user", "content": "list it"}, answer])
    assert "partial" not in facts[-1].extra


async def test_a_reset_before_any_response_is_502(proxy, fake: FaultyUpstream) -> None:
    fake.raw.append(drop_connection)
    resp = await post(proxy, "reset-early", stream=False)
    assert resp.status == 502
    assert (await resp.json())["error"]["type"] == "upstream_error"
    assert len(fake.requests) == 1, "a reset is reported, not retried"


async def test_a_passthrough_stream_that_stalls_is_cut_not_completed(make_proxy, fake: FaultyUpstream) -> None:
    proxy = await make_proxy(upstream_timeout=0.3)
    never = asyncio.Event()

    async def stalls(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        await resp.write(b"first part;")
        await never.wait()  # released at the end of the test
        return resp

    fake.raw.append(stalls)
    try:
        resp = await proxy.get("/v1/faulty/files/big/content", headers=AUTH)
        assert resp.status == 200
        received = b""
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in resp.content.iter_any():
                received += chunk
        assert received == b"first part;"
        assert fake.passthrough_requests == 1
    finally:
        never.set()


# ---- replies the log cannot encode --------------------------------------------------------------------------------

DEEP_ARGUMENTS = "[" * 300 + "]" * 300  # a JSON value orjson reads (up to 1024 levels) but cannot write (254)


def deep_reply(stream: bool) -> tuple[Handler, bytes]:
    """A reply whose tool-call arguments are an object nested 300 levels, as raw bytes: nothing here can write it."""
    call = ('{"index":0,"id":"call_deep","type":"function","function":{"name":"f","arguments":'
            + DEEP_ARGUMENTS + "}}")
    if stream:
        head = '{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
        raw = (b"data: " + (head + '{"role":"assistant","tool_calls":[' + call + ']},"finish_reason":null}]}').encode()
               + b"\n\ndata: " + (head + '{},"finish_reason":"tool_calls"}]}').encode() + b"\n\ndata: [DONE]\n\n")
        content_type = "text/event-stream"
    else:
        raw = ('{"id":"c","object":"chat.completion","choices":[{"index":0,"finish_reason":"tool_calls",'
               '"message":{"role":"assistant","content":null,"tool_calls":[' + call + "]}}]}").encode()
        content_type = "application/json"

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        for start in range(0, len(raw), 100):  # in pieces, as a network delivers it
            await resp.write(raw[start:start + 100])
        await resp.write_eof()
        return resp

    return handler, raw


async def store_errors(proxy: Any) -> float:
    return metric(await (await proxy.get("/metrics")).text(), "ctxproxy_store_errors_total")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_reply_the_log_cannot_encode_reaches_the_client_whole_and_counts_a_store_error(
        proxy, fake: FaultyUpstream, stream: bool) -> None:
    handler, raw = deep_reply(stream)
    fake.raw.append(handler)
    before = await store_errors(proxy)
    resp = await post(proxy, f"deep-{stream}", stream=stream)
    assert resp.status == 200
    assert await resp.read() == raw, "the client gets the upstream's bytes, complete"
    assert await store_errors(proxy) == before + 1
    assert await log_of(proxy, f"deep-{stream}") == [], "nothing half-written, nothing kept to retry"

    # The session goes on: the next step (without the unwritable reply) is served and logged.
    fake.script.append(Reply(content="fine"))
    assert (await post(proxy, f"deep-{stream}", stream=False, content="again")).status == 200
    facts = await log_of(proxy, f"deep-{stream}")
    assert [(f.source, f.message) for f in facts] == [
        ("client", {"role": "user", "content": "again"}), ("upstream", {"role": "assistant", "content": "fine"})]
    assert await store_errors(proxy) == before + 1


# ---- answers the proxy must decode, and answers that are not HTTP ------------------------------------------------

COMPRESSORS = {"br": brotli.compress, "zstd": zstd.compress, "gzip": gzip.compress}


@pytest.mark.parametrize("encoding", sorted(COMPRESSORS))
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_compressed_reply_is_decoded_relayed_and_logged(proxy, fake: FaultyUpstream, encoding: str,
                                                                stream: bool) -> None:
    """The proxy asks for identity, but an upstream may compress anyway: the reply must still be read."""
    message = {"role": "assistant", "content": "packed"}
    if stream:
        chunk = {"id": "c", "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": message, "finish_reason": "stop"}]}
        plain, content_type = b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n", "text/event-stream"
    else:
        completion = {"id": "c", "object": "chat.completion",
                      "choices": [{"index": 0, "finish_reason": "stop", "message": message}]}
        plain, content_type = orjson.dumps(completion), "application/json"

    async def compressed(request: web.Request) -> web.StreamResponse:
        assert request.headers["Accept-Encoding"] == "identity"
        return web.Response(body=COMPRESSORS[encoding](plain),
                            headers={"Content-Type": content_type, "Content-Encoding": encoding})

    fake.raw.append(compressed)
    resp = await post(proxy, f"packed-{encoding}-{stream}", stream=stream)
    assert resp.status == 200
    assert "Content-Encoding" not in resp.headers
    assert await resp.read() == plain
    facts = await log_of(proxy, f"packed-{encoding}-{stream}")
    assert facts[-1].message == message


@pytest.fixture
async def not_http() -> Any:
    """A TCP server that answers every connection with bytes that are not HTTP (an SSH banner, as on a wrong port)."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\nProtocol mismatch.\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


@pytest.mark.parametrize(("method", "path", "stream"), [
    ("POST", "/v1/chat/completions", False), ("POST", "/v1/chat/completions", True), ("GET", "/v1/models", False)])
async def test_an_upstream_that_does_not_speak_http_is_a_502(aiohttp_client, tmp_path, not_http: str, method: str,
                                                             path: str, stream: bool) -> None:
    proxy = await aiohttp_client(create_app(Settings(upstream=not_http, store=f"sqlite:///{tmp_path}/f.db")))
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    resp = await proxy.request(method, path, json=body if method == "POST" else None)
    assert resp.status == 502
    error = (await resp.json())["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_bad_response")
    assert "SSH" not in error["message"], "the upstream's bytes are not echoed"


# ---- an event that never ends ------------------------------------------------------------------------------------

def endless_event(first: bytes, release: asyncio.Event) -> Handler:
    """Stream ``first``, then an event that grows past any limit without its blank line, then hold the connection."""
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(first)
        await resp.write(b'data: {"choices": [{"index": 0, "delta": {"content": "')
        for _ in range(8):
            await resp.write(b"x" * 1024)
        await release.wait()  # the proxy must act on the size, not wait for an end
        return resp

    return handler


async def test_an_event_over_the_limit_before_anything_was_relayed_is_a_502(make_proxy,
                                                                             fake: FaultyUpstream) -> None:
    proxy = await make_proxy(max_event_bytes=4096)
    release = asyncio.Event()
    fake.raw.append(endless_event(b": keep-alive\n\n", release))
    try:
        resp = await post(proxy, "endless-early", stream=True)
        assert resp.status == 502
        error = (await resp.json())["error"]
        assert (error["type"], error["code"]) == ("upstream_error", "upstream_event_too_large")
    finally:
        release.set()
    assert await log_of(proxy, "endless-early") == []


async def test_an_event_over_the_limit_mid_stream_ends_the_stream_and_logs_the_partial_reply(
        make_proxy, fake: FaultyUpstream) -> None:
    proxy = await make_proxy(max_event_bytes=4096)
    release = asyncio.Event()
    first = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hello"}}]}\n\n'
    fake.raw.append(endless_event(first, release))
    try:
        resp = await post(proxy, "endless-late", stream=True)
        assert resp.status == 200
        assert await read_cut_stream(resp) == first
        facts = await until_logged(proxy, "endless-late", 2)
    finally:
        release.set()
    assert (facts[-1].message, facts[-1].extra.get("partial")) == ({"role": "assistant", "content": "Hello"}, True)
