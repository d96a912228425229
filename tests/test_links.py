"""The store's part in sessions that outlive a credential: the index of tenants per session id and the links
(``FactLog.note_tenant`` / ``tenants_of`` / ``link`` / ``link_of``), on both backends."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

from redis.crc import key_slot

from proxy.constants import link_key, tenants_key
from proxy.store import FactLog, NewFact, SessionKey
from proxy.store.base import TENANTS_KEPT, FirstLook
from proxy.store.redis import RedisFactLog
from proxy.store.sqlite import MIGRATIONS, SqliteFactLog, _migrate

TS = 1_700_000_000.0


async def test_tenants_of_a_session_id_newest_first_and_bounded(store: FactLog) -> None:
    assert await store.tenants_of("run-1") == []
    await store.note_tenant("run-1", "t-old", TS)
    await store.note_tenant("run-1", "t-new", TS + 1)
    await store.note_tenant("run-2", "t-other", TS + 2)
    assert await store.tenants_of("run-1") == ["t-new", "t-old"]
    await store.note_tenant("run-1", "t-old", TS + 3)  # seen again: moves up
    assert await store.tenants_of("run-1") == ["t-old", "t-new"]
    for n in range(TENANTS_KEPT + 4):
        await store.note_tenant("run-1", f"t-{n:02d}", TS + 10 + n)
    kept = await store.tenants_of("run-1")
    assert kept == [f"t-{n:02d}" for n in reversed(range(4, TENANTS_KEPT + 4))]
    assert await store.tenants_of("run-2") == ["t-other"]


async def test_a_link_is_made_once_and_never_changed(store: FactLog) -> None:
    key = SessionKey("t-new", "run-1")
    assert await store.link_of(key) is None
    assert await store.link(key, "t-old", TS) == "t-old"
    assert await store.link(key, "t-someone", TS + 1) == "t-old", "the first link wins"
    assert await store.link_of(key) == "t-old"
    assert await store.link_of(SessionKey("t-new", "run-2")) is None
    assert await store.link_of(SessionKey("t-old", "run-1")) is None
    assert [info async for info in store.sessions()] == [], "a link is not a session"


async def test_concurrent_links_agree(store: FactLog) -> None:
    key = SessionKey("t-new", "run-1")
    linked = await asyncio.gather(*(store.link(key, f"t-{n}", TS) for n in range(6)))
    assert len(set(linked)) == 1 and linked[0] == await store.link_of(key)


async def test_redis_keys_of_the_index_and_the_links(redis_store: RedisFactLog) -> None:
    """The link lives in the new tenant's session slot, the index in its session id's own; both as README says."""
    await redis_store.note_tenant("run-1", "t-old", TS)
    await redis_store.link(SessionKey("t-new", "run-1"), "t-old", TS)
    names = sorted([name.decode() async for name in redis_store.client.scan_iter()])
    assert names == ["ctxproxy:tenants:{run-1}", "ctxproxy:{t-new:run-1}:link"]
    assert names == sorted([tenants_key("run-1"), link_key("t-new", "run-1")])
    assert key_slot(b"ctxproxy:{t-new:run-1}:link") == key_slot(b"ctxproxy:{t-new:run-1}:log")


async def test_sqlite_migration_notes_the_sessions_already_logged(tmp_path: Path) -> None:
    """A store made before the index existed: its sessions are candidates from the first start on."""
    path = tmp_path / "facts.db"
    store = await SqliteFactLog.open(path)
    await store.append(SessionKey("t-old", "run-1"), 0, [NewFact(kind="message", index=0, source="client",
                                                                  message={"role": "user", "content": "hi"},
                                                                  hash="h0")], TS)
    await store.aclose()
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:  # back to the schema before it
        conn.execute("DROP TABLE session_tenants")
        conn.execute("DROP TABLE links")
        conn.execute("DELETE FROM _migrations WHERE name = 'm005_credential_links'")
        _migrate(conn)
        assert "m005_credential_links" in [name for name, _ in MIGRATIONS]
    store = await SqliteFactLog.open(path)
    try:
        assert await store.tenants_of("run-1") == ["t-old"]
    finally:
        await store.aclose()


async def test_first_look_is_the_log_its_link_and_who_else_holds_the_id(store: FactLog) -> None:
    await first_look_contract(store)


async def first_look_contract(store: FactLog) -> None:
    """One store call for a session new here: its first entries, its link, and the other tenants of its session
    id, noting the own tenant only when nobody else holds the id (the caller decides otherwise)."""
    key = SessionKey("t-new", "run-1")
    assert await store.first_look(key, 10, TS) == FirstLook([], None, [])
    assert await store.tenants_of("run-1") == ["t-new"], "alone: noted in the same call"
    facts = [NewFact(kind="message", index=i, source="client", message={"role": "user", "content": f"m{i}"},
                     hash=f"h{i}") for i in range(4)]
    await store.append(key, 0, facts, TS)
    assert await store.first_look(key, 10, TS + 1) == FirstLook(await store.read(key), None, []), "only itself"
    assert await store.first_look(SessionKey("t-second", "run-1"), 10, TS + 2) == FirstLook([], None, ["t-new"])
    assert await store.tenants_of("run-1") == ["t-new"], "not alone: not noted"
    await store.link(key, "t-old", TS)
    await store.note_tenant("run-1", "t-old", TS + 3)
    looked = await store.first_look(key, 3, TS + 4)
    assert looked == FirstLook(await store.read(key, limit=3), "t-old", ["t-old"])
    assert [f.digest for f in looked.facts] == [f.digest for f in await store.read(key, limit=3)]
    assert await store.first_look(SessionKey("t-old", "run-2"), 10, TS + 5) == FirstLook([], None, [])
    assert await store.tenants_of("run-2") == ["t-old"]
