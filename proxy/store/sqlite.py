"""The embedded fact log: one SQLite file, shareable by several proxy processes.

Threading: sqlite3 blocks, so every call runs on one dedicated worker thread
that owns the connection. One thread means statements of this process never
interleave, and the event loop never waits on disk.

Concurrency between processes: WAL lets readers proceed during a write, and
each append is a ``BEGIN IMMEDIATE`` transaction, which takes the write lock
*before* reading ``next_seq``; the expected-seq check and the inserts are
therefore atomic across processes. A writer that cannot get the lock within
``busy_timeout`` gets ``StoreUnavailable``, never a half-written batch. The
same transaction compares the last entry's digest with the writer's ``tail``
and looks up the keys of keyed facts (``fact_key``, a unique index): a fact
already logged is not written again.

A lost tail: SQLite loses committed writes only with the process that made
them (``synchronous = NORMAL`` in WAL mode, on a power cut), so no running
process holds state ahead of the file, except after a restore under running
processes (the online backup API writing an older copy into the live file).
The ``tail`` check and ``HistoryManager``'s reload cover that case as they do
for Redis.

Schema: append-only named migrations, applied on open and recorded in
``_migrations`` (the pattern of simonw/llm). Never edit a shipped migration;
add a new one.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from proxy.errors import ConflictError, StoreUnavailable
from proxy.store import codec
from proxy.store.base import (
    OPENINGS_KEPT,
    TENANTS_KEPT,
    FactLog,
    FirstLook,
    Link,
    NewFact,
    SessionInfo,
    SessionKey,
    StoredFact,
    Tenant,
)

T = TypeVar("T")

Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[tuple[str, Migration]] = []

#: Seconds opening a file may keep retrying while other processes open (and migrate) it too.
OPEN_DEADLINE = 30.0
#: Sessions fetched per round trip by ``sessions()``; bounds memory on large stores.
SESSIONS_PAGE = 500


def migration(fn: Migration) -> Migration:
    """Register ``fn`` under its name; the order of definition is the order of application."""
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_facts(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TABLE facts (
            tenant TEXT NOT NULL,
            session TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            idx INTEGER,
            body BLOB NOT NULL,
            PRIMARY KEY (tenant, session, seq)
        )"""
    )


@migration
def m002_sessions(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TABLE sessions (
            tenant TEXT NOT NULL,
            session TEXT NOT NULL,
            next_seq INTEGER NOT NULL,
            messages INTEGER NOT NULL,
            checkpoints INTEGER NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (tenant, session)
        )"""
    )


@migration
def m003_locks(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TABLE locks (
            tenant TEXT NOT NULL,
            session TEXT NOT NULL,
            name TEXT NOT NULL,
            token TEXT NOT NULL,
            expires_at REAL NOT NULL,
            PRIMARY KEY (tenant, session, name)
        )"""
    )


@migration
def m004_secret(conn: sqlite3.Connection) -> None:
    # One row at most: the server secret (``FactLog.secret``).
    conn.execute("CREATE TABLE secret (id INTEGER PRIMARY KEY CHECK (id = 1), value TEXT NOT NULL)")


@migration
def m005_credential_links(conn: sqlite3.Connection) -> None:
    # Which tenants hold a session id (``FactLog.note_tenant``; the sessions logged so far are noted here), and
    # the links of a new credential's tenant to the session it continues (``FactLog.link``: set once).
    conn.execute(
        """CREATE TABLE session_tenants (
            session TEXT NOT NULL,
            tenant TEXT NOT NULL,
            noted_at REAL NOT NULL,
            PRIMARY KEY (session, tenant)
        )"""
    )
    conn.execute("INSERT INTO session_tenants (session, tenant, noted_at) SELECT session, tenant, updated_at "
                 "FROM sessions")
    conn.execute(
        """CREATE TABLE links (
            tenant TEXT NOT NULL,
            session TEXT NOT NULL,
            target TEXT NOT NULL,
            linked_at REAL NOT NULL,
            PRIMARY KEY (tenant, session)
        )"""
    )


@migration
def m006_fact_keys(conn: sqlite3.Connection) -> None:
    # ``NewFact.key``: at most one fact per key and session; facts without one (messages, rewinds) are not indexed.
    conn.execute("ALTER TABLE facts ADD COLUMN fact_key TEXT")
    conn.execute("CREATE UNIQUE INDEX facts_by_key ON facts (tenant, session, fact_key) WHERE fact_key IS NOT NULL")


@migration
def m007_signin_epoch(conn: sqlite3.Connection) -> None:
    # One row at most: the inspector's sign-in epoch (``FactLog.signin_epoch``); no row reads as 0.
    conn.execute("CREATE TABLE signin_epoch (id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL)")


@migration
def m008_scoped_links(conn: sqlite3.Connection) -> None:
    # A link's scope (``Link.proved``, ``Link.prefix``; a link made before has none and serves nothing), and per
    # noted tenant its rank (the tenants noted so far held a logged session: owners) and its conversations'
    # openings (space-separated, newest first).
    conn.execute("ALTER TABLE links ADD COLUMN proved INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE links ADD COLUMN prefix TEXT NOT NULL DEFAULT ''")
    conn.execute("ALTER TABLE session_tenants ADD COLUMN owner INTEGER NOT NULL DEFAULT 1")
    conn.execute("ALTER TABLE session_tenants ADD COLUMN opening TEXT NOT NULL DEFAULT ''")


@contextmanager
def map_sqlite_errors(path: Path) -> Iterator[None]:
    """The one place driver and filesystem errors become ``StoreUnavailable``."""
    try:
        yield
    except (sqlite3.Error, OSError) as exc:
        raise StoreUnavailable(f"sqlite store {path}: {exc}") from exc


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction that holds the database write lock from its first statement."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        # SQLite rolls back by itself on some errors (disk full, I/O); a second ROLLBACK would mask the cause.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _connect(path: Path) -> sqlite3.Connection:
    """Open, switch to WAL and migrate; retried while another process does the same to a new file.

    Switching a file to WAL needs it to itself, and SQLite answers "database is
    locked" there without always waiting out ``busy_timeout`` (two workers of
    ``serve --workers`` starting on a new file hit it), so the whole opening is
    retried, for ``OPEN_DEADLINE`` seconds at most.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + OPEN_DEADLINE
    while True:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves (BEGIN IMMEDIATE is not expressible otherwise).
        conn = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            _migrate(conn)
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        except BaseException:
            conn.close()
            raise
        time.sleep(0.05)  # on the store's own thread: another process is opening the same new file


def _migrate(conn: sqlite3.Connection) -> None:
    # Inside one IMMEDIATE transaction so two processes opening a new file do not both migrate.
    with immediate(conn):
        conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
        done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
        for name, fn in MIGRATIONS:
            if name not in done:
                fn(conn)
                conn.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, time.time()))


def _append(
    conn: sqlite3.Connection, key: SessionKey, expected_seq: int, facts: Sequence[NewFact], ts: float,
    tail: str | None,
) -> list[StoredFact]:
    with immediate(conn):
        row = conn.execute(
            "SELECT next_seq FROM sessions WHERE tenant = ? AND session = ?", (key.tenant, key.session)
        ).fetchone()
        actual = row[0] if row else 0
        if actual != expected_seq:
            raise ConflictError(f"log of {key.session} is at seq {actual}, not {expected_seq}", actual_seq=actual)
        if tail is not None:
            last = conn.execute(
                "SELECT body FROM facts WHERE tenant = ? AND session = ? AND seq = ?",
                (key.tenant, key.session, expected_seq - 1),
            ).fetchone()
            if last is None or codec.digest(last[0]) != tail:
                raise ConflictError(f"log of {key.session} no longer ends with the entry {expected_seq - 1} the "
                                    "writer saw", actual_seq=actual)
        logged = _logged(conn, key, facts)
        fresh = [fact for i, fact in enumerate(facts) if i not in logged]
        bodies = [codec.encode(fact, expected_seq + i, ts) for i, fact in enumerate(fresh)]
        if fresh:
            conn.executemany(
                "INSERT INTO facts (tenant, session, seq, kind, idx, body, fact_key) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (key.tenant, key.session, expected_seq + i, fact.kind, fact.index, body, fact.key)
                    for i, (fact, body) in enumerate(zip(fresh, bodies, strict=True))
                ],
            )
            messages, checkpoints = codec.counts(fresh)
            conn.execute(
                """INSERT INTO sessions (tenant, session, next_seq, messages, checkpoints, updated_at)
                   VALUES (?, ?, ?, ?, ?, ?)
                   ON CONFLICT (tenant, session) DO UPDATE SET
                     next_seq = excluded.next_seq,
                     messages = sessions.messages + excluded.messages,
                     checkpoints = sessions.checkpoints + excluded.checkpoints,
                     updated_at = excluded.updated_at""",
                (key.tenant, key.session, expected_seq + len(fresh), messages, checkpoints, ts),
            )
    written = iter([codec.written(fact, str(expected_seq + i), expected_seq + i, ts, body)
                    for i, (fact, body) in enumerate(zip(fresh, bodies, strict=True))])
    return [logged[i] if i in logged else next(written) for i in range(len(facts))]


def _logged(conn: sqlite3.Connection, key: SessionKey, facts: Sequence[NewFact]) -> dict[int, StoredFact]:
    """The entries already logged for keyed ``facts``, by position in ``facts``."""
    positions = {fact.key: i for i, fact in enumerate(facts) if fact.key is not None}
    if not positions:
        return {}
    marks = ", ".join("?" * len(positions))
    rows = conn.execute(
        f"SELECT fact_key, seq, body FROM facts WHERE tenant = ? AND session = ? AND fact_key IN ({marks})",
        (key.tenant, key.session, *positions),
    ).fetchall()
    return {positions[fact_key]: codec.decode(str(seq), body) for fact_key, seq, body in rows}


def _read(conn: sqlite3.Connection, key: SessionKey, after: int, limit: int | None) -> list[StoredFact]:
    rows = conn.execute(
        "SELECT seq, body FROM facts WHERE tenant = ? AND session = ? AND seq > ? ORDER BY seq LIMIT ?",
        (key.tenant, key.session, after, -1 if limit is None else limit),
    ).fetchall()
    return [codec.decode(str(seq), body) for seq, body in rows]


def _sessions_page(conn: sqlite3.Connection, after: tuple[str, str]) -> list[SessionInfo]:
    rows = conn.execute(
        """SELECT tenant, session, messages, checkpoints, updated_at, next_seq FROM sessions
           WHERE (tenant, session) > (?, ?) ORDER BY tenant, session LIMIT ?""",
        (*after, SESSIONS_PAGE),
    ).fetchall()
    return [SessionInfo(*row) for row in rows]


def _try_lock(conn: sqlite3.Connection, key: SessionKey, name: str, token: str, ttl: float) -> bool:
    now = time.time()
    with immediate(conn):
        # Take if free, expired, or already ours (then the ttl is renewed); otherwise the WHERE leaves it.
        cur = conn.execute(
            """INSERT INTO locks (tenant, session, name, token, expires_at) VALUES (?, ?, ?, ?, ?)
               ON CONFLICT (tenant, session, name) DO UPDATE SET
                 token = excluded.token, expires_at = excluded.expires_at
               WHERE locks.expires_at <= ? OR locks.token = excluded.token""",
            (key.tenant, key.session, name, token, now + ttl, now),
        )
        return cur.rowcount == 1


def _unlock(conn: sqlite3.Connection, key: SessionKey, name: str, token: str) -> None:
    with immediate(conn):
        conn.execute(
            "DELETE FROM locks WHERE tenant = ? AND session = ? AND name = ? AND token = ?",
            (key.tenant, key.session, name, token),
        )


def _secret(conn: sqlite3.Connection, candidate: str) -> bytes:
    # Inside one write transaction: of two processes asking at once, the first inserts, the second finds its row.
    with immediate(conn):
        conn.execute("INSERT OR IGNORE INTO secret (id, value) VALUES (1, ?)", (candidate,))
        (value,) = conn.execute("SELECT value FROM secret WHERE id = 1").fetchone()
    return str(value).encode()


def _signin_epoch(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM signin_epoch WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


def _end_signins(conn: sqlite3.Connection) -> int:
    with immediate(conn):
        conn.execute("INSERT INTO signin_epoch (id, value) VALUES (1, 1) "
                     "ON CONFLICT (id) DO UPDATE SET value = value + 1")
        return _signin_epoch(conn)


def _note_tenant(conn: sqlite3.Connection, session: str, tenant: str, ts: float, opening: str, owner: bool) -> None:
    # Rows are one per (session id, tenant) that ever held it; ``_tenants_of`` reads the first ranked only.
    with immediate(conn):
        row = conn.execute("SELECT opening FROM session_tenants WHERE session = ? AND tenant = ?",
                           (session, tenant)).fetchone()
        known = str(row[0]).split() if row is not None else []
        openings = [opening, *(o for o in known if o != opening)][:OPENINGS_KEPT] if opening else known
        conn.execute("""INSERT INTO session_tenants (session, tenant, noted_at, owner, opening) VALUES (?, ?, ?, ?, ?)
                        ON CONFLICT (session, tenant) DO UPDATE SET noted_at = max(noted_at, excluded.noted_at),
                          owner = max(owner, excluded.owner), opening = excluded.opening""",
                     (session, tenant, ts, int(owner), " ".join(openings)))


def _tenants_of(conn: sqlite3.Connection, session: str) -> list[Tenant]:
    rows = conn.execute("SELECT tenant, opening FROM session_tenants WHERE session = ? "
                        "ORDER BY owner DESC, noted_at DESC, tenant LIMIT ?", (session, TENANTS_KEPT)).fetchall()
    return [Tenant(str(name), tuple(str(openings).split())) for name, openings in rows]


def _others_noting(conn: sqlite3.Connection, session: str, tenant: str, ts: float, opening: str) -> list[Tenant]:
    others = [t for t in _tenants_of(conn, session) if t.name != tenant]
    _note_tenant(conn, session, tenant, ts, opening, not others)
    return others


def _link(conn: sqlite3.Connection, key: SessionKey, link: Link, ts: float) -> Link:
    with immediate(conn):
        conn.execute("""INSERT INTO links (tenant, session, target, linked_at, proved, prefix) VALUES (?, ?, ?, ?, ?, ?)
                        ON CONFLICT (tenant, session) DO UPDATE SET target = excluded.target,
                          linked_at = excluded.linked_at, proved = excluded.proved, prefix = excluded.prefix
                        WHERE links.prefix = ''""", (*key, link.tenant, ts, link.proved, link.prefix))
        found = _link_of(conn, key)
    return found if found is not None else link  # the row was written just now: never None


def _link_of(conn: sqlite3.Connection, key: SessionKey) -> Link | None:
    row = conn.execute("SELECT target, proved, prefix FROM links WHERE tenant = ? AND session = ?", key).fetchone()
    return None if row is None else Link(str(row[0]), int(row[1]), str(row[2]))


def _first_look(conn: sqlite3.Connection, key: SessionKey, limit: int, ts: float, opening: str) -> FirstLook:
    others = _others_noting(conn, key.session, key.tenant, ts, opening)
    return FirstLook(_read(conn, key, -1, limit), _link_of(conn, key), others)


class SqliteFactLog(FactLog):
    """``FactLog`` on a local SQLite file. Build it with ``await SqliteFactLog.open(path)``."""

    def __init__(self, path: Path, executor: ThreadPoolExecutor, conn: sqlite3.Connection) -> None:
        self.path = path
        self._executor = executor
        self._conn = conn
        self._closed = False

    @classmethod
    async def open(cls, path: str | Path) -> SqliteFactLog:
        """Create the file (and its directory) if missing and bring its schema up to date."""
        path = Path(path)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxproxy-sqlite")
        try:
            with map_sqlite_errors(path):
                conn = await asyncio.get_running_loop().run_in_executor(executor, _connect, path)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(path, executor, conn)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        with map_sqlite_errors(self.path):
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, self._conn, *args)

    async def append(
        self, key: SessionKey, expected_seq: int, facts: Sequence[NewFact], ts: float, *, tail: str | None = None
    ) -> list[StoredFact]:
        return await self._run(_append, key, expected_seq, list(facts), ts, tail)

    async def read(self, key: SessionKey, after: int = -1, limit: int | None = None) -> list[StoredFact]:
        return await self._run(_read, key, after, limit)

    async def first_look(self, key: SessionKey, limit: int, ts: float, opening: str = "") -> FirstLook:
        return await self._run(_first_look, key, limit, ts, opening)

    async def sessions(self) -> AsyncIterator[SessionInfo]:
        cursor = ("", "")
        while True:
            page = await self._run(_sessions_page, cursor)
            for info in page:
                yield info
            if len(page) < SESSIONS_PAGE:
                return
            cursor = (page[-1].tenant, page[-1].session)

    async def try_lock(self, key: SessionKey, name: str, token: str, ttl: float) -> bool:
        return await self._run(_try_lock, key, name, token, ttl)

    async def unlock(self, key: SessionKey, name: str, token: str) -> None:
        await self._run(_unlock, key, name, token)

    async def ping(self) -> None:
        await self._run(lambda conn: conn.execute("SELECT 1").fetchone())

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._run(lambda conn: conn.close())
        finally:
            # The worker is idle once close() returned, so this join is immediate.
            self._executor.shutdown(wait=True)

    async def secret(self) -> bytes:
        return await self._run(_secret, secrets.token_urlsafe(32))

    async def signin_epoch(self) -> int:
        return await self._run(_signin_epoch)

    async def end_signins(self) -> int:
        return await self._run(_end_signins)

    async def note_tenant(self, session: str, tenant: str, ts: float, opening: str = "", *,
                          owner: bool = True) -> None:
        await self._run(_note_tenant, session, tenant, ts, opening, owner)

    async def tenants_of(self, session: str) -> list[Tenant]:
        return await self._run(_tenants_of, session)

    async def link(self, key: SessionKey, link: Link, ts: float) -> Link:
        return await self._run(_link, key, link, ts)

    async def link_of(self, key: SessionKey) -> Link | None:
        return await self._run(_link_of, key)
