"""The store goes away mid-conversation: the proxy keeps serving, and the log heals afterwards."""

from __future__ import annotations

from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import create_app
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.proxyfixtures import read_log, replay, same_conversation
from tests.redisproc import RedisProcess, free_port

AUTH = {"Authorization": "Bearer sk-outage", "X-Session-Id": "outage"}


def metric(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise KeyError(name)


async def step(proxy: Any, messages: list[dict[str, Any]], stream: bool) -> None:
    body = {"model": "m", "messages": messages, "stream": stream}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body), headers=AUTH)
    assert resp.status == 200
    raw = await resp.read()
    if stream:
        content = ""
        for block in raw.split(b"\n\n"):
            if block.startswith(b"data: {"):
                choices = orjson.loads(block[6:])["choices"]
                content += (choices[0]["delta"].get("content") or "") if choices else ""
        messages.append({"role": "assistant", "content": content})
    else:
        messages.append(orjson.loads(raw)["choices"][0]["message"])
    messages.append({"role": "user", "content": f"continue {len(messages)}"})


async def test_redis_stop_and_restart_mid_conversation_loses_nothing(aiohttp_client, upstream, tmp_path) -> None:
    redis = RedisProcess(free_port(), tmp_path / "redis", ["--appendonly", "yes", "--appendfsync", "always"])
    redis.start()
    try:
        settings = Settings(upstream=str(upstream.make_url("/v1")), store=redis.url)
        proxy = await aiohttp_client(create_app(settings))
        messages: list[dict[str, Any]] = [{"role": "user", "content": "begin"}]
        for i in range(3):
            await step(proxy, messages, stream=bool(i % 2))

        redis.stop()
        assert (await proxy.get("/readyz")).status == 503
        for i in range(3):
            await step(proxy, messages, stream=bool(i % 2))
        errors = metric(await (await proxy.get("/metrics")).text(), "ctxproxy_store_errors_total")
        assert errors >= 3  # each step's append (request messages + reply) failed

        redis.start()
        assert (await proxy.get("/readyz")).status == 200
        await step(proxy, messages, stream=False)
        await step(proxy, messages, stream=True)

        facts = await read_log(proxy.app[store_key], SessionKey(tenant_of("sk-outage"), "outage"))
        assert [f.seq for f in facts] == list(range(len(facts)))
        assert all(f.kind == "message" for f in facts)
        assert same_conversation(replay(facts), messages[:-1])
        # Replies given during the outage were kept in memory and logged as the upstream's, not the client's.
        assert [f.source for f in facts if f.message and f.message["role"] == "assistant"] == ["upstream"] * 8
    finally:
        if redis.proc is not None:
            redis.stop()
