"""The shared fact log: Redis Streams, one stream and one hash per session.

Keys (see ``proxy.constants``), all under the hash tag ``{tenant:session}`` so a
session lives in one Redis Cluster slot and one Lua script may touch it all:

- ``ctxproxy:{t:s}:log``  the stream; each entry has one field ``f``, the
  fact's canonical JSON (``proxy.store.codec``);
- ``ctxproxy:{t:s}:meta`` a hash: ``next_seq``, ``messages``, ``checkpoints``,
  ``updated_at``, ``tenant``, ``session``;
- ``ctxproxy:{t:s}:lock:<name>`` a string holding the lock owner's token;
- ``ctxproxy:{t:s}:link`` a string ``<tenant> <proved> <prefix>``: the tenant whose session ``s`` the credential
  of tenant ``t`` continues and the scope of its proof (``FactLog.link``; set once, never changed);
- ``ctxproxy:tenants:{s}`` a sorted set of the tenants holding a session ``s``, scored by when each was last
  noted (a prober's score far below every owner's), trimmed to the ``TENANTS_KEPT`` first, and
  ``ctxproxy:openings:{s}`` a hash of their conversations' openings, each tenant's newest first and
  space-separated (one pair per session id, in its own slot).
- ``ctxproxy:{t:s}:fact-keys`` a hash from each keyed fact's ``key`` to its
  seq (``NewFact.key``: summaries and checkpoints), made by the first keyed fact.

Stream ids encode the seq: the fact with seq ``n`` is entry ``<n+1>-0``.
Decision, over auto ids (``*``): ``read(after)`` becomes one XRANGE starting at
``<after+2>-0``, exact and O(log n), with nothing extra stored; with auto ids
we would have to page from the start or keep a seq→id index that grows with
the log. The price is the time part of the id no longer being wall-clock
time; the fact's ``ts`` field carries that. (``0-0`` is not a valid stream id,
hence the ``+1``.)

Append is one Lua script (EVALSHA, reloaded transparently after a restart
flushed the script cache). It compares ``next_seq`` with the writer's
expectation, and the SHA-1 of the stream's last entry with the writer's
``tail`` when it gives one, then XADDs every fact and updates ``meta`` (and
``fact-keys``). Redis runs a script without interleaving any other command, so
the checks and the writes are one atomic step; the script validates before its
first write, so an append either lands whole or not at all. A retried append
whose first attempt did land (the reply was lost: redis-py resends a command
after a connection error) finds ``next_seq`` moved and reports a conflict,
never a duplicate; the writer then catches up and plans again, and a keyed fact
it plans again is found in ``fact-keys``: the script then writes nothing and
answers with the entries already logged, and the append goes on with the rest
(a second run, rare enough not to matter). The script also checks that the
stream really ends at ``<next_seq>-0``; if ``meta`` and the stream ever
disagree (keys edited by hand), it refuses with an error, which surfaces as
``StoreUnavailable``, instead of half-applying a batch. (A failover or a
truncated AOF loses the stream's and ``meta``'s last writes together: one
script's writes replicate and persist as one MULTI/EXEC block.)

Failure handling (the client, ``proxy.store.redisclient``): a deadline per command
makes a dead Redis fail fast; a connection error is retried a few times with a backoff totalling well under a
second, which is what reconnects transparently after a Redis restart. Timeouts
are not retried (each would cost another socket timeout). Connections come
from a pool of ``?max_connections=N`` (``DEFAULT_MAX_CONNECTIONS``) with as many
turns (``PooledRedis``): with all of them busy a command waits up to ``POOL_WAIT``
for one instead of failing at once, as redis-py's default pool does. Every redis-py and
socket error becomes ``StoreUnavailable`` in ``map_redis_errors``.

Redis Cluster (``?cluster=1``, verified against a real 3-primary cluster in
``tests/test_cluster.py``): every command names keys of one session only, so
redis-py routes it by that session's slot, EVALSHA included (the first key
picks the node). ``SCRIPT LOAD`` goes to every primary, so the NOSCRIPT reload
after a node restart or failover lands where the next EVALSHA runs.
``sessions()`` SCANs each primary in turn; while one primary is unreachable it
fails as a whole (a partial listing would look complete), while the sessions on
the other primaries go on working. A connection error makes the client re-read
the slot map and retry, which follows a failover or a restarted node.
``ClusterClient`` corrects two behaviours of redis-py's cluster client (its
docstring says which and why).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from proxy.constants import (
    KEY_PREFIX,
    META_SUFFIX,
    SECRET_KEY,
    SIGNIN_EPOCH_KEY,
    fact_keys_key,
    link_key,
    lock_key,
    log_key,
    meta_key,
    openings_key,
    tenants_key,
)
from proxy.errors import ConflictError, StoreError, StoreUnavailable
from proxy.store import codec
from proxy.store.base import (
    TENANTS_KEPT,
    FactLog,
    FirstLook,
    Link,
    NewFact,
    SessionInfo,
    SessionKey,
    StoredFact,
    Tenant,
    parse_seq,
)
from proxy.store.redis_scripts import (
    APPEND_LUA,
    FIRST_LOOK_LUA,
    LINK_LUA,
    LOCK_LUA,
    NOTE_TENANT_LUA,
    OTHERS_NOTING_LUA,
    READ_LINKED_LUA,
    UNLOCK_LUA,
)
from proxy.store.redisclient import RedisClient, client_from_url

#: Entries per XRANGE round trip when reading a long log; keeps each command short for the server.
READ_PAGE = 1000


class map_redis_errors:  # lower case: used as a function, ``with map_redis_errors("append"):``
    """The one place redis-py and socket errors become ``StoreUnavailable``.

    ``RedisClusterException`` is not a ``RedisError``: redis-py raises it when no
    node of a cluster can be reached. A plain (sync) context manager around the
    awaited command: it only maps exceptions, and costs a fraction of an async
    generator's, once per command.
    """

    __slots__ = ("operation",)

    def __init__(self, operation: str) -> None:
        self.operation = operation

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, RedisError | RedisClusterException | OSError):
            raise StoreUnavailable(f"redis {self.operation} failed: {exc}") from exc


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _decode_entry(entry_id: bytes | str | None, fields: Mapping[bytes | str, bytes | str] | None) -> StoredFact:
    # redis-py types XRANGE entries as optional for the sake of deleted entries, which this log never has.
    if entry_id is None or not fields or b"f" not in fields:
        raise StoreError(f"stream entry {entry_id!r} holds no fact")
    return codec.decode(_text(entry_id), fields[b"f"])


class RedisFactLog(FactLog):
    """``FactLog`` on Redis or Redis Cluster. Build it with ``RedisFactLog.from_url``; connecting is lazy."""

    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self._append = client.register_script(APPEND_LUA)
        self._lock = client.register_script(LOCK_LUA)
        self._unlock = client.register_script(UNLOCK_LUA)
        self._note_tenant = client.register_script(NOTE_TENANT_LUA)
        self._first_look = client.register_script(FIRST_LOOK_LUA)
        self._others_noting = client.register_script(OTHERS_NOTING_LUA)
        self._read_linked = client.register_script(READ_LINKED_LUA)
        self._link = client.register_script(LINK_LUA)

    @classmethod
    def from_url(cls, url: str) -> RedisFactLog:
        """``redis://`` or ``rediss://``; ``?cluster=1`` selects Redis Cluster with the URL's node as seed.

        ``?max_connections=N`` sizes the connection pool (``proxy.store.redisclient.DEFAULT_MAX_CONNECTIONS``):
        with a command waiting up to ``POOL_WAIT`` for a free connection rather than failing (redis-py's
        default pool fails at once; ``PooledRedis``).
        """
        return cls(client_from_url(url))

    async def append(
        self, key: SessionKey, expected_seq: int, facts: Sequence[NewFact], ts: float, *, tail: str | None = None
    ) -> list[StoredFact]:
        names = [log_key(*key), meta_key(*key), fact_keys_key(*key)]
        logged: dict[int, StoredFact] = {}  # position in ``facts`` -> the entry the log already holds for it
        while True:
            todo = [i for i in range(len(facts)) if i not in logged]
            fresh = [facts[i] for i in todo]
            bodies = [codec.encode(fact, expected_seq + i, ts) for i, fact in enumerate(fresh)]
            messages, checkpoints = codec.counts(fresh)
            args: list[bytes | str | int] = [expected_seq, repr(ts), *key, messages, checkpoints, tail or ""]
            for fact, body in zip(fresh, bodies, strict=True):
                args += [fact.key or "", body]
            with map_redis_errors("append"):
                reply = await self._append(keys=names, args=args)
            status, *rest = reply
            if _text(status) in ("conflict", "diverged"):
                actual = int(rest[0])
                why = f"is at seq {actual}, not {expected_seq}" if actual != expected_seq else \
                    f"no longer ends with the entry {actual - 1} the writer saw"
                raise ConflictError(f"log of {key.session} {why}", actual_seq=actual)
            if _text(status) == "known":
                for at in range(0, len(rest), 3):
                    position, entry_id, body = rest[at:at + 3]
                    logged[todo[int(position) - 1]] = codec.decode(_text(entry_id), body)
                continue  # nothing was written: again with the facts not logged yet, at the same seq
            written = iter([codec.written(fact, _text(entry_id), expected_seq + i, ts, body)
                            for i, (fact, entry_id, body) in enumerate(zip(fresh, rest, bodies, strict=True))])
            return [logged[i] if i in logged else next(written) for i in range(len(facts))]

    async def read(self, key: SessionKey, after: int = -1, limit: int | None = None) -> list[StoredFact]:
        out: list[StoredFact] = []
        start = max(after + 1, 0)  # seq of the next wanted fact
        with map_redis_errors("read"):
            while limit is None or len(out) < limit:
                count = READ_PAGE if limit is None else min(READ_PAGE, limit - len(out))
                entries = await self.client.xrange(log_key(*key), min=f"{start + 1}-0", max="+", count=count) or []
                out.extend(_decode_entry(entry_id, fields) for entry_id, fields in entries)
                if len(entries) < count:
                    break
                start = out[-1].seq + 1
        return out

    async def first_look(self, key: SessionKey, limit: int, ts: float, opening: str = "") -> FirstLook:
        linked, tenants = [log_key(*key), link_key(*key)], [tenants_key(key.session), openings_key(key.session)]
        noting: list[str | int] = [repr(ts), key.tenant, TENANTS_KEPT, opening]
        with map_redis_errors("first_look"):
            if isinstance(self.client, RedisCluster):  # the session id's tenants live in a slot of their own
                replies: tuple[Any, Any] = await asyncio.gather(self._read_linked(keys=linked, args=[limit]),
                                                                self._others_noting(keys=tenants, args=noting),
                                                                return_exceptions=True)
                for reply in replies:
                    if isinstance(reply, BaseException):
                        raise reply
                (link, *entries), noted = replies
            else:
                link, noted, *entries = await self._first_look(keys=linked + tenants, args=[limit, *noting])
        facts = [_decode_entry(entry_id, dict(zip(fields[::2], fields[1::2], strict=True)))
                 for entry_id, fields in entries]
        return FirstLook(facts, _link_from(link) if link else None, _tenants_from(noted))

    async def sessions(self) -> AsyncIterator[SessionInfo]:
        suffix = f"}}:{META_SUFFIX}".encode()
        with map_redis_errors("sessions"):
            async for name in self.client.scan_iter(match=f"{KEY_PREFIX}:*:{META_SUFFIX}", count=500):
                # A lock named "meta" would match the pattern too; only the real meta key ends in "}:meta".
                if not name.endswith(suffix):
                    continue
                meta = {_text(k): _text(v) for k, v in (await self.client.hgetall(name)).items()}
                if "tenant" not in meta or "session" not in meta:
                    continue
                yield SessionInfo(
                    tenant=meta["tenant"],
                    session=meta["session"],
                    messages=int(meta.get("messages", 0)),
                    checkpoints=int(meta.get("checkpoints", 0)),
                    updated_at=float(meta.get("updated_at", 0.0)),
                    entries=int(meta.get("next_seq", 0)),
                )

    async def try_lock(self, key: SessionKey, name: str, token: str, ttl: float) -> bool:
        with map_redis_errors("try_lock"):
            taken = await self._lock(keys=[lock_key(*key, name)], args=[token, max(1, round(ttl * 1000))])
        return bool(taken)

    async def unlock(self, key: SessionKey, name: str, token: str) -> None:
        with map_redis_errors("unlock"):
            await self._unlock(keys=[lock_key(*key, name)], args=[token])

    async def ping(self) -> None:
        with map_redis_errors("ping"):
            await self.client.ping()

    async def aclose(self) -> None:
        with map_redis_errors("close"):
            await self.client.aclose()

    async def secret(self) -> bytes:
        # SET NX then GET: whoever sets first wins and every GET returns the winner. The value never changes
        # afterwards, so the pair is as good as one atomic step; a second round only covers a key deleted by hand
        # between the two commands. One key, so it works on Redis Cluster too (its own slot).
        with map_redis_errors("secret"):
            for _ in range(2):
                await self.client.set(SECRET_KEY, secrets.token_urlsafe(32), nx=True)
                value = await self.client.get(SECRET_KEY)
                if value is not None:
                    return value if isinstance(value, bytes) else value.encode()
        raise StoreError(f"{SECRET_KEY} vanished twice right after it was set")

    async def signin_epoch(self) -> int:
        with map_redis_errors("signin_epoch"):
            value = await self.client.get(SIGNIN_EPOCH_KEY)
        return int(value) if value is not None else 0

    async def end_signins(self) -> int:
        with map_redis_errors("end_signins"):
            return int(await self.client.incr(SIGNIN_EPOCH_KEY))

    async def note_tenant(self, session: str, tenant: str, ts: float, opening: str = "", *,
                          owner: bool = True) -> None:
        with map_redis_errors("note_tenant"):
            await self._note_tenant(keys=[tenants_key(session), openings_key(session)],
                                    args=[repr(ts), tenant, TENANTS_KEPT, opening, int(owner)])

    async def tenants_of(self, session: str) -> list[Tenant]:
        with map_redis_errors("tenants_of"):
            names = await self.client.zrevrange(tenants_key(session), 0, TENANTS_KEPT - 1)
            openings = await self.client.hgetall(openings_key(session))
        known = {_text(name): _text(opening) for name, opening in openings.items()}
        return [Tenant(_text(name), tuple(known.get(_text(name), "").split()))
                for name in names if isinstance(name, bytes | str)]

    async def link(self, key: SessionKey, link: Link, ts: float) -> Link:
        # One script: the first scoped link wins and never changes.
        with map_redis_errors("link"):
            value = await self._link(keys=[link_key(*key)], args=[f"{link.tenant} {link.proved} {link.prefix}"])
        return _link_from(value)

    async def link_of(self, key: SessionKey) -> Link | None:
        with map_redis_errors("link_of"):
            value = await self.client.get(link_key(*key))
        return None if value is None else _link_from(value)


def _link_from(value: bytes | str) -> Link:
    """A stored link; one from before links had a scope (the tenant alone) has none, and serves nothing."""
    tenant, _, scope = _text(value).partition(" ")
    proved, _, prefix = scope.partition(" ")
    count = parse_seq(proved)
    return Link(tenant, count, prefix) if count is not None else Link(tenant, 0, "")


def _tenants_from(flat: Sequence[bytes | str]) -> list[Tenant]:
    """``others_noting``'s flat {name, opening...} reply."""
    return [Tenant(_text(name), tuple(_text(openings).split()))
            for name, openings in zip(flat[::2], flat[1::2], strict=True)]
