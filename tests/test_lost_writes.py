"""The store loses its last writes under a running proxy: the store is the truth, and the log heals.

A Redis failover or a truncated AOF, or a backup restored under running
processes, takes the log back to an older state while a process's cached state
stays ahead of it. The test damages the store itself, from outside the proxy:
an older copy of the session is restored (Redis: DUMP/RESTORE of the session's
keys by a separate client, or a restart from an older RDB file; SQLite: the
online backup API writing an older copy into the live file). The next request
must be logged, with what was lost, and no append may wait out the conflict
deadline.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from proxy.app import create_app
from proxy.constants import fact_keys_key, log_key, meta_key
from proxy.context.log.history import HistoryManager
from proxy.dialects.chat import message_hash
from proxy.keys import history_key, store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store import FactLog, StoredFact
from proxy.store.base import SessionKey
from proxy.store.redis import RedisFactLog
from proxy.store.sqlite import SqliteFactLog
from tests.proxyfixtures import read_log, replay, same_conversation, sync_chat
from tests.redisproc import RedisProcess, free_port
from tests.test_outage import step

KEY = SessionKey("t", "lost-tail")
RELOADED = "no longer holds entry"
#: A conversation of alternating user and assistant messages; each one is one log entry when synced in order.
CONVERSATION = [{"role": "user", "content": f"u{i}"} if i % 2 == 0 else {"role": "assistant", "content": f"a{i}"}
                for i in range(12)]

Restore = Callable[[], Awaitable[None]]
Snapshot = Callable[[], Awaitable[Restore]]


async def appends_run(client: Redis | RedisCluster) -> int:
    """Runs of the append script since the last CONFIG RESETSTAT (a conflict is a run that wrote nothing)."""
    runs = (await client.info("commandstats")).get("cmdstat_evalsha", {})
    return int(runs.get("calls", 0) - runs.get("failed_calls", 0) - runs.get("rejected_calls", 0))


@pytest.fixture
def damaged(store: FactLog, request: pytest.FixtureRequest) -> Iterator[tuple[FactLog, Snapshot]]:
    """Each backend (conftest's ``store``), and ``snapshot()``: it copies the session now and returns
    ``restore()``, which puts that copy back, from outside the store under test."""
    if isinstance(store, RedisFactLog):
        with closing(SyncRedis.from_url(request.getfixturevalue("redis_url"))) as outside:
            yield store, partial(redis_snapshot, outside)
        return
    assert isinstance(store, SqliteFactLog)
    yield store, partial(sqlite_snapshot, store.path)


async def redis_snapshot(outside: SyncRedis) -> Restore:
    names = [log_key(*KEY), meta_key(*KEY), fact_keys_key(*KEY)]
    dumps = [outside.dump(name) for name in names]

    async def restore() -> None:
        for name, dumped in zip(names, dumps, strict=True):
            outside.delete(name)
            if dumped is not None:
                outside.restore(name, 0, dumped)
    return restore


async def sqlite_snapshot(live: Path) -> Restore:
    copy = live.with_name(f"{live.stem}-{time.monotonic_ns()}.db")
    with closing(sqlite3.connect(live)) as source, closing(sqlite3.connect(copy)) as target:
        source.backup(target)

    async def restore() -> None:
        with closing(sqlite3.connect(copy)) as source, closing(sqlite3.connect(live)) as target:
            source.backup(target)
    return restore


def reloads(caplog: pytest.LogCaptureFixture) -> int:
    return sum(RELOADED in record.getMessage() for record in caplog.records)


def assert_healed(facts: list[StoredFact], conversation: list[dict[str, Any]]) -> None:
    """The conversation is the log's head, seqs run from 0 without a gap, and no path logged a message twice."""
    assert [f.seq for f in facts] == list(range(len(facts)))
    assert same_conversation(replay(facts), conversation)
    hashes = Counter(message_hash(dict(f.message)) for f in facts if f.kind == "message" and f.message is not None)
    assert set(hashes.values()) == {1}


async def test_a_log_that_lost_its_tail_is_read_again_and_written_again(
        damaged: tuple[FactLog, Snapshot], caplog: pytest.LogCaptureFixture) -> None:
    store, snapshot = damaged
    history = HistoryManager(store, clock=time.time)
    await sync_chat(history, KEY, CONVERSATION[:4], upstream_from=3)
    restore = await snapshot()
    await sync_chat(history, KEY, CONVERSATION[:8], upstream_from=7)
    await restore()  # the store is back at 4 entries; the cached state holds 8
    assert len(await read_log(store, KEY)) == 4
    if isinstance(store, RedisFactLog):
        await store.client.config_resetstat()
    caplog.set_level(logging.WARNING, "proxy.context.log.history")

    state = await sync_chat(history, KEY, CONVERSATION[:10], upstream_from=9)

    facts = await read_log(store, KEY)
    assert len(facts) == 10 and state.next_seq == 10
    assert_healed(facts, CONVERSATION[:10])
    # The lost replies come back as the client resends them; only the new one is the upstream's.
    assert [f.source for f in facts[4:]] == ["client"] * 5 + ["upstream"]
    assert reloads(caplog) == 1
    if isinstance(store, RedisFactLog):
        assert await appends_run(store.client) == 2  # one conflict, then the append that heals: no spinning


class HeldRead:
    """``store`` with the answer of one read, once armed, held until ``release``: a catch-up read in flight, made
    visible (the store is the real one; only the moment its answer arrives is chosen by the test)."""

    def __init__(self, store: FactLog) -> None:
        self.store, self.armed, self.held, self.release = store, False, asyncio.Event(), asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def read(self, key: SessionKey, after: int = -1, limit: int | None = None) -> list[StoredFact]:
        facts = await self.store.read(key, after, limit)
        if self.armed:
            self.armed = False
            self.held.set()
            await self.release.wait()
        return facts


async def test_a_read_in_flight_while_this_process_appends_is_no_lost_tail(
        store: FactLog, caplog: pytest.LogCaptureFixture) -> None:
    """A request catching up reads the log; before the answer arrives, a background compaction or another request
    of this process appends and folds its facts into the same cached state. The read's answer then ends before the
    state does, which is no sign of a lost tail: nothing is reloaded, and what comes next is planned on the state
    that holds every fact (a reload here once wrote a background checkpoint twice)."""
    log = HeldRead(store)
    history = HistoryManager(log, clock=time.time)  # type: ignore[arg-type]
    await sync_chat(history, KEY, CONVERSATION[:4], upstream_from=3)
    caplog.set_level(logging.WARNING, "proxy.context.log.history")
    log.armed = True
    reader = asyncio.create_task(history.state(KEY, refresh=True))
    await log.held.wait()  # the read has its answer: the log as it was, 4 entries
    await sync_chat(history, KEY, CONVERSATION[:8], upstream_from=7)  # this process appends meanwhile
    log.release.set()

    state = await reader
    assert reloads(caplog) == 0
    assert state is history.cached(KEY) and state.next_seq == 8
    await sync_chat(history, KEY, CONVERSATION[:10], upstream_from=9)
    facts = await read_log(store, KEY)
    assert len(facts) == 10
    assert_healed(facts, CONVERSATION[:10])


@pytest.mark.parametrize("written_again", [4, 6], ids=["to-the-same-length", "past-it"])
async def test_a_log_written_again_by_another_replica_after_it_lost_its_tail_is_read_again(
        damaged: tuple[FactLog, Snapshot], caplog: pytest.LogCaptureFixture, written_again: int) -> None:
    """Another replica wrote the session after the loss: as many entries as were lost, or more. The cached state's
    length then says nothing; its last entry's digest does."""
    store, snapshot = damaged
    history, other = HistoryManager(store, clock=time.time), HistoryManager(store, clock=time.time)
    await sync_chat(history, KEY, CONVERSATION[:4], upstream_from=3)
    restore = await snapshot()
    await sync_chat(history, KEY, CONVERSATION[:8], upstream_from=7)
    await restore()
    elsewhere = [*CONVERSATION[:4], *({"role": "user", "content": f"elsewhere {i}"} for i in range(written_again))]
    await sync_chat(other, KEY, elsewhere)
    assert len(await read_log(store, KEY)) == 4 + written_again
    caplog.set_level(logging.WARNING, "proxy.context.log.history")

    await sync_chat(history, KEY, CONVERSATION[:10], upstream_from=9)

    facts = await read_log(store, KEY)
    assert_healed(facts, CONVERSATION[:10])
    assert [(f.kind, f.extra.get("from_seq")) for f in facts[4 + written_again:][:1]] == [("rewind", 3)]
    assert len(facts) == 4 + written_again + 1 + 6
    assert reloads(caplog) == 1
    await sync_chat(other, KEY, [*elsewhere, {"role": "user", "content": "and on"}])  # the other replica goes on
    assert same_conversation(replay(await read_log(store, KEY)), [*elsewhere, {"role": "user", "content": "and on"}])


async def test_redis_restarted_from_an_older_dump_under_a_running_proxy(aiohttp_client: Any, upstream: Any,
                                                                        tmp_path: Path) -> None:
    """The realistic loss: Redis comes back from an RDB file older than its last writes."""
    redis = RedisProcess(free_port(), tmp_path / "redis")  # no AOF, no save points: only an explicit SAVE persists
    redis.start()
    outside = Redis.from_url(redis.url)
    try:
        proxy = await aiohttp_client(create_app(Settings(upstream=str(upstream.make_url("/v1")), store=redis.url)))
        messages: list[dict[str, Any]] = [{"role": "user", "content": "begin"}]
        for i in range(3):
            await step(proxy, messages, stream=bool(i % 2))
        await outside.save()
        for i in range(2):
            await step(proxy, messages, stream=bool(i % 2))
        await outside.aclose()
        key = SessionKey(tenant_of("sk-outage"), "outage")
        cached = proxy.app[history_key].cached(key)
        assert cached is not None and cached.next_seq == 10
        redis.kill()
        redis.start()  # loads the dump of the first three steps
        outside = Redis.from_url(redis.url)
        assert len(await read_log(proxy.app[store_key], key)) == 6

        await step(proxy, messages, stream=False)

        facts = await read_log(proxy.app[store_key], key)
        assert_healed(facts, messages[:-1])
        assert len(facts) == 12
        # The request and its reply are logged in one append: a conflict, then the append that heals; no spinning.
        assert await appends_run(outside) == 2
    finally:
        await outside.aclose()
        if redis.proc is not None:
            redis.stop()
