"""Each door answers the proxy's own errors in its API's shape: Anthropic's on /v1/messages, OpenAI's elsewhere."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.app import create_app
from proxy.dialects import CHAT, MESSAGES, RESPONSES
from proxy.http.middleware import door_of
from proxy.settings import Secret, Settings
from tests.test_errors import _closed_port, assert_openai_error

ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                   408: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
                   502: "api_error"}
MESSAGES_PATHS = ["/v1/messages", "/s/run-1/v1/messages", "/v1/messages/count_tokens", "/v1/messages/batches"]
OPENAI_PATHS = ["/v1/chat/completions", "/s/run-1/v1/responses", "/v1/responses/compact", "/v1/embeddings"]
BODY = orjson.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                     "input": [{"role": "user", "content": "x"}]})


def assert_anthropic_error(body: dict[str, Any], status: int) -> None:
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == ANTHROPIC_TYPES[status]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def assert_door_error(path: str, status: int, body: dict[str, Any]) -> None:
    if path in MESSAGES_PATHS:
        assert_anthropic_error(body, status)
    else:
        assert_openai_error(body, body["error"]["type"])


@pytest.mark.parametrize("path", MESSAGES_PATHS + OPENAI_PATHS)
async def test_every_error_the_proxy_makes_takes_the_doors_shape(aiohttp_client, tmp_path: Path, path: str) -> None:
    closed = f"http://127.0.0.1:{_closed_port()}"
    proxy = await aiohttp_client(create_app(Settings(
        upstream=closed + "/v1", anthropic_upstream=closed, store=f"sqlite:///{tmp_path}/f.db",
        client_keys=(Secret("good"),), max_body_bytes=4096)))
    good = {"Authorization": "Bearer good", "x-api-key": "good"}
    passthrough = path.endswith(("/batches", "/embeddings"))  # the proxy does not read the body
    cases = [
        (path, 401, {"Authorization": "Bearer wrong"}, BODY),
        (path, 400, good, None if passthrough else b"{not json"),
        ("/s/no%20spaces" + path.removeprefix("/s/run-1"), 400, good, BODY),
        (path, 413, good, b"x" * 10_000),
        (path, 502, good, BODY),
    ]
    for url, status, headers, body in cases:
        if body is not None:
            resp = await proxy.post(url, data=body, headers=headers)
            assert resp.status == status, (url, status, await resp.text())
            assert_door_error(path, status, await resp.json())


async def test_the_messages_door_answers_a_timeout_in_its_shape(make_proxy) -> None:
    proxy = await make_proxy(client_timeout=0.2)
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nContent-Length: 100\r\n\r\n{")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    body = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    assert head.startswith(b"HTTP/1.1 408 ")
    assert_anthropic_error(orjson.loads(body), 408)


def test_a_path_belongs_to_the_door_it_is_at_or_under() -> None:
    assert [door_of(p) for p in ("/v1/messages", "/s/a/v1/messages/count_tokens", "/v1/messages/batches/b1",
                                 "/v1/chat/completions", "/s/a:b/v1/responses/compact", "/v1/responses")] == [
        MESSAGES, MESSAGES, MESSAGES, CHAT, RESPONSES, RESPONSES]
    for path in ("/v1/messagesx", "/v1/models", "/admin/sessions", "/ui", "/s/", "/s/a", "/", ""):
        assert door_of(path) is None, path

