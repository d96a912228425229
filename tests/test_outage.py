"""The store goes away mid-conversation: the proxy keeps serving, and the log heals afterwards."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import create_app
from proxy.context.log.history import HistoryManager
from proxy.errors import StoreUnavailable
from proxy.keys import history_key, store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store import redisclient
from proxy.store.base import NewFact, SessionKey
from proxy.store.redis import RedisFactLog
from tests.proxyfixtures import read_log, replay, same_conversation, sync_chat
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


async def test_a_missed_reply_is_logged_in_the_background_once_the_store_is_back(tmp_path, caplog) -> None:
    """The client never comes back with the reply: the retry logs it, counting each failed attempt; the warning
    names the session."""
    redis = RedisProcess(free_port(), tmp_path / "redis", ["--appendonly", "yes", "--appendfsync", "always"])
    redis.start()
    store = RedisFactLog.from_url(redis.url)
    failed = asyncio.Event()
    failures: list[int] = []

    def on_error() -> None:
        failures.append(1)
        failed.set()

    history = HistoryManager(store, clock=time.time, on_error=on_error)
    key = SessionKey("t", "background")
    conversation = [{"role": "user", "content": "begin"}, {"role": "assistant", "content": "first"},
                    {"role": "user", "content": "and then?"}, {"role": "assistant", "content": "second"}]
    try:
        await sync_chat(history, key, conversation[:2], upstream_from=1)
        redis.stop()
        with pytest.raises(StoreUnavailable):
            await sync_chat(history, key, conversation, upstream_from=3)
        retry = history.retry_of(key)
        assert retry is not None
        assert "keeping 1 upstream repl(ies) of session background in memory" in caplog.text
        await asyncio.wait_for(failed.wait(), 30)  # a retry ran while the store was down, and was counted
        redis.start()
        await asyncio.wait_for(retry, 30)
        facts = await read_log(store, key)
        assert same_conversation(replay(facts), conversation)
        assert [f.source for f in facts] == ["client", "upstream", "client", "upstream"]
        assert len(failures) >= 1 and history.retry_of(key) is None
    finally:
        await history.aclose()
        await store.aclose()
        if redis.proc is not None:
            redis.stop()


async def test_a_reply_retried_on_another_branch_leaves_the_head_where_the_client_is(tmp_path) -> None:
    """The client moved on without the reply: it is logged on its own branch, and the head comes back."""
    redis = RedisProcess(free_port(), tmp_path / "redis", ["--appendonly", "yes", "--appendfsync", "always"])
    redis.start()
    store = RedisFactLog.from_url(redis.url)
    history = HistoryManager(store, clock=time.time)
    key = SessionKey("t", "elsewhere")
    main = [{"role": "user", "content": "begin"}, {"role": "assistant", "content": "first"}]
    side = [{"role": "system", "content": "Write a title."}, {"role": "user", "content": "begin"}]
    try:
        await sync_chat(history, key, main, upstream_from=1)
        redis.stop()
        with pytest.raises(StoreUnavailable):
            await sync_chat(history, key, [*main, {"role": "user", "content": "more"}, {"role": "assistant",
                                                                                   "content": "lost?"}],
                               upstream_from=3)
        retry = history.retry_of(key)
        assert retry is not None
        redis.start()
        await sync_chat(history, key, side)  # the client's next request is another conversation
        await asyncio.wait_for(retry, 30)
        facts = await read_log(store, key)
        assert same_conversation(replay(facts), side), "the head is the conversation the client last sent"
        assert [(f.kind, f.source, f.index) for f in facts[2:]] == [
            ("rewind", "client", 0), ("message", "client", 0), ("message", "client", 1),
            ("rewind", "proxy", 2), ("message", "client", 2), ("message", "upstream", 3), ("rewind", "proxy", 2)]
        assert [f.extra.get("from_seq") for f in facts if f.kind == "rewind"] == [None, 1, 4]
    finally:
        await history.aclose()
        await store.aclose()
        if redis.proc is not None:
            redis.stop()


async def test_shutdown_cancels_the_background_retry(aiohttp_client, upstream, tmp_path) -> None:
    redis = RedisProcess(free_port(), tmp_path / "redis")
    redis.start()
    try:
        proxy = await aiohttp_client(create_app(Settings(upstream=str(upstream.make_url("/v1")), store=redis.url)))
        redis.stop()
        await step(proxy, [{"role": "user", "content": "begin"}], stream=False)
        history = proxy.app[history_key]
        retry = history.retry_of(SessionKey(tenant_of("sk-outage"), "outage"))
        assert retry is not None and not retry.done()
        await proxy.close()  # the app's cleanup
        assert retry.cancelled()
        assert history.retry_of(SessionKey(tenant_of("sk-outage"), "outage")) is None
    finally:
        if redis.proc is not None:
            redis.stop()


async def test_a_redis_that_stops_answering_fails_each_command_at_its_deadline_and_no_reply_goes_astray(
        tmp_path, monkeypatch) -> None:
    """A hung Redis (stopped, its connections open) fails a command as StoreUnavailable once the command's deadline
    passes, not at the OS's TCP timeout; the late reply dies with its connection, so when Redis answers again each
    command gets its own reply (one connection: the next command would otherwise read the last one's)."""
    monkeypatch.setattr(redisclient, "SOCKET_TIMEOUT", 0.2)
    with RedisProcess(free_port(), tmp_path / "redis") as redis:
        store = RedisFactLog.from_url(f"{redis.url}?max_connections=1")
        key = SessionKey("t-hung", "run-1")
        try:
            await store.append(key, 0, [NewFact(kind="message", index=0, source="client",
                                                message={"role": "user", "content": "hi"}, hash="h0")], time.time())
            assert redis.proc is not None
            os.kill(redis.proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(StoreUnavailable):
                    await store.read(key)
                with pytest.raises(StoreUnavailable):
                    await store.link_of(key)
            finally:
                os.kill(redis.proc.pid, signal.SIGCONT)
            assert await store.link_of(key) is None
            assert [fact.message for fact in await store.read(key)] == [{"role": "user", "content": "hi"}]
        finally:
            await store.aclose()
