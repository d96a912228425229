"""redis-py's asyncio clients as the fact log uses them: bounded turns, a deadline per command, commands packed in C.

``client_from_url`` builds the client for a store URL (``redis://``, ``rediss://``, ``unix://``; ``?cluster=1``
for Redis Cluster, ``?max_connections=N``); connecting is lazy. What it changes of redis-py's defaults, and why,
is in the docstrings of ``PooledRedis``, ``HiredisPacking`` and ``ClusterClient``: each change was measured or
found against a real server, and each keeps redis-py's own connection handling (reconnects, ``NOSCRIPT``,
authentication, TLS) in charge.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ClusterDownError, RedisClusterException, SlotNotCoveredError
from redis.exceptions import ConnectionError as RedisConnectionError

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
    # The URL as given but for its query: urlunsplit would write ``unix:///path`` back as ``unix:/path``, which
    # redis-py refuses from 8.2 on.
    base = url.partition("#")[0].partition("?")[0]
    return base + (f"?{urlencode(rest)}" if rest else ""), cluster, int(raw)


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


class HiredisPacking(AbstractConnection):
    """Commands packed by hiredis (C), as redis-py's sync connections pack them; its asyncio ones pack in Python,
    one encode call per argument (measured: about 12 of 100 µs of client CPU for the append of a step)."""

    _packer = HiredisRespSerializer()  # type: ignore[no-untyped-call,unused-ignore]  # untyped in redis-py 8.2

    def pack_command(self, *args: Any) -> list[bytes]:
        packed: list[bytes] = self._packer.pack(*args)
        return packed


class PackedConnection(HiredisPacking, Connection):
    pass


class PackedSSLConnection(HiredisPacking, SSLConnection):
    pass


class PackedUnixConnection(HiredisPacking, UnixDomainSocketConnection):
    pass


#: The connection class redis-py picks for a URL's scheme → the same one packing with hiredis.
PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: PackedConnection, SSLConnection: PackedSSLConnection, UnixDomainSocketConnection: PackedUnixConnection,
}


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


def client_from_url(url: str) -> RedisClient:
    """The client for a store URL (see the module's docstring). ``ValueError`` for an unusable one."""
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
        pool = ConnectionPool.from_url(url, max_connections=max_connections, **options)
        pool.connection_class = PACKED.get(pool.connection_class, pool.connection_class)
        return PooledRedis.from_pool(pool)
    try:
        return ClusterClient.from_url(url, max_connections=max_connections, **options)
    except RedisClusterException as exc:  # a database other than 0, a unix socket
        raise ValueError(f"unusable Redis Cluster URL: {exc}") from exc
