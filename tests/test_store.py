"""The FactLog contract, run against every backend, then what is specific to each."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.crc import key_slot

from proxy.errors import ConflictError, StoreUnavailable, UnencodableFact
from proxy.store import FactLog, NewFact, SessionInfo, SessionKey, StoredFact, codec, open_store
from proxy.store.redis import RedisFactLog
from proxy.store.redisclient import DEFAULT_MAX_CONNECTIONS, HiredisPacking, PackedConnection
from proxy.store.sqlite import MIGRATIONS, SqliteFactLog
from tests.redisproc import RedisProcess, free_port

KEY = SessionKey("tenant-a", "run-1")
TS = 1_700_000_000.25


def msg(i: int, role: str = "user") -> NewFact:
    return NewFact(kind="message", index=i, source="client", message={"role": role, "content": f"m{i}"}, hash=f"h{i}")


def without_ids(facts: list[StoredFact]) -> list[dict[str, Any]]:
    return [{k: v for k, v in f.to_json().items() if k != "id"} for f in facts]


async def append_retrying(store: FactLog, key: SessionKey, fact: NewFact) -> int:
    """Append one fact the way a request does under contention: on conflict, retry at the real seq."""
    expected = 0
    for _ in range(1000):
        try:
            (stored,) = await store.append(key, expected, [fact], TS)
            return stored.seq
        except ConflictError as exc:
            expected = exc.actual_seq
    raise AssertionError("append never won")


# ---- the contract, once per backend -----------------------------------------


async def test_roundtrip_exact(store: FactLog) -> None:
    facts = [
        msg(0),
        NewFact(kind="checkpoint", index=None, source="proxy", extra={"checkpoint": {"upto": 1}, "partial": False}),
    ]
    stored = await store.append(KEY, 0, facts, TS)
    assert await store.read(KEY) == stored
    assert without_ids(stored) == [
        {"seq": 0, "kind": "message", "index": 0, "source": "client",
         "message": {"role": "user", "content": "m0"}, "ts": TS, "hash": "h0"},
        {"seq": 1, "kind": "checkpoint", "index": None, "source": "proxy", "message": None, "ts": TS, "hash": None,
         "checkpoint": {"upto": 1}, "partial": False},
    ]
    assert len({f.id for f in stored}) == 2


async def test_seq_is_gapless_across_appends(store: FactLog) -> None:
    await store.append(KEY, 0, [msg(0), msg(1)], TS)
    await store.append(KEY, 2, [msg(2)], TS + 1)
    await store.append(KEY, 3, [msg(3), msg(4), msg(5)], TS + 2)
    facts = await store.read(KEY)
    assert [f.seq for f in facts] == list(range(6))
    assert [f.index for f in facts] == list(range(6))
    assert [f.ts for f in facts] == [TS, TS, TS + 1, TS + 2, TS + 2, TS + 2]


async def test_read_after_and_limit(store: FactLog) -> None:
    await store.append(KEY, 0, [msg(i) for i in range(10)], TS)
    assert [f.seq for f in await store.read(KEY, after=6)] == [7, 8, 9]
    assert [f.seq for f in await store.read(KEY, after=2, limit=3)] == [3, 4, 5]
    assert [f.seq for f in await store.read(KEY, limit=2)] == [0, 1]
    assert [f.seq for f in await store.read(KEY, after=-5, limit=1)] == [0]
    assert await store.read(KEY, after=9) == []
    assert await store.read(KEY, limit=0) == []
    pages, after = [], -1
    while page := await store.read(KEY, after=after, limit=4):
        pages.append([f.seq for f in page])
        after = page[-1].seq
    assert pages == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


async def test_long_log_reads_whole(store: FactLog) -> None:
    await store.append(KEY, 0, [msg(i) for i in range(2500)], TS)
    facts = await store.read(KEY, after=99)
    assert [f.seq for f in facts] == list(range(100, 2500))


async def test_conflict_reports_actual_seq_and_writes_nothing(store: FactLog) -> None:
    await store.append(KEY, 0, [msg(0), msg(1)], TS)
    for wrong in (0, 1, 3, -1):
        with pytest.raises(ConflictError) as info:
            await store.append(KEY, wrong, [msg(9)], TS)
        assert info.value.actual_seq == 2
    with pytest.raises(ConflictError) as info:
        await store.append(SessionKey("tenant-a", "fresh"), 5, [msg(0)], TS)
    assert info.value.actual_seq == 0
    assert [f.seq for f in await store.read(KEY)] == [0, 1]
    assert await store.read(SessionKey("tenant-a", "fresh")) == []


async def test_empty_append_checks_but_writes_nothing(store: FactLog) -> None:
    assert await store.append(KEY, 0, [], TS) == []
    with pytest.raises(ConflictError):
        await store.append(KEY, 1, [], TS)
    assert [s async for s in store.sessions()] == []


async def test_concurrent_appends_make_one_gapless_log(store: FactLog) -> None:
    n = 30
    seqs = await asyncio.gather(*(append_retrying(store, KEY, msg(i)) for i in range(n)))
    facts = await store.read(KEY)
    assert sorted(seqs) == [f.seq for f in facts] == list(range(n))
    assert sorted(f.index for f in facts if f.index is not None) == list(range(n))


async def test_an_append_naming_another_last_entry_conflicts_and_writes_nothing(store: FactLog) -> None:
    """``tail``: a log written again to the length the writer expected is not the log it planned on."""
    first = await store.append(KEY, 0, [msg(0), msg(1)], TS)
    assert first[-1].digest == codec.digest(codec.encode(msg(1), 1, TS))
    assert [f.digest for f in await store.read(KEY)] == [f.digest for f in first]
    assert first[0].digest != first[1].digest
    with pytest.raises(ConflictError) as info:
        await store.append(KEY, 2, [msg(2)], TS, tail=first[0].digest)
    assert info.value.actual_seq == 2
    with pytest.raises(ConflictError) as info:
        await store.append(SessionKey("tenant-a", "fresh"), 0, [msg(0)], TS, tail=first[0].digest)
    assert info.value.actual_seq == 0
    assert [f.seq for f in await store.read(KEY)] == [0, 1]
    assert await store.read(SessionKey("tenant-a", "fresh")) == []
    (third,) = await store.append(KEY, 2, [msg(2)], TS, tail=first[-1].digest)
    assert third.seq == 2


async def test_a_keyed_fact_the_log_holds_is_not_written_again(store: FactLog) -> None:
    """The retry of an append whose reply was lost: its keyed facts come back as the entries already logged."""
    summary = NewFact(kind="summary", index=1, source="proxy", message={"role": "system", "content": "s"},
                      key="k-summary")
    checkpoint = NewFact(kind="checkpoint", index=1, source="proxy", extra={"checkpoint": {"upto": 1}},
                         key="k-checkpoint")
    await store.append(KEY, 0, [msg(0)], TS)
    first = await store.append(KEY, 1, [summary, checkpoint], TS)
    assert [(f.seq, f.key) for f in first] == [(1, "k-summary"), (2, "k-checkpoint")]
    assert first[0].to_json()["key"] == "k-summary" and "key" not in (await store.read(KEY))[0].to_json()
    assert await store.append(KEY, 3, [summary, checkpoint], TS + 1) == first
    later = NewFact(kind="checkpoint", index=2, source="proxy", extra={"checkpoint": {"upto": 2}}, key="k-later")
    mixed = await store.append(KEY, 3, [checkpoint, msg(3), later], TS + 2)
    assert [f.seq for f in mixed] == [2, 3, 4] and mixed[0] == first[1]
    facts = await store.read(KEY)
    assert [(f.seq, f.kind, f.key) for f in facts] == [
        (0, "message", None), (1, "summary", "k-summary"), (2, "checkpoint", "k-checkpoint"), (3, "message", None),
        (4, "checkpoint", "k-later")]
    assert [(s.messages, s.checkpoints, s.entries) async for s in store.sessions()] == [(2, 2, 5)]
    with pytest.raises(ConflictError):  # a known key does not lift the seq check
        await store.append(KEY, 3, [summary], TS)


async def test_sessions_lists_counts(store: FactLog) -> None:
    summary = NewFact(kind="summary", index=None, source="proxy", message={"role": "system", "content": "s"})
    checkpoint = NewFact(kind="checkpoint", index=None, source="proxy", extra={"checkpoint": {}})
    await store.append(KEY, 0, [msg(0), msg(1, "assistant")], TS)
    await store.append(KEY, 2, [summary, checkpoint], TS + 5)
    await store.append(SessionKey("tenant-b", "run-1"), 0, [msg(0)], TS + 7)
    infos = sorted([s async for s in store.sessions()], key=lambda s: (s.tenant, s.session))
    assert infos == [
        SessionInfo(tenant="tenant-a", session="run-1", messages=2, checkpoints=1, updated_at=TS + 5,
                    entries=4),
        SessionInfo(tenant="tenant-b", session="run-1", messages=1, checkpoints=0, updated_at=TS + 7,
                    entries=1),
    ]


async def test_tenants_are_separate(store: FactLog) -> None:
    other = SessionKey("tenant-b", KEY.session)
    await store.append(KEY, 0, [msg(0), msg(1)], TS)
    await store.append(other, 0, [msg(7)], TS)
    assert [f.message for f in await store.read(other)] == [{"role": "user", "content": "m7"}]
    assert len(await store.read(KEY)) == 2
    assert await store.try_lock(KEY, "compact", "a", 30)
    assert await store.try_lock(other, "compact", "b", 30)


async def test_a_sub_agents_session_is_separate_from_its_parents(store: FactLog) -> None:
    """A sub-agent's session is ``<session>/<agent>``: its own log, lock and listing entry on every backend."""
    child = SessionKey(KEY.tenant, KEY.session + "/explore")
    await store.append(KEY, 0, [msg(0)], TS)
    await store.append(child, 0, [msg(5), msg(6)], TS + 1)
    assert [f.message for f in await store.read(child)] == [{"role": "user", "content": "m5"},
                                                            {"role": "user", "content": "m6"}]
    assert len(await store.read(KEY)) == 1
    assert await store.try_lock(KEY, "compact", "a", 30) and await store.try_lock(child, "compact", "b", 30)
    assert sorted([(s.session, s.messages) async for s in store.sessions()]) == [("run-1", 1), ("run-1/explore", 2)]


async def test_unknown_session_reads_empty(store: FactLog) -> None:
    assert await store.read(SessionKey("nobody", "nothing")) == []
    assert await store.read(SessionKey("nobody", "nothing"), after=5, limit=3) == []


async def test_locks(store: FactLog) -> None:
    assert await store.try_lock(KEY, "compact", "a", 30)
    assert not await store.try_lock(KEY, "compact", "b", 30)
    assert await store.try_lock(KEY, "compact", "a", 30), "the holder may renew"
    assert await store.try_lock(KEY, "other", "b", 30), "locks are per name"
    await store.unlock(KEY, "compact", "b")  # not the holder: no effect
    assert not await store.try_lock(KEY, "compact", "b", 30)
    await store.unlock(KEY, "compact", "a")
    assert await store.try_lock(KEY, "compact", "b", 30)


async def test_expired_lock_can_be_retaken(store: FactLog) -> None:
    assert await store.try_lock(KEY, "compact", "a", 0.05)
    for _ in range(400):
        if await store.try_lock(KEY, "compact", "b", 30):
            break
        await asyncio.sleep(0.005)
    else:
        raise AssertionError("expired lock was never released")
    await store.unlock(KEY, "compact", "a")  # the late former holder must not free b's lock
    assert not await store.try_lock(KEY, "compact", "c", 30)


async def test_ping(store: FactLog) -> None:
    await store.ping()


Opener = Callable[[], Awaitable[FactLog]]


@pytest.fixture(params=["sqlite", "redis"])
async def open_handle(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens handles on one fresh store of each backend, as separate processes would."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    opened: list[FactLog] = []

    async def open_one() -> FactLog:
        handle = RedisFactLog.from_url(url) if url else await SqliteFactLog.open(tmp_path / "facts.db")
        opened.append(handle)
        return handle

    if url:
        flusher = RedisFactLog.from_url(url)
        opened.append(flusher)
        await flusher.client.flushdb()
    try:
        yield open_one
    finally:
        for handle in opened:
            await handle.aclose()


async def test_secret_is_made_once_and_kept(open_handle: Opener) -> None:
    first = await open_handle()
    secret = await first.secret()
    assert len(secret) == 43  # 32 random bytes, base64url
    assert await first.secret() == secret
    await first.aclose()
    assert await (await open_handle()).secret() == secret


async def test_concurrent_first_secret_calls_agree(open_handle: Opener) -> None:
    handles = [await open_handle() for _ in range(3)]
    secrets = await asyncio.gather(*(handle.secret() for handle in handles for _ in range(4)))
    assert len(set(secrets)) == 1


async def test_the_signin_epoch_starts_at_0_and_every_end_moves_it_on_once(open_handle: Opener) -> None:
    handles = [await open_handle() for _ in range(3)]
    assert await handles[0].signin_epoch() == 0
    ends = await asyncio.gather(*(handle.end_signins() for handle in handles for _ in range(4)))
    assert sorted(ends) == list(range(1, 13))
    await handles[0].aclose()
    assert await (await open_handle()).signin_epoch() == 12


# ---- backend gone ---------------------------------------------------------------


async def test_redis_unreachable_is_store_unavailable() -> None:
    store = RedisFactLog.from_url(f"redis://127.0.0.1:{free_port()}/0")
    try:
        async with asyncio.timeout(5):
            with pytest.raises(StoreUnavailable):
                await store.ping()
            with pytest.raises(StoreUnavailable):
                await store.append(KEY, 0, [msg(0)], TS)
            with pytest.raises(StoreUnavailable):
                await store.read(KEY)
            with pytest.raises(StoreUnavailable):
                [s async for s in store.sessions()]
            with pytest.raises(StoreUnavailable):
                await store.try_lock(KEY, "compact", "a", 1)
    finally:
        await store.aclose()


async def test_sqlite_unusable_path_is_store_unavailable(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(StoreUnavailable):
        await SqliteFactLog.open(tmp_path / "a-file" / "facts.db")
    (tmp_path / "garbage.db").write_bytes(b"this is not a sqlite database" * 100)
    with pytest.raises(StoreUnavailable):
        await SqliteFactLog.open(tmp_path / "garbage.db")


# ---- codec and URLs -----------------------------------------------------------------


def test_codec_is_canonical_json() -> None:
    fact = NewFact(kind="message", index=3, source="upstream", message={"role": "assistant", "content": "é"},
                   extra={"usage": {"b": 1, "a": 2}})
    raw = codec.encode(fact, 7, 1.5)
    assert raw == (
        b'{"hash":null,"index":3,"kind":"message","message":{"content":"\xc3\xa9","role":"assistant"},'
        b'"seq":7,"source":"upstream","ts":1.5,"v":1,"x":{"usage":{"a":2,"b":1}}}'
    )
    assert codec.decode("x-1", raw) == StoredFact(
        id="x-1", seq=7, kind="message", index=3, source="upstream", message={"role": "assistant", "content": "é"},
        ts=1.5, extra={"usage": {"b": 1, "a": 2}},
    )


def test_codec_refuses_what_it_cannot_write_as_a_store_error() -> None:
    """orjson reads 1024 levels but writes 254: an upstream reply can be readable and still unwritable."""
    deep = orjson.loads("[" * 300 + "]" * 300)
    message = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": deep}}]}
    with pytest.raises(UnencodableFact):
        codec.encode(NewFact(kind="message", index=0, source="upstream", message=message), 0, 1.0)
    with pytest.raises(UnencodableFact):
        codec.check_encodable(message, {})
    with pytest.raises(UnencodableFact):
        codec.check_encodable({"role": "assistant", "content": "ok"}, {"usage": deep})
    codec.check_encodable({"role": "assistant", "content": "ok"}, {"usage": {"total_tokens": 3}})


async def test_open_store_by_scheme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = await open_store(f"sqlite:///{tmp_path / 'abs' / 'facts.db'}")
    assert isinstance(absolute, SqliteFactLog) and absolute.path == tmp_path / "abs" / "facts.db"
    await absolute.aclose()
    monkeypatch.chdir(tmp_path)
    relative = await open_store("sqlite:///rel/facts.db")
    assert isinstance(relative, SqliteFactLog) and relative.path == Path("rel/facts.db")
    await relative.aclose()
    assert (tmp_path / "rel" / "facts.db").exists()
    plain = await open_store("redis://127.0.0.1:1/0")
    assert isinstance(plain, RedisFactLog) and not isinstance(plain.client, RedisCluster)
    await plain.aclose()
    cluster = await open_store("redis://127.0.0.1:1/0?cluster=1")
    assert isinstance(cluster, RedisFactLog) and isinstance(cluster.client, RedisCluster)
    await cluster.aclose()
    for bad in ("postgres://x/y", "sqlite://", "sqlite:///", "/tmp/facts.db"):
        with pytest.raises(ValueError):
            await open_store(bad)


# ---- SQLite specifics -------------------------------------------------------------------


async def test_sqlite_layout_and_migrations(tmp_path: Path) -> None:
    path = tmp_path / "facts.db"
    for _ in range(2):  # reopening applies nothing twice
        store = await SqliteFactLog.open(path)
        await store.aclose()
    store = await SqliteFactLog.open(path)
    await store.append(KEY, 0, [msg(0)], TS)
    await store.aclose()
    with closing(sqlite3.connect(path)) as conn:
        names = [row[0] for row in conn.execute("SELECT name FROM _migrations ORDER BY rowid")]
        assert names == [name for name, _ in MIGRATIONS] == ["m001_facts", "m002_sessions", "m003_locks",
                                                             "m004_secret", "m005_credential_links",
                                                             "m006_fact_keys", "m007_signin_epoch",
                                                             "m008_scoped_links"]
        rows = conn.execute("SELECT tenant, session, seq, kind, idx, body FROM facts").fetchall()
        assert rows == [("tenant-a", "run-1", 0, "message", 0, codec.encode(msg(0), 0, TS))]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_sqlite_a_file_from_before_fact_keys_is_migrated_and_keeps_its_log(tmp_path: Path) -> None:
    path = tmp_path / "facts.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:  # a file the first four migrations made
        conn.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
        for name, fn in MIGRATIONS[:4]:
            fn(conn)
            conn.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, TS))
        conn.execute("INSERT INTO facts VALUES (?, ?, 0, 'message', 0, ?)", (*KEY, codec.encode(msg(0), 0, TS)))
        conn.execute("INSERT INTO sessions VALUES (?, ?, 1, 1, 0, ?)", (*KEY, TS))
    store = await SqliteFactLog.open(path)
    try:
        checkpoint = NewFact(kind="checkpoint", index=1, source="proxy", extra={"checkpoint": {}}, key="k")
        first = await store.append(KEY, 1, [checkpoint], TS)
        assert await store.append(KEY, 2, [checkpoint], TS) == first
        assert [(f.seq, f.key) for f in await store.read(KEY)] == [(0, None), (1, "k")]
    finally:
        await store.aclose()


async def test_sqlite_two_handles_share_one_file(tmp_path: Path) -> None:
    a = await SqliteFactLog.open(tmp_path / "facts.db")
    b = await SqliteFactLog.open(tmp_path / "facts.db")
    try:
        seqs = await asyncio.gather(*(append_retrying(a if i % 2 else b, KEY, msg(i)) for i in range(20)))
        assert sorted(seqs) == list(range(20))
        assert [f.seq for f in await a.read(KEY)] == [f.seq for f in await b.read(KEY)] == list(range(20))
    finally:
        await a.aclose()
        await b.aclose()


# ---- Redis specifics ----------------------------------------------------------------------


async def test_redis_keys_are_the_contract_names(redis_store: RedisFactLog) -> None:
    key = SessionKey("t1", "s1")
    facts = [msg(0), NewFact(kind="checkpoint", index=None, source="proxy", key="k")]
    stored = await redis_store.append(key, 0, facts, TS)
    assert await redis_store.try_lock(key, "compact", "tok", 30)
    client = redis_store.client
    names = {name.decode() if isinstance(name, bytes) else name for name in await client.keys("*")}
    assert names == {"ctxproxy:{t1:s1}:log", "ctxproxy:{t1:s1}:meta", "ctxproxy:{t1:s1}:lock:compact",
                     "ctxproxy:{t1:s1}:fact-keys"}
    assert {key_slot(name.encode()) for name in names} == {key_slot(b"t1:s1")}
    assert [f.id for f in stored] == ["1-0", "2-0"]
    entries = await client.xrange("ctxproxy:{t1:s1}:log")
    assert entries == [(b"1-0", {b"f": codec.encode(facts[0], 0, TS)}), (b"2-0", {b"f": codec.encode(facts[1], 1, TS)})]
    assert await client.hgetall("ctxproxy:{t1:s1}:meta") == {
        b"next_seq": b"2", b"messages": b"1", b"checkpoints": b"1", b"updated_at": repr(TS).encode(),
        b"tenant": b"t1", b"session": b"s1",
    }
    assert await client.hgetall("ctxproxy:{t1:s1}:fact-keys") == {b"k": b"1"}


async def test_redis_secret_key_is_the_constant(redis_store: RedisFactLog) -> None:
    secret = await redis_store.secret()
    assert await redis_store.client.keys("*") == [b"ctxproxy:secret"]
    assert await redis_store.client.get("ctxproxy:secret") == secret


async def test_redis_refuses_when_meta_and_stream_disagree(redis_store: RedisFactLog) -> None:
    await redis_store.append(KEY, 0, [msg(0), msg(1)], TS)
    await redis_store.client.delete("ctxproxy:{tenant-a:run-1}:meta")
    with pytest.raises(StoreUnavailable, match="ends at 2-0"):
        await redis_store.append(KEY, 0, [msg(5), msg(6)], TS)
    assert [f.seq for f in await redis_store.read(KEY)] == [0, 1]


async def test_redis_commands_wait_for_a_pooled_connection_instead_of_failing(redis_url: str) -> None:
    store = RedisFactLog.from_url(redis_url + "?max_connections=2")
    try:
        await store.client.flushdb()
        await store.append(KEY, 0, [msg(i) for i in range(5)], TS)
        reads = await asyncio.gather(*(store.read(KEY) for _ in range(50)))
        assert [len(facts) for facts in reads] == [5] * 50
        assert store.client.connection_pool.max_connections == 2
    finally:
        await store.aclose()


async def test_redis_pool_size_comes_from_the_url() -> None:
    default = RedisFactLog.from_url("redis://127.0.0.1:1/0")
    sized = RedisFactLog.from_url("redis://127.0.0.1:1/0?max_connections=300&cluster=0")
    try:
        assert default.client.connection_pool.max_connections == DEFAULT_MAX_CONNECTIONS
        assert sized.client.connection_pool.max_connections == 300
    finally:
        await default.aclose()
        await sized.aclose()
    for bad in ("0", "-1", "many", ""):
        with pytest.raises(ValueError, match="max_connections"):
            RedisFactLog.from_url(f"redis://127.0.0.1:1/0?max_connections={bad}")


async def test_redis_connections_pack_commands_with_hiredis_as_redis_py_would() -> None:
    """Each scheme keeps the connection class redis-py gives it (TLS, a unix socket), packing commands with hiredis
    into the very bytes redis-py's own packing makes."""
    for url, kind in (("redis://127.0.0.1:1/0", Connection), ("rediss://127.0.0.1:1/0", SSLConnection),
                      ("unix:///tmp/ctxproxy-none.sock", UnixDomainSocketConnection)):
        store = RedisFactLog.from_url(url)
        try:
            made = store.client.connection_pool.connection_class
            assert issubclass(made, kind) and issubclass(made, HiredisPacking), url
        finally:
            await store.aclose()
    args = ("EVALSHA", "0" * 40, 3, "ctxproxy:{t:é}:log", 1.5, repr(TS), "", b"\x00\xff raw", "text 😀", -7)
    assert b"".join(PackedConnection().pack_command(*args)) == b"".join(Connection().pack_command(*args))


async def test_redis_restart_keeps_log_and_reconnects(tmp_path: Path) -> None:
    server = RedisProcess(free_port(), tmp_path / "redis", ["--appendonly", "yes"])
    server.start()
    store = RedisFactLog.from_url(server.url)
    try:
        await store.append(KEY, 0, [msg(0), msg(1)], TS)
        server.stop()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.append(KEY, 2, [msg(2)], TS)
        assert time.monotonic() - started < 3
        server.start()
        await store.append(KEY, 2, [msg(2)], TS)
        server.stop()  # and back, with no command in between: the stale pooled connection must be replaced
        server.start()
        await store.append(KEY, 3, [msg(3)], TS)
        assert [f.seq for f in await store.read(KEY)] == [0, 1, 2, 3]
        with pytest.raises(ConflictError) as info:
            await store.append(KEY, 2, [msg(9)], TS)
        assert info.value.actual_seq == 4
    finally:
        await store.aclose()
        if server.proc is not None:
            server.stop()
