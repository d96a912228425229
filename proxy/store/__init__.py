"""Fact log backends, chosen by the scheme of the ``--store`` URL.

- ``redis://…`` / ``rediss://…`` (``?cluster=1`` for Redis Cluster, ``?max_connections=N`` for the
  size of its blocking connection pool) → ``RedisFactLog``;
- ``sqlite:///<path>`` → ``SqliteFactLog``. Everything after the three slashes
  is the path, as in SQLAlchemy: ``sqlite:///facts.db`` is relative to the
  working directory, ``sqlite:////var/lib/ctxproxy/facts.db`` (four slashes) is
  absolute. So ``f"sqlite:///{path}"`` round-trips any path, absolute or not.

Backends are imported lazily, so a SQLite deployment never imports redis.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from proxy.store.base import FactLog, NewFact, SessionInfo, SessionKey, StoredFact

__all__ = ["FactLog", "NewFact", "SessionInfo", "SessionKey", "StoredFact", "open_store", "sqlite_path"]

SQLITE_PREFIX = "sqlite:///"


def sqlite_path(url: str) -> Path:
    """The filesystem path a ``sqlite:///`` URL names; ``ValueError`` when it names none."""
    if not url.startswith(SQLITE_PREFIX):
        raise ValueError(f"not a sqlite store URL (expected sqlite:///path): {url!r}")
    raw = unquote(url[len(SQLITE_PREFIX):].split("?", 1)[0])
    if not raw:
        raise ValueError(f"sqlite store URL names no file: {url!r}")
    return Path(raw).expanduser()


async def open_store(url: str) -> FactLog:
    """Open the store ``url`` names. Redis connects lazily (a down Redis fails the first call, not this one)."""
    scheme = url.partition(":")[0].lower()
    if scheme in {"redis", "rediss"}:
        from proxy.store.redis import RedisFactLog

        return RedisFactLog.from_url(url)
    if scheme == "sqlite":
        from proxy.store.sqlite import SqliteFactLog

        return await SqliteFactLog.open(sqlite_path(url))
    raise ValueError(
        f"unsupported store URL {url!r}: use redis://host:port/db, rediss://…, "
        "add ?cluster=1 for Redis Cluster, or sqlite:///path/to/facts.db"
    )
