"""Bad input gets an OpenAI-shaped 4xx, never a 500; upstream failures get 502/504."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.app import create_app
from proxy.errors import BadRequest
from proxy.keys import store_key
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakeupstream import Reply
from tests.proxyfixtures import read_log


def assert_openai_error(body: dict, status_type: str) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == status_type
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


@pytest.mark.parametrize(("raw", "param"), [
    (b"{not json", None),
    (b"\xff\xfe\x00garbage", None),
    (b"[1, 2, 3]", None),
    (b'{"model": "m"}', "messages"),
    (b'{"model": "m", "messages": {"role": "user"}}', "messages"),
    (b'{"model": "m", "messages": []}', "messages"),
    (b'{"model": "m", "messages": ["hello"]}', "messages[0]"),
    (b'{"model": "m", "messages": [{"content": "no role"}]}', "messages[0]"),
    (b"[" * 5000 + b"]" * 5000, None),
])
async def test_malformed_bodies_get_400(proxy, fake, raw: bytes, param: str | None) -> None:
    resp = await proxy.post("/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    body = await resp.json()
    assert_openai_error(body, "invalid_request_error")
    assert body["error"]["param"] == param
    assert fake.requests == []


async def test_body_over_the_limit_gets_413(make_proxy, fake) -> None:
    proxy = await make_proxy(max_body_bytes=4096)
    big = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 10_000}]})
    resp = await proxy.post("/v1/chat/completions", data=big)
    assert resp.status == 413
    assert_openai_error(await resp.json(), "invalid_request_error")

    async def chunks():
        for _ in range(10):
            yield b"x" * 1000

    resp = await proxy.post("/v1/chat/completions", data=chunks())  # chunked: no Content-Length to check
    assert resp.status == 413
    assert fake.requests == []


@pytest.mark.parametrize("headers,path", [
    ({"X-Session-Id": "bad id with spaces"}, "/v1/chat/completions"),
    ({"X-Session-Id": "x" * 129}, "/v1/chat/completions"),
    ({}, "/s/bad%20id/v1/chat/completions"),
    ({}, "/s/" + "y" * 129 + "/v1/chat/completions"),
])
async def test_bad_session_ids_get_400(proxy, headers, path) -> None:
    resp = await proxy.post(path, data=orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                            headers=headers)
    assert resp.status == 400
    assert_openai_error(await resp.json(), "invalid_request_error")


async def test_client_keys_are_enforced(make_proxy, fake) -> None:
    proxy = await make_proxy(client_keys=("good-key",))
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = await proxy.post("/v1/chat/completions", data=body, headers=headers)
        assert resp.status == 401
        assert_openai_error(await resp.json(), "authentication_error")
    resp = await proxy.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    assert resp.status == 401
    resp = await proxy.post("/v1/chat/completions", data=body, headers={"Authorization": "Bearer good-key"})
    assert resp.status == 200
    assert len(fake.requests) == 1


async def test_unknown_route_is_an_openai_404(proxy) -> None:
    resp = await proxy.get("/nowhere")
    assert resp.status == 404
    assert_openai_error(await resp.json(), "not_found_error")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_upstream_is_502(aiohttp_client, tmp_path) -> None:
    settings = Settings(upstream=f"http://127.0.0.1:{_closed_port()}/v1", store=f"sqlite:///{tmp_path}/f.db")
    proxy = await aiohttp_client(create_app(settings))
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    resp = await proxy.post("/v1/chat/completions", data=body)
    assert resp.status == 502
    assert_openai_error(await resp.json(), "upstream_error")
    resp = await proxy.get("/v1/models")
    assert resp.status == 502


async def test_hung_upstream_is_504(make_proxy, fake) -> None:
    proxy = await make_proxy(upstream_timeout=0.2)
    never = asyncio.Event()
    fake.script.append(Reply(content="late", hang=never))
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    resp = await proxy.post("/v1/chat/completions", data=body)
    assert resp.status == 504
    body_json = await resp.json()
    assert_openai_error(body_json, "upstream_error")
    assert body_json["error"]["code"] == "upstream_timeout"
    never.set()


async def test_health_and_readiness(proxy) -> None:
    assert (await proxy.get("/healthz")).status == 200
    assert (await proxy.get("/readyz")).status == 200


@pytest.mark.parametrize("depth", [252, 253, 254, 300])
async def test_tool_call_arguments_nested_past_what_orjson_writes_are_served_and_logged(proxy, fake, depth) -> None:
    """Arguments are a string to the API: nested as deep as orjson reads, they are hashed as text, never a 500."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "[" * depth + "]" * depth}}
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "done"}]
    session = {"X-Session-Id": f"deep-args-{depth}"}
    resp = await proxy.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers=session)
    assert resp.status == 200, await resp.text()
    messages.append((await resp.json())["choices"][0]["message"])
    messages.append({"role": "user", "content": "next"})
    resp = await proxy.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers=session)
    assert resp.status == 200, await resp.text()
    facts = await read_log(proxy.app[store_key], SessionKey("anonymous", f"deep-args-{depth}"))
    assert [(f.kind, f.index) for f in facts] == [("message", i) for i in range(6)], "recognised again: no rewind"
    assert facts[1].message == messages[1]


async def test_an_error_after_the_response_started_closes_the_connection(aiohttp_client, upstream, tmp_path) -> None:
    """Never a second response inside a started one: the client sees the body cut at once, not garbage to wait on."""
    app = create_app(Settings(upstream=str(upstream.make_url("/v1")), store=f"sqlite:///{tmp_path}/f.db"))

    async def breaks(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if request.query.get("write"):
            await resp.write(b"data: first\n\n")
        raise RuntimeError("fails mid-stream") if request.query.get("crash") else BadRequest("too late to say so")

    app.router.add_get("/test/breaks", breaks)
    proxy = await aiohttp_client(app)
    for query in ("write=1&crash=1", "write=1", "crash=1", ""):
        reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
        writer.write(f"GET /test/breaks?{query} HTTP/1.1\r\nHost: proxy\r\n\r\n".encode())
        received = await asyncio.wait_for(reader.read(), 10)  # to EOF: the proxy closes the connection
        writer.close()
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"HTTP/1.1" not in body, (query, received)
        assert body == (b"d\r\ndata: first\n\n\r\n" if "write" in query else b""), "one chunk, and no final one"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/s/slow/v1/embeddings"])
async def test_a_body_trickled_past_the_client_timeout_gets_408_and_the_connection_closes(make_proxy, fake,
                                                                                          path) -> None:
    """A byte every 50 ms never lets a connection idle, yet the body as a whole must arrive in time."""
    proxy = await make_proxy(client_timeout=0.5)
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                 "Content-Length: 100000\r\n\r\n{".encode())

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):  # until cancelled, or the proxy closes the connection
            while True:
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.05)  # the pace of the trickle, not a wait for anything

    trickling = asyncio.create_task(trickle())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        found = re.search(rb"\r\nContent-Length: (\d+)\r\n", head)
        assert found is not None, head
        body = await asyncio.wait_for(reader.readexactly(int(found[1])), 30)
        # Closed as the answer went out, while the client still trickles: not left open for aiohttp to read the
        # rest of the body (its lingering close, 10 s).
        assert [handler.transport for handler in proxy.server.runner.server.connections] in ([], [None])
        with contextlib.suppress(ConnectionResetError):  # a byte of the trickle may have met the closed socket
            assert await asyncio.wait_for(reader.read(), 30) == b""
    finally:
        trickling.cancel()
    writer.close()
    assert head.startswith(b"HTTP/1.1 408 ") and b"\r\nConnection: close\r\n" in head, head
    error = orjson.loads(body)
    assert_openai_error(error, "invalid_request_error")
    assert error["error"]["code"] == "request_timeout"
    assert fake.requests == []


async def status_of_headers_only(host: str, port: int, head: list[str]) -> bytes:
    """Send a request head announcing a 1 TB body and no body at all; the status line the proxy answers with."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(("\r\n".join([*head, "Host: proxy", f"Content-Length: {10**12}"]) + "\r\n\r\n").encode())
        return await asyncio.wait_for(reader.readline(), 30)
    finally:
        writer.close()


async def test_client_keys_are_checked_before_the_body_is_read(make_proxy, fake) -> None:
    """An unknown caller gets 401 for anything it sends: nothing of its body is read, parsed or measured."""
    proxy = await make_proxy(client_keys=("good-key",), max_body_bytes=4096)
    for path in ("/v1/chat/completions", "/s/s1/v1/chat/completions", "/v1/embeddings", "/s/s1/v1/files"):
        for wrong in ([], ["Authorization: Bearer wrong"], ["api-key: wrong"]):
            status_line = await status_of_headers_only(proxy.host, proxy.port, [f"POST {path} HTTP/1.1", *wrong])
            assert status_line.split()[1] == b"401", (path, wrong, status_line)
        for body in (b"{not json", b"x" * 10_000):
            resp = await proxy.post(path, data=body, headers={"Authorization": "Bearer wrong"})
            assert resp.status == 401, (path, body[:10])
            assert_openai_error(await resp.json(), "authentication_error")
    resp = await proxy.get("/nowhere")
    assert resp.status == 401, "no key, no map of the routes"
    for open_path in ("/healthz", "/readyz", "/metrics"):
        assert (await proxy.get(open_path)).status == 200
    for header, value in (("Authorization", "Bearer good-key"), ("api-key", "good-key"), ("x-api-key", "good-key")):
        resp = await proxy.post("/v1/chat/completions", data=b"{not json", headers={header: value})
        assert resp.status == 400, header  # the key is good: now the body is read, and refused
    assert fake.requests == []


@pytest.mark.parametrize("session", ["deep-later", None])
async def test_an_item_nested_past_what_orjson_writes_is_a_400_in_any_request_of_a_session(proxy, fake,
                                                                                           session) -> None:
    """Items are checked when they are new to the session (not on every step): a deep one in a later request
    is refused as in the first, with or without a session header (the fingerprint hashes the first messages)."""
    headers = {"Authorization": "Bearer sk-deep", "Content-Type": "application/json",
               **({"X-Session-Id": session} if session else {})}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    resp = await proxy.post("/v1/chat/completions", data=json.dumps({"model": "m", "messages": messages}),
                            headers=headers)
    assert resp.status == 200
    messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "x", "metadata": deep(300)}]
    resp = await proxy.post("/v1/chat/completions", data=json.dumps({"model": "m", "messages": messages}),
                            headers=headers)
    assert resp.status == 400, await resp.text()
    assert (await resp.json())["error"]["code"] == "invalid_json"
    first = [{"role": "user", "content": [{"type": "text", "text": "y"}, {"type": "data", "value": deep(300)}]}]
    resp = await proxy.post("/v1/chat/completions", data=json.dumps({"model": "m", "messages": first}),
                            headers=headers)
    assert resp.status == 400


def deep(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value
