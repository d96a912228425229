"""The store's part in sessions that outlive a credential: the index of tenants per session id (owners before
probers, each with its conversation's opening) and the scoped links (``FactLog.note_tenant`` / ``tenants_of`` /
``link`` / ``link_of``), on both backends."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

from redis.crc import key_slot

from proxy.constants import link_key, openings_key, tenants_key
from proxy.store import FactLog, NewFact, SessionKey
from proxy.store.base import OPENINGS_KEPT, TENANTS_KEPT, FirstLook, Link, Tenant
from proxy.store.redis import RedisFactLog
from proxy.store.sqlite import MIGRATIONS, SqliteFactLog, _migrate

TS = 1_700_000_000.0
OLD = Link("t-old", 4, "p-old")


async def names_of(store: FactLog, session: str) -> list[str]:
    return [tenant.name for tenant in await store.tenants_of(session)]


async def test_tenants_of_a_session_id_newest_first_and_bounded(store: FactLog) -> None:
    assert await store.tenants_of("run-1") == []
    await store.note_tenant("run-1", "t-old", TS)
    await store.note_tenant("run-1", "t-new", TS + 1)
    await store.note_tenant("run-2", "t-other", TS + 2)
    assert await names_of(store, "run-1") == ["t-new", "t-old"]
    await store.note_tenant("run-1", "t-old", TS + 3)  # seen again: moves up
    assert await names_of(store, "run-1") == ["t-old", "t-new"]
    for n in range(TENANTS_KEPT + 4):
        await store.note_tenant("run-1", f"t-{n:02d}", TS + 10 + n)
    kept = await names_of(store, "run-1")
    assert kept == [f"t-{n:02d}" for n in reversed(range(4, TENANTS_KEPT + 4))]
    assert await names_of(store, "run-2") == ["t-other"]


async def test_probers_never_push_an_owner_out(store: FactLog) -> None:
    """A tenant noted while others held the id ranks below every owner, however new, and a later note never
    demotes an owner; each keeps the newest openings it was noted with."""
    await store.note_tenant("run-1", "t-owner", TS, "o-owner")
    for n in range(TENANTS_KEPT + 4):
        await store.note_tenant("run-1", f"t-probe-{n:02d}", TS + 10 + n, f"o-{n}", owner=False)
    await store.note_tenant("run-1", "t-owner", TS + 100, "o-later", owner=False)
    kept = await store.tenants_of("run-1")
    assert kept[0] == Tenant("t-owner", ("o-later", "o-owner")) and len(kept) == TENANTS_KEPT
    assert [t.name for t in kept[1:]] == [f"t-probe-{n:02d}" for n in reversed(range(5, TENANTS_KEPT + 4))]


async def test_a_tenants_openings_newest_first_and_bounded(store: FactLog) -> None:
    for n in range(OPENINGS_KEPT + 2):
        await store.note_tenant("run-1", "t-owner", TS + n, f"o-{n}")
    await store.note_tenant("run-1", "t-owner", TS + 10, "o-3")  # seen again: moves up
    await store.note_tenant("run-1", "t-owner", TS + 11)  # no opening: the ones known stay
    expected = ("o-3", *(f"o-{n}" for n in reversed(range(OPENINGS_KEPT + 2)) if n != 3))[:OPENINGS_KEPT]
    assert await store.tenants_of("run-1") == [Tenant("t-owner", expected)]


async def test_a_link_is_made_once_and_never_changed(store: FactLog) -> None:
    key = SessionKey("t-new", "run-1")
    assert await store.link_of(key) is None
    assert await store.link(key, OLD, TS) == OLD
    assert await store.link(key, Link("t-someone", 9, "p-someone"), TS + 1) == OLD, "the first link wins"
    assert await store.link_of(key) == OLD
    assert await store.link_of(SessionKey("t-new", "run-2")) is None
    assert await store.link_of(SessionKey("t-old", "run-1")) is None
    assert [info async for info in store.sessions()] == [], "a link is not a session"


async def test_concurrent_links_agree(store: FactLog) -> None:
    key = SessionKey("t-new", "run-1")
    linked = await asyncio.gather(*(store.link(key, Link(f"t-{n}", n + 1, f"p-{n}"), TS) for n in range(6)))
    assert len(set(linked)) == 1 and linked[0] == await store.link_of(key)


async def test_redis_keys_of_the_index_and_the_links(redis_store: RedisFactLog) -> None:
    """The link lives in the new tenant's session slot, the index in its session id's own; both as README says."""
    await redis_store.note_tenant("run-1", "t-old", TS, "o-old")
    await redis_store.link(SessionKey("t-new", "run-1"), OLD, TS)
    names = sorted([name.decode() async for name in redis_store.client.scan_iter()])
    assert names == ["ctxproxy:openings:{run-1}", "ctxproxy:tenants:{run-1}", "ctxproxy:{t-new:run-1}:link"]
    assert names == sorted([openings_key("run-1"), tenants_key("run-1"), link_key("t-new", "run-1")])
    assert key_slot(b"ctxproxy:{t-new:run-1}:link") == key_slot(b"ctxproxy:{t-new:run-1}:log")
    assert key_slot(b"ctxproxy:openings:{run-1}") == key_slot(b"ctxproxy:tenants:{run-1}")


async def test_a_link_from_before_scopes_serves_nothing_and_is_replaced(store: FactLog) -> None:
    """A link stored before links had a scope (Redis: the tenant alone; SQLite: the row as migration m008 leaves
    it) reads as one with no scope, which the next proof replaces; a scoped one is never replaced."""
    key = SessionKey("t-new", "run-1")
    if isinstance(store, RedisFactLog):
        await store.client.set(link_key(*key), "t-old")
    else:
        assert isinstance(store, SqliteFactLog)
        with closing(sqlite3.connect(store.path, isolation_level=None)) as conn:
            conn.execute("INSERT INTO links (tenant, session, target, linked_at) VALUES (?, ?, 't-old', ?)", (*key, TS))
    assert await store.link_of(key) == Link("t-old", 0, "")
    assert await store.link(key, OLD, TS) == OLD
    assert await store.link(key, Link("t-other", 2, "p-other"), TS) == OLD


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
        conn.execute("DELETE FROM _migrations WHERE name IN ('m005_credential_links', 'm008_scoped_links')")
        _migrate(conn)
        assert "m005_credential_links" in [name for name, _ in MIGRATIONS]
    store = await SqliteFactLog.open(path)
    try:
        assert await store.tenants_of("run-1") == [Tenant("t-old", ())]
        assert await store.link_of(SessionKey("t-old", "run-1")) is None
    finally:
        await store.aclose()


async def test_first_look_is_the_log_its_link_and_who_else_holds_the_id(store: FactLog) -> None:
    await first_look_contract(store)


async def first_look_contract(store: FactLog) -> None:
    """One store call for a session new here: its first entries, its link, and the other tenants of its session
    id with their openings, noting the own tenant with its opening: an owner when nobody else holds the id, else
    a prober."""
    key = SessionKey("t-new", "run-1")
    assert await store.first_look(key, 10, TS, "o-new") == FirstLook([], None, [])
    assert await store.tenants_of("run-1") == [Tenant("t-new", ("o-new",))], "alone: noted in the same call"
    facts = [NewFact(kind="message", index=i, source="client", message={"role": "user", "content": f"m{i}"},
                     hash=f"h{i}") for i in range(4)]
    await store.append(key, 0, facts, TS)
    assert await store.first_look(key, 10, TS + 1) == FirstLook(await store.read(key), None, []), "only itself"
    second = await store.first_look(SessionKey("t-second", "run-1"), 10, TS + 2, "o-second")
    assert second == FirstLook([], None, [Tenant("t-new", ("o-new",))])
    assert await names_of(store, "run-1") == ["t-new", "t-second"], "not alone: noted as a prober, after the owner"
    await store.link(key, OLD, TS)
    await store.note_tenant("run-1", "t-old", TS + 3)
    looked = await store.first_look(key, 3, TS + 4)
    assert looked == FirstLook(await store.read(key, limit=3), OLD,
                               [Tenant("t-old", ()), Tenant("t-second", ("o-second",))])
    assert [f.digest for f in looked.facts] == [f.digest for f in await store.read(key, limit=3)]
    assert await store.first_look(SessionKey("t-old", "run-2"), 10, TS + 5) == FirstLook([], None, [])
    assert await names_of(store, "run-2") == ["t-old"]
