"""Store round trips per step on Redis, counted by the private server's INFO commandstats (issue 21).

Every store call costs the proxy a command's worth of client work and a round trip, on the path of every
request: a step of a session known here is one script call (the append of the step with its reply), and the
first request of a session new here two (its log with its link and who else holds the session id, noting its
own tenant when nobody does; the append).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
import redis.asyncio

from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.proxyfixtures import ProxyFactory

AUTH = {"Authorization": "Bearer sk-test-key"}


@pytest.fixture
def store_url(redis_url: str, redis_flush: None) -> str:
    """The proxies here log to the private Redis only."""
    return redis_url


async def sent(url: str, action: Callable[[], Awaitable[Any]]) -> list[str]:
    """The commands clients sent to the private Redis during ``action`` (MONITOR; what scripts call inside Redis
    is not a round trip and is left out)."""
    watcher, marker = redis.asyncio.Redis.from_url(url), redis.asyncio.Redis.from_url(url)
    end = f"end-{uuid.uuid4().hex}"
    try:
        await marker.ping()  # connected before the watch starts: its handshake is not counted
        async with watcher.monitor() as monitor:
            await action()
            await marker.echo(end)
            names: list[str] = []
            async for command in monitor.listen():
                if end in command["command"]:
                    return names
                if command.get("client_type") != "lua":
                    names.append(command["command"].split()[0].upper())
    finally:
        await watcher.aclose()
        await marker.aclose()
    raise AssertionError("the monitor ended before the marker")


async def step(proxy: Any, session: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    resp = await proxy.post("/v1/chat/completions", headers={**AUTH, "X-Session-Id": session},
                            data=orjson.dumps({"model": "gpt-4o", "messages": messages}))
    assert resp.status == 200
    reply: dict[str, Any] = (await resp.json())["choices"][0]["message"]
    return reply


async def test_a_step_is_one_script_call_and_a_new_session_two(make_proxy: ProxyFactory, redis_url: str) -> None:
    proxy = await make_proxy()
    await step(proxy, "warm-up", [{"role": "user", "content": "load the scripts"}])
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "Hello there."}]

    async def next_step() -> None:
        messages.append(await step(proxy, "run-1", messages))

    assert await sent(redis_url, next_step) == ["EVALSHA"] * 2, "log, link and the other tenants; the append"
    for n in range(3):
        messages.append({"role": "user", "content": f"And now step {n}?"})
        assert await sent(redis_url, next_step) == ["EVALSHA"], "a step: its append"

    store = proxy.app[store_key]
    log = await store.read(SessionKey(tenant_of("sk-test-key"), "run-1"))
    assert [fact.message for fact in log] == messages, "every message and reply logged, in order"
    assert [t.name for t in await store.tenants_of("run-1")] == [tenant_of("sk-test-key")], "noted in the first call"
