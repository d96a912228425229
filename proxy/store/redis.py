"""The shared fact log: Redis Streams, one stream and one hash per session.

Keys (see ``proxy.constants``), all under the hash tag ``{tenant:session}`` so a
session lives in one Redis Cluster slot and one Lua script may touch it all:

- ``ctxproxy:{t:s}:log``  the stream; each entry has one field ``f``, the
  fact's canonical JSON (``proxy.store.codec``);
- ``ctxproxy:{t:s}:meta`` a hash: ``next_seq``, ``messages``, ``checkpoints``,
  ``updated_at``, ``tenant``, ``session``;
- ``ctxproxy:{t:s}:lock:<name>`` a string holding the lock owner's token;
- ``ctxproxy:{t:s}:link`` a string: the tenant whose session ``s`` the credential of tenant ``t`` continues
  (``FactLog.link``; set once, never changed);
- ``ctxproxy:tenants:{s}`` a sorted set of the tenants holding a session ``s``, scored by when each was last
  noted, trimmed to the ``TENANTS_KEPT`` newest (one key per session id, in its own slot).
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

Failure handling: short timeouts (a deadline per command, ``PooledRedis``)
make a dead Redis fail fast; a connection error is retried a few times with a backoff totalling well under a
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
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ClusterDownError, RedisClusterException, RedisError, SlotNotCoveredError
from redis.exceptions import ConnectionError as RedisConnectionError

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
    tenants_key,
)
from proxy.errors import ConflictError, StoreError, StoreUnavailable
from proxy.store import codec
from proxy.store.base import TENANTS_KEPT, FactLog, FirstLook, NewFact, SessionInfo, SessionKey, StoredFact
from proxy.store.redis_scripts import APPEND_LUA, LOCK_LUA, UNLOCK_LUA

RedisClient = Redis | RedisCluster

SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0
#: Connections per client unless the URL says ``?max_connections=N``. Redis runs one command at a time, so
#: connections beyond what covers the network round trip only queue inside Redis: 128 keep a Redis at ~100k
#: commands/s busy across a 1 ms round trip. More requests than that in flight (300 sessions or more) wait
#: their turn for a connection, a few command times, instead of failing.
DEFAULT_MAX_CONNECTIONS = 128
#: How long a command waits for a free connection before it fails: as long as a hung command may hold one.
POOL_WAIT = SOCKET_TIMEOUT
HEALTH_CHECK_INTERVAL = 10
#: Entries per XRANGE round trip when reading a long log; keeps each command short for the server.
READ_PAGE = 1000

# Note a tenant of a session id and keep only the newest ARGV[3]. KEYS: the session id's set. ARGV: ts, tenant, kept.
NOTE_TENANT_LUA = """
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[3]) + 1))
return 1
"""

# The tenants of a session id other than ``tenant``, newest first, at most ``kept``; none: note ``tenant`` (as
# NOTE_TENANT_LUA does).
_OTHERS_OR_NOTE = """
local function others_or_note(tenants, ts, tenant, kept)
  local others = {}
  for _, name in ipairs(redis.call('ZREVRANGE', tenants, 0, kept - 1)) do
    if name ~= tenant then
      others[#others + 1] = name
    end
  end
  if #others == 0 then
    redis.call('ZADD', tenants, ts, tenant)
    redis.call('ZREMRANGEBYRANK', tenants, 0, -(kept + 1))
  end
  return others
end
"""

# A session's link (false: none), then the first ``limit`` entries of its log.
_READ_LINKED = """
local function read_linked(log, link, limit)
  local out = {redis.call('GET', link)}
  for _, entry in ipairs(redis.call('XRANGE', log, '-', '+', 'COUNT', limit)) do
    out[#out + 1] = entry
  end
  return out
end
"""

# ``FactLog.first_look`` in one script: {link, others, entry...}. KEYS: the log, the link, the session id's set of
# tenants. ARGV: limit, ts, tenant, kept. Only where one script may touch keys of two slots (not on a cluster).
FIRST_LOOK_LUA = _OTHERS_OR_NOTE + _READ_LINKED + """
local out = read_linked(KEYS[1], KEYS[2], tonumber(ARGV[1]))
table.insert(out, 2, others_or_note(KEYS[3], ARGV[2], ARGV[3], tonumber(ARGV[4])))
return out
"""
# The same on a cluster, as two scripts: the log's slot {link, entry...} (KEYS: the log, the link; ARGV: limit),
# and the tenants' slot (KEYS: the set; ARGV: ts, tenant, kept).
READ_LINKED_LUA = _READ_LINKED + "return read_linked(KEYS[1], KEYS[2], tonumber(ARGV[1]))"
OTHERS_OR_NOTE_LUA = _OTHERS_OR_NOTE + "return others_or_note(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]))"


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


def _split_options(url: str) -> tuple[str, bool, int]:
    """Take our own query parameters out of the URL: ``cluster`` (a flag) and ``max_connections`` (at least 1).

    redis-py would reject ``cluster`` as a connection option and silently read
    ``max_connections=0`` as its own default, so both are read here, once.
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {name: value for name, value in query if name in {"cluster", "max_connections"}}
    rest = [(name, value) for name, value in query if name not in ours]
    cluster = ours.get("cluster", "").lower() in {"1", "true", "yes", "on"}
    raw = ours.get("max_connections", str(DEFAULT_MAX_CONNECTIONS))
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"max_connections in the store URL must be a positive integer, not {raw!r}")
    return urlunsplit(parts._replace(query=urlencode(rest))), cluster, int(raw)


class Turns:
    """At most ``n`` commands in flight; one past that waits up to ``POOL_WAIT`` for a turn, then fails as a
    connection error. A free turn costs one uncontended semaphore acquire (no timer)."""

    __slots__ = ("_free",)

    def __init__(self, n: int) -> None:
        self._free = asyncio.Semaphore(n)

    async def __aenter__(self) -> None:
        if not self._free.locked():
            await self._free.acquire()  # returns at once
            return
        try:
            async with asyncio.timeout(POOL_WAIT):
                await self._free.acquire()
        except TimeoutError as exc:
            raise RedisConnectionError("No connection available.") from exc

    async def __aexit__(self, *exc: object) -> None:
        self._free.release()


class PooledRedis(Redis):
    """redis-py's client on its plain pool, with at most the pool's size of commands in flight (``Turns``).

    The behaviour of redis-py's ``BlockingConnectionPool`` (a command waits up to
    ``POOL_WAIT`` for a connection instead of failing) without its cost: that pool
    takes an ``asyncio.Condition`` under a timeout on every checkout, about a third
    of the client's CPU per command (measured: 75 against 55 µs). A command uses
    one connection at a time, so with the turns bounded by the pool's size the pool
    is never exhausted.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._turns = Turns(self.connection_pool.max_connections)

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        async with self._turns, asyncio.timeout(SOCKET_TIMEOUT):  # redis-py leaves execute_command untyped
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


class ClusterClient(RedisCluster):
    """redis-py's async cluster client with three corrections, all found against a real cluster.

    - It initializes before every command. redis-py picks a command's route
      before it initializes, and a client that has no slot map yet sends keyed
      commands to its default node: the first requests of a busy replica then
      draw MOVED replies, and every fifth MOVED makes redis-py close all
      connections, in-flight ones included, which fails those requests with
      AttributeError/RuntimeError instead of a Redis error. ``initialize`` is a
      flag check once the slot map is known.
    - It does not retry after a socket timeout. Re-reading the slot map and
      retrying is right after a refused connection or a failover, but against
      a hung node each retry waits out another socket timeout (20 s instead of
      5 s in all). The slot map is still re-read on the next command.
    - It has no blocking pool: past ``max_connections`` to one node a command
      fails at once (``MaxConnectionsError``). Commands in flight are bounded
      here by the same number, waiting up to ``POOL_WAIT`` for a turn, and a
      command uses one connection at a time, so no node's limit is reached.
    """

    # redis-py types the attribute as exactly its own four-class tuple.
    ERRORS_ALLOW_RETRY = (RedisConnectionError, ClusterDownError, SlotNotCoveredError)  # type: ignore[assignment]

    def __init__(self, *args: Any, max_connections: int = DEFAULT_MAX_CONNECTIONS, **kwargs: Any) -> None:
        kwargs["max_connections"] = max_connections
        super().__init__(*args, **kwargs)
        self._turns = Turns(max_connections)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self._turns:
            await self.initialize()
            return await super().execute_command(*args, **kwargs)


class RedisFactLog(FactLog):
    """``FactLog`` on Redis or Redis Cluster. Build it with ``RedisFactLog.from_url``; connecting is lazy."""

    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self._append = client.register_script(APPEND_LUA)
        self._lock = client.register_script(LOCK_LUA)
        self._unlock = client.register_script(UNLOCK_LUA)
        self._note_tenant = client.register_script(NOTE_TENANT_LUA)
        self._first_look = client.register_script(FIRST_LOOK_LUA)
        self._others_or_note = client.register_script(OTHERS_OR_NOTE_LUA)
        self._read_linked = client.register_script(READ_LINKED_LUA)

    @classmethod
    def from_url(cls, url: str) -> RedisFactLog:
        """``redis://`` or ``rediss://``; ``?cluster=1`` selects Redis Cluster with the URL's node as seed.

        ``?max_connections=N`` sizes the connection pool (``DEFAULT_MAX_CONNECTIONS``):
        with a command waiting up to ``POOL_WAIT`` for a free connection rather than failing (redis-py's
        default pool fails at once; ``PooledRedis``).
        """
        url, cluster, max_connections = _split_options(url)
        options: dict[str, Any] = {
            "socket_timeout": SOCKET_TIMEOUT,
            "socket_connect_timeout": CONNECT_TIMEOUT,
            "health_check_interval": HEALTH_CHECK_INTERVAL,
            # Backoff 0.1 + 0.2 + 0.25 s: enough to ride over a restart, short enough not to stall requests.
            "retry": Retry(ExponentialBackoff(cap=0.25, base=0.05), 3, supported_errors=(RedisConnectionError,)),
        }
        if not cluster:
            options["socket_timeout"] = None  # a deadline per command instead (PooledRedis)
            return cls(PooledRedis.from_pool(ConnectionPool.from_url(url, max_connections=max_connections, **options)))
        try:
            return cls(ClusterClient.from_url(url, max_connections=max_connections, **options))
        except RedisClusterException as exc:  # a database other than 0, a unix socket
            raise ValueError(f"unusable Redis Cluster URL: {exc}") from exc

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

    async def first_look(self, key: SessionKey, limit: int, ts: float) -> FirstLook:
        linked, tenants = [log_key(*key), link_key(*key)], [tenants_key(key.session)]
        noting: list[str | int] = [repr(ts), key.tenant, TENANTS_KEPT]
        with map_redis_errors("first_look"):
            if isinstance(self.client, RedisCluster):  # the session id's tenants live in a slot of their own
                replies: tuple[Any, Any] = await asyncio.gather(self._read_linked(keys=linked, args=[limit]),
                                                                self._others_or_note(keys=tenants, args=noting),
                                                                return_exceptions=True)
                for reply in replies:
                    if isinstance(reply, BaseException):
                        raise reply
                (link, *entries), noted = replies
            else:
                link, noted, *entries = await self._first_look(keys=linked + tenants, args=[limit, *noting])
        facts = [_decode_entry(entry_id, dict(zip(fields[::2], fields[1::2], strict=True)))
                 for entry_id, fields in entries]
        return FirstLook(facts, _text(link) if link else None, [_text(name) for name in noted])

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

    async def note_tenant(self, session: str, tenant: str, ts: float) -> None:
        with map_redis_errors("note_tenant"):
            await self._note_tenant(keys=[tenants_key(session)], args=[repr(ts), tenant, TENANTS_KEPT])

    async def tenants_of(self, session: str) -> list[str]:
        with map_redis_errors("tenants_of"):
            names = await self.client.zrevrange(tenants_key(session), 0, TENANTS_KEPT - 1)
        return [_text(name) for name in names if isinstance(name, bytes | str)]

    async def link(self, key: SessionKey, tenant: str, ts: float) -> str:
        # SET NX then GET, as for the secret: the first link wins and never changes, so the pair is one step.
        with map_redis_errors("link"):
            await self.client.set(link_key(*key), tenant, nx=True)
            value = await self.client.get(link_key(*key))
        if value is None:
            raise StoreError(f"{link_key(*key)} vanished right after it was set")
        return _text(value)

    async def link_of(self, key: SessionKey) -> str | None:
        with map_redis_errors("link_of"):
            value = await self.client.get(link_key(*key))
        return None if value is None else _text(value)
