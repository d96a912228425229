"""Hostile input against a real proxy process: no 5xx of its own, no crash, 413 before the body, bounded memory.

Hypothesis throws random JSON, random bytes, invalid UTF-8, deep nesting,
messages with a wrong type in every field, random session ids (header and URL)
and random credentials at ``ctxproxy serve``. The fake upstream behind it
answers everything (and sends a 5xx only when a body asks for one, marked with
``X-Fake-Upstream``), so any 5xx without that mark is the proxy's own failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yarl import URL

from tests.fakeupstream import full_summary
from tests.proxyproc import ProxyProcess

FAKE_MARK = "X-Fake-Upstream"
FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# ---- the upstream: answers anything, never fails unless asked ----------------------------------------------------


def completion(stream: bool) -> web.Response:
    if stream:
        chunk = {"id": "f", "object": "chat.completion.chunk", "model": "m",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
        body = b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"
        return web.Response(body=body, content_type="text/event-stream", headers={FAKE_MARK: "1"})
    return web.json_response({"id": "f", "object": "chat.completion", "model": "m",
                              "choices": [{"index": 0, "finish_reason": "stop",
                                           "message": {"role": "assistant", "content": full_summary("ok")}}],
                              "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}},
                             headers={FAKE_MARK: "1"})


async def anything(request: web.Request) -> web.Response:
    raw = await request.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict):
        status = body.get("x_fake_status")
        if isinstance(status, int) and 500 <= status < 600:
            return web.json_response({"error": {"message": "fake upstream failure"}}, status=status,
                                     headers={FAKE_MARK: "1"})
    return completion(isinstance(body, dict) and body.get("stream") is True)


@pytest.fixture
async def upstream_url(aiohttp_server: Any) -> str:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", anything)
    server = await aiohttp_server(app)
    return str(server.make_url("/v1"))


StartProxy = Callable[..., Awaitable[ProxyProcess]]


@pytest.fixture
async def start_proxy(upstream_url: str, tmp_path: Path) -> AsyncIterator[StartProxy]:
    started: list[ProxyProcess] = []

    async def start(*args: str) -> ProxyProcess:
        proxy = ProxyProcess(upstream_url, f"sqlite:///{tmp_path}/facts-{len(started)}.db", tmp_path,
                             ["--summary-timeout", "5", "--upstream-timeout", "30", *args])
        started.append(proxy)
        await proxy.start()
        return proxy

    yield start
    for proxy in started:
        proxy.close()


@pytest.fixture
async def fuzz_proxy(start_proxy: StartProxy) -> ProxyProcess:
    # A small window, so fuzzed conversations padded past it go through compaction and the summariser too.
    return await start_proxy("--context-window", "2048", "--min-retain-rounds", "1")


# ---- strategies ----------------------------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
roles = st.sampled_from(["user", "assistant", "system", "developer", "tool", "function", "", "USER"]) | json_values
parts = st.lists(st.fixed_dictionaries({}, optional={"type": json_values | st.sampled_from(["text", "image_url"]),
                                                     "text": json_values, "image_url": json_values}), max_size=3)
calls = st.lists(json_values | st.fixed_dictionaries({}, optional={
    "id": json_values, "type": json_values,
    "function": json_values | st.fixed_dictionaries({}, optional={"name": json_values, "arguments": json_values})}),
    max_size=3)
messages = st.fixed_dictionaries({"role": roles}, optional={
    "content": json_values | parts, "tool_calls": calls | json_values, "name": json_values,
    "tool_call_id": json_values, "function_call": json_values, "refusal": json_values})
PADDING = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"padding {i} " + "lorem ipsum dolor " * 60}
           for i in range(8)]


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = draw(st.fixed_dictionaries({"messages": st.lists(messages, max_size=6) | json_values},
                                                      optional={"model": json_values, "stream": json_values,
                                                                "tools": json_values, "max_tokens": json_values,
                                                                "max_completion_tokens": json_values,
                                                                "stream_options": json_values,
                                                                "x_fake_status": st.sampled_from([500, 503])}))
    if isinstance(body["messages"], list) and draw(st.booleans()):
        body["messages"] = body["messages"] + PADDING  # over the window: the fuzzed messages get summarised
    return body


def deep_body(depth: int) -> bytes:
    """A chat body whose one message content nests ``depth`` levels (objects and arrays alternating).

    Written as text: Python's own json module cannot go this deep.
    """
    opens = ['[' if i % 2 else '{"k": ' for i in reversed(range(depth))]
    closes = [']' if i % 2 else '}' for i in range(depth)]
    inner = "".join(opens) + '"x"' + "".join(closes)
    return ('{"model": "m", "messages": [{"role": "user", "content": ' + inner + '}]}').encode()


raw_bodies = st.one_of(
    st.binary(max_size=600),
    chat_bodies().map(lambda b: json.dumps(b).encode()),
    st.tuples(chat_bodies(), st.binary(min_size=1, max_size=4)).map(  # invalid UTF-8 inside a JSON string
        lambda t: json.dumps(t[0]).encode().replace(b'"role"', b'"r' + t[1].replace(b'"', b"") + b'\xff"', 1)),
    st.integers(min_value=1, max_value=1500).map(lambda d: b"[" * d + b"]" * d),
    st.integers(min_value=200, max_value=1100).map(deep_body),
    st.text(max_size=200).map(lambda t: t.encode("utf-16")),
)
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=160)
headers = st.fixed_dictionaries({}, optional={
    "X-Session-Id": header_text, "Authorization": header_text | header_text.map(lambda t: "Bearer " + t),
    "api-key": header_text, "session-id": header_text, "x-litellm-session-id": header_text,
    "Content-Type": st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded"]),
})
paths = st.one_of(
    st.just("/v1/chat/completions"),
    st.text(max_size=140).map(lambda s: f"/s/{quote(s, safe='')}/v1/chat/completions"),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/?#%"), min_size=1,
            max_size=140).map(lambda s: f"/s/{s}/v1/chat/completions"),
)
requests = st.tuples(paths, headers, raw_bodies)


# ---- the check ------------------------------------------------------------------------------------------------------


async def check(http: aiohttp.ClientSession, proxy: ProxyProcess, request: tuple[str, dict[str, str], bytes]) -> int:
    """Send one hostile request; a 5xx must carry the fake upstream's mark; the proxy's own errors are OpenAI's."""
    path, head, body = request
    data = io.BytesIO(body) if len(body) > 1024 * 1024 else body  # aiohttp warns about large raw bytes
    async with http.post(URL(proxy.url + path, encoded=True), data=data, headers=head) as resp:
        raw = await resp.read()
        status, marked = resp.status, resp.headers.get(FAKE_MARK) == "1"
    assert status < 500 or marked, (status, raw[:300], request)
    if status >= 400 and not marked:
        error = json.loads(raw)["error"]
        assert set(error) == {"message", "type", "param", "code"}, raw[:300]
    assert proxy.alive, proxy.log_tail()
    return status


@FUZZ
@given(request=requests)
async def test_hostile_requests_never_get_a_5xx_of_the_proxys_own(fuzz_proxy: ProxyProcess,
                                                                  request: tuple[str, dict[str, str], bytes]) -> None:
    async with aiohttp.ClientSession(skip_auto_headers=("Content-Type",)) as http:
        await check(http, fuzz_proxy, request)


@FUZZ
@given(body=chat_bodies(), head=headers)
async def test_well_formed_json_with_wrong_types_never_gets_a_5xx(fuzz_proxy: ProxyProcess, body: dict[str, Any],
                                                                  head: dict[str, str]) -> None:
    async with aiohttp.ClientSession() as http:
        await check(http, fuzz_proxy, ("/v1/chat/completions", head, json.dumps(body).encode()))


async def test_deep_nesting_is_a_200_or_a_400_never_a_500(fuzz_proxy: ProxyProcess) -> None:
    statuses = {}
    async with aiohttp.ClientSession() as http:
        for depth in (10, 200, 250, 251, 252, 253, 254, 256, 300, 1000, 1021, 1022, 1023, 1024, 1030, 5000):
            for session in (f"deep-{depth}", None):  # None: the session fingerprint hashes the message too
                head = {"X-Session-Id": session} if session else {}
                statuses[depth] = await check(http, fuzz_proxy, ("/v1/chat/completions", head, deep_body(depth)))
    assert statuses[10] == statuses[200] == 200
    assert statuses[300] == statuses[5000] == 400
    assert set(statuses.values()) == {200, 400}


@pytest.mark.slow
async def test_a_hundred_thousand_tiny_messages(start_proxy: StartProxy) -> None:
    proxy = await start_proxy()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"m{i}"} for i in range(100_000)]})
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as http:
        for attempt in range(2):  # the second time the whole history is already logged
            status = await check(http, proxy, ("/v1/chat/completions", {"X-Session-Id": "huge"}, body.encode()))
            assert status == 200, attempt


async def announce_huge_body(port: int, path: str, expect: bool) -> bytes:
    """Send only headers announcing a 1 TB body; return the final status line the proxy answers with."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = [f"POST {path} HTTP/1.1", "Host: proxy", f"Content-Length: {10**12}",
                "Content-Type: application/json", "Authorization: Bearer sk-big"]
        if expect:
            head.append("Expect: 100-continue")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        await writer.drain()
        while True:
            status_line = await asyncio.wait_for(reader.readline(), 10)
            if not status_line.startswith(b"HTTP/1.1 100"):
                return status_line
            await asyncio.wait_for(reader.readline(), 10)  # the blank line ending the interim response
    finally:
        writer.close()


async def test_a_body_over_the_limit_gets_413_before_it_is_sent(fuzz_proxy: ProxyProcess) -> None:
    """Only headers go out: the answer must come without the proxy waiting for a single body byte."""
    for path in ("/v1/chat/completions", "/s/big/v1/chat/completions", "/v1/embeddings", "/s/big/v1/files"):
        for expect in (False, True):
            status_line = await announce_huge_body(fuzz_proxy.port, path, expect)
            assert status_line.split()[1] == b"413", (path, expect, status_line)
    assert fuzz_proxy.alive


async def test_a_request_head_trickled_past_the_client_timeout_is_closed(start_proxy: StartProxy) -> None:
    """Slow headers: a byte every 50 ms, and the connection is closed once --client-timeout has passed."""
    proxy = await start_proxy("--client-timeout", "1")
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nX-Slow: ")

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):  # until cancelled, or the proxy closes the connection
            while True:
                writer.write(b"z")
                await writer.drain()
                await asyncio.sleep(0.05)  # the pace of the trickle, not a wait for anything

    trickling = asyncio.create_task(trickle())
    try:
        received = await asyncio.wait_for(reader.read(), 30)  # to EOF
    finally:
        trickling.cancel()
        writer.close()
    assert received == b"", "closed without an answer: there is no request to answer"
    assert proxy.alive


# ---- memory --------------------------------------------------------------------------------------------------------


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 2**63 - 1, 2**64, -(2**70), rng.randrange(-1000, 1000)])
    if kind == 3:
        return rng.uniform(-1e308, 1e308)
    if kind in (4, 5):
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x2FFF)])) for _ in
                       range(rng.randrange(40)))
    if kind == 6:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {random_json(rng, 4) or "k": random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def random_message(rng: random.Random) -> Any:
    if rng.random() < 0.1:
        return random_json(rng)
    message: dict[str, Any] = {"role": rng.choice(["user", "assistant", "tool", "system", "x"])
                               if rng.random() < 0.8 else random_json(rng)}
    for field in ("content", "tool_calls", "name", "tool_call_id", "function_call"):
        if rng.random() < (0.9 if field == "content" else 0.2):
            message[field] = random_json(rng) if rng.random() < 0.5 else " ".join(
                rng.choice(PROSE) for _ in range(rng.randrange(200)))
    return message


PROSE = ("alpha", "beta", "parser", "token", "socket", "retry", "commit", "branch", "merge", "cache")


def hostile_request(rng: random.Random, n: int) -> tuple[str, dict[str, str], bytes]:
    """One request of the memory run: as varied as the fuzz strategies, but drawn in microseconds."""
    roll = rng.random()
    if roll < 0.35:
        chat = [random_message(rng) for _ in range(rng.randrange(1, 12))]
        if rng.random() < 0.3:
            chat += PADDING
        body = {"model": random_json(rng) if rng.random() < 0.2 else "m", "stream": rng.random() < 0.3,
                "messages": chat}
        raw = json.dumps(body).encode()
    elif roll < 0.5:
        raw = rng.randbytes(rng.randrange(2000))
    elif roll < 0.6:
        raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
        raw = raw.replace(b'"x"', b'"' + rng.randbytes(8).replace(b'"', b"") + b'\xff"')
    elif roll < 0.7:
        raw = deep_body(rng.randrange(200, 1100))
    elif roll < 0.8:
        raw = json.dumps({"model": "m", "messages": random_json(rng)}).encode()
    else:
        raw = json.dumps({"model": "m", "messages": [
            {"role": "user", "content": " ".join(rng.choice(PROSE) for _ in range(300))} for _ in range(5)]}).encode()
    session = f"mem-{n}" if rng.random() < 0.8 else "".join(chr(rng.randrange(0x20, 0xFF)) for _ in range(20))
    headers = {"X-Session-Id": session.replace("\x7f", ""), "Authorization": f"Bearer sk-{rng.randrange(10**9)}",
               "Content-Type": "application/json"}
    path = "/v1/chat/completions" if rng.random() < 0.8 else f"/s/{quote(session, safe='')}/v1/chat/completions"
    return path, headers, raw


async def send_all(proxy: ProxyProcess, batch: list[tuple[str, dict[str, str], bytes]], parallel: int = 8) -> None:
    gate = asyncio.Semaphore(parallel)
    async with aiohttp.ClientSession(skip_auto_headers=("Content-Type",)) as http:
        async def one(request: tuple[str, dict[str, str], bytes]) -> None:
            async with gate:
                await check(http, proxy, request)

        await asyncio.gather(*(one(r) for r in batch))


@pytest.mark.slow
async def test_memory_stays_bounded_under_2000_hostile_requests(fuzz_proxy: ProxyProcess) -> None:
    rng = random.Random(6)
    batch = [hostile_request(rng, n) for n in range(2300)]
    await send_all(fuzz_proxy, batch[:300])  # warm-up: caches, tokenizer, connection pools
    warm = fuzz_proxy.rss_bytes()
    await send_all(fuzz_proxy, batch[300:2300])
    grown = fuzz_proxy.rss_bytes() - warm
    print(f"RSS after warm-up {warm / 2**20:.1f} MB, grown by {grown / 2**20:.1f} MB over 2000 requests")
    assert grown < 50 * 1024 * 1024, f"RSS grew by {grown / 2**20:.1f} MB over 2000 requests"
