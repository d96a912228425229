"""The floor with the log (``bench.floor --log``) does what it stands for in ``bench.hotpath``.

It is the bound issue 21's targets are measured against: a floor that skipped
a store call, or logged less than ctxproxy must, would make every proxy that
keeps the design's promises look slower than it is. So: the log is read
before the upstream is called, each message is logged once, and the reply is
in the log before the client has the answer.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp.test_utils import TestServer

from bench import fakeserver
from bench.floor import make_app
from proxy.store import NewFact, SessionKey
from proxy.store.redis import RedisFactLog

KEY = SessionKey("floor", "s1")
HEADERS = {"X-Session-Id": KEY.session}
SYSTEM = {"role": "system", "content": "You are terse."}


def _body(messages: list[dict[str, Any]], stream: bool = False) -> bytes:
    return orjson.dumps({"model": "m", "messages": messages, "stream": stream})


async def test_the_floor_with_the_log_logs_each_message_once_and_the_reply_before_answering(
        aiohttp_server: Any, aiohttp_client: Any, redis_store: RedisFactLog, redis_url: str) -> None:
    upstream: TestServer = await aiohttp_server(fakeserver.make_app())
    client = await aiohttp_client(make_app(str(upstream.make_url("/")), log=redis_url))
    first = [SYSTEM, {"role": "user", "content": "one"}]

    resp = await client.post("/v1/chat/completions", data=_body(first), headers=HEADERS)
    assert resp.status == 200
    answer = await resp.json()
    logged = await redis_store.read(KEY)  # the answer is in: so is everything it logged
    assert [f.message for f in logged] == [*first, answer["choices"][0]["message"]]
    assert [(f.index, f.source) for f in logged] == [(0, "client"), (1, "client"), (2, "upstream")]

    second = [*first, fakeserver.REPLY, {"role": "user", "content": "two"}]
    resp = await client.post("/v1/chat/completions", data=_body(second, stream=True), headers=HEADERS)
    assert resp.status == 200
    streamed = await resp.read()
    logged = await redis_store.read(KEY)
    assert [f.message for f in logged[3:]] == [second[3], {"role": "assistant", "content": streamed.decode()}]
    assert [f.seq for f in logged] == list(range(5))


async def test_the_floor_with_the_log_reads_a_session_new_to_it_before_the_upstream(
        aiohttp_server: Any, aiohttp_client: Any, redis_store: RedisFactLog, redis_url: str) -> None:
    """A session another process began: its log is read first, so the step is appended after its end (an
    append at seq 0 would conflict with the log and fail the request)."""
    earlier = [SYSTEM, {"role": "user", "content": "one"}, fakeserver.REPLY]
    await redis_store.append(KEY, 0, [NewFact("message", i, "client", m) for i, m in enumerate(earlier)], 1.0)
    upstream: TestServer = await aiohttp_server(fakeserver.make_app())
    client = await aiohttp_client(make_app(str(upstream.make_url("/")), log=redis_url))

    step = [*earlier, {"role": "user", "content": "two"}]
    resp = await client.post("/v1/chat/completions", data=_body(step), headers=HEADERS)
    assert resp.status == 200
    logged = await redis_store.read(KEY)
    assert [f.message["content"] for f in logged if f.message] == ["You are terse.", "one", fakeserver.REPLY["content"],
                                                                    "two", fakeserver.REPLY["content"]]
