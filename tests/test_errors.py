"""Bad input gets an OpenAI-shaped 4xx, never a 500; upstream failures get 502/504."""

from __future__ import annotations

import asyncio
import socket

import orjson
import pytest

from proxy.app import create_app
from proxy.settings import Settings
from tests.fakeupstream import Reply


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
