"""Many requests at once: 300 sessions against one Redis, and 50 requests fanned out into one session.

Both run through a real proxy (a child process for the 300 sessions, so the
client and the proxy do not share one event loop) against the fake upstream,
on a real redis-server and a real SQLite file, and writers of several
"processes" (a store handle and a HistoryManager each) into one session. Every
reply a client received must be in the log exactly once, and no store
operation may fail.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp.test_utils import TestServer

from proxy.context.log.history import HistoryManager
from proxy.dialects.chat import message_hash
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store import open_store
from proxy.store.base import SessionKey
from proxy.store.redis import RedisFactLog
from tests.proxyfixtures import ProxyFactory, read_log, replay, same_conversation, sync_chat
from tests.proxyproc import ProxyProcess
from tests.test_outage import metric

API_KEY = "sk-contention"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TENANT = tenant_of(API_KEY)
SESSIONS = 300
STEPS = 2
FAN_OUT = 50


async def ask(http: aiohttp.ClientSession, url: str, session: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "m", "messages": messages}
    async with http.post(url + "/v1/chat/completions", data=orjson.dumps(body),
                         headers={**AUTH, "X-Session-Id": session}) as resp:
        raw = await resp.read()
        assert resp.status == 200, raw[:300]
    message: dict[str, Any] = orjson.loads(raw)["choices"][0]["message"]
    return message


async def run_session(http: aiohttp.ClientSession, url: str, n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {n}"}]
    for step in range(STEPS):
        messages.append(await ask(http, url, f"many-{n}", messages))
        if step < STEPS - 1:
            messages.append({"role": "user", "content": f"task {n}, step {step + 1}"})
    return messages


async def test_three_hundred_sessions_at_once_on_redis_lose_nothing(
    upstream: TestServer, redis_url: str, redis_flush: None, tmp_path: Path
) -> None:
    proxy = ProxyProcess(str(upstream.make_url("/v1")), redis_url, tmp_path)
    store = await open_store(redis_url)
    try:
        await proxy.start()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=60)) as http:
            conversations = await asyncio.gather(*(run_session(http, proxy.url, n) for n in range(SESSIONS)))
            async with http.get(proxy.url + "/metrics") as resp:
                errors = metric(await resp.text(), "ctxproxy_store_errors_total")
        logs = [await read_log(store, SessionKey(TENANT, f"many-{n}")) for n in range(SESSIONS)]
    finally:
        proxy.close()
        await store.aclose()
    lost = [n for n, (facts, conversation) in enumerate(zip(logs, conversations, strict=True))
            if not same_conversation(replay(facts), conversation)]
    assert (errors, len(lost)) == (0, 0), proxy.log_tail(5)


async def test_fifty_requests_fanned_out_into_one_session_log_every_reply_once(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    system = {"role": "system", "content": "You are an agent running sub-tasks."}

    async def sub_task(i: int) -> dict[str, Any]:
        body = {"model": "m", "messages": [system, {"role": "user", "content": f"sub-task {i}"}]}
        resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                                headers={**AUTH, "X-Session-Id": "fan-out"})
        assert resp.status == 200
        message: dict[str, Any] = (await resp.json(loads=orjson.loads))["choices"][0]["message"]
        return message

    replies = await asyncio.gather(*(sub_task(i) for i in range(FAN_OUT)))
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "fan-out"))
    assert [f.seq for f in facts] == list(range(len(facts)))
    logged = Counter(message_hash(f.message) for f in facts if f.kind == "message" and f.source == "upstream")
    assert [logged[message_hash(reply)] for reply in replies] == [1] * FAN_OUT
    errors = metric(await (await proxy.get("/metrics")).text(), "ctxproxy_store_errors_total")
    assert errors == 0


async def test_writers_of_several_processes_retry_conflicts_until_every_reply_lands(store_url: str) -> None:
    """Eight processes' worth of writers (a store handle and a HistoryManager each) fan out into one session."""
    stores = [await open_store(store_url) for _ in range(8)]
    try:
        managers = [HistoryManager(store, clock=time.time) for store in stores]
        key = SessionKey("t", "shared")
        system = {"role": "system", "content": "You are an agent running sub-tasks."}
        answers = [{"role": "assistant", "content": f"answer {i}"} for i in range(FAN_OUT)]
        await asyncio.gather(*(
            sync_chat(managers[i % len(managers)], key, [system, {"role": "user", "content": f"sub-task {i}"}, answer],
                                             upstream_from=2)
            for i, answer in enumerate(answers)))
        facts = await read_log(stores[0], key)
    finally:
        for store in stores:
            await store.aclose()
    logged = Counter(message_hash(f.message) for f in facts if f.kind == "message" and f.source == "upstream")
    assert [logged[message_hash(answer)] for answer in answers] == [1] * FAN_OUT


async def test_requests_of_one_process_append_one_after_the_other(redis_store: RedisFactLog) -> None:
    """One writer per session in a process: fifty concurrent syncs make fifty appends, none of them a conflict.

    Redis counts the append script's runs (``INFO commandstats``); a conflict would be a run that wrote nothing.
    """
    history = HistoryManager(redis_store, clock=time.time)
    key = SessionKey("t", "one-writer")
    system = {"role": "system", "content": "You are an agent running sub-tasks."}
    await redis_store.client.config_resetstat()
    await asyncio.gather(*(
        sync_chat(history, key, [system, {"role": "user", "content": f"sub-task {i}"},
                           {"role": "assistant", "content": f"answer {i}"}], upstream_from=2)
        for i in range(FAN_OUT)))
    stats = await redis_store.client.info("commandstats")
    runs = stats["cmdstat_evalsha"]
    assert runs["calls"] - runs.get("failed_calls", 0) - runs.get("rejected_calls", 0) == FAN_OUT
    assert len(await read_log(redis_store, key)) == 3 + (FAN_OUT - 1) * 3  # then a rewind, a user and an answer each
