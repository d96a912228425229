from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from proxy.store import FactLog
from proxy.store.redis import RedisFactLog
from proxy.store.sqlite import SqliteFactLog
from proxy.ui import timeline
from tests.redisproc import RedisProcess, free_port

pytest_plugins = ["tests.proxyfixtures"]


@pytest.fixture(autouse=True)
def whole_folds(monkeypatch: pytest.MonkeyPatch) -> None:
    """An inspector's look folds for at most ``FOLD_SECONDS``: a time bound, so how far a look gets would depend
    on the machine's load. Tests fold to the end; a test of the bound sets it (to 0: a page of entries a look)."""
    monkeypatch.setattr(timeline, "FOLD_SECONDS", float("inf"))


# ---- fact log stores -------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``$REDIS_URL`` if set, else a private throwaway redis-server for the whole run."""
    if url := os.environ.get("REDIS_URL"):
        yield url
        return
    server = RedisProcess(free_port(), tmp_path_factory.mktemp("redis"))
    with server:
        yield server.url


@pytest.fixture
async def redis_store(redis_url: str) -> AsyncIterator[RedisFactLog]:
    store = RedisFactLog.from_url(redis_url)
    try:
        await store.client.flushdb()
        yield store
    finally:
        await store.aclose()


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteFactLog]:
    store = await SqliteFactLog.open(tmp_path / "facts.db")
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest) -> FactLog:
    """Each backend in turn: the contract suite runs once per backend."""
    fact_log: FactLog = request.getfixturevalue(f"{request.param}_store")
    return fact_log
