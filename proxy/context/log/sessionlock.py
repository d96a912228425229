"""The compaction lock of a session: one compaction at a time, across processes and replicas.

A lease in the store (``FactLog.try_lock``), short and renewed by a heartbeat
while the compaction runs: a process killed mid-summary blocks its session's
compactions for one lease at most. Taking it polls (the lock may be held by
another process; there is no notification to wait on), up to a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

from proxy.errors import StoreError
from proxy.store.base import FactLog, SessionKey

logger = logging.getLogger(__name__)

LOCK_NAME = "compact"


class CompactionLock:
    """``held(key)`` yields whether the lock was taken within ``wait`` seconds, and holds it for the block."""

    def __init__(self, log: FactLog, *, wait: float) -> None:
        self.log = log
        self.wait = wait

    @property
    def lease(self) -> float:
        """Seconds the lock lives without renewal: short, renewed every third of it."""
        return min(15.0, max(1.0, self.wait))

    @contextlib.asynccontextmanager
    async def held(self, key: SessionKey) -> AsyncIterator[bool]:
        token = uuid.uuid4().hex
        if not await self._acquire(key, token):
            yield False
            return
        heartbeat = asyncio.create_task(self._renew(key, token))
        try:
            yield True
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            await self.log.unlock(key, LOCK_NAME, token)

    async def _acquire(self, key: SessionKey, token: str) -> bool:
        deadline = time.monotonic() + self.wait
        delay = 0.02
        while not await self.log.try_lock(key, LOCK_NAME, token, self.lease):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(delay)  # polling a lock held by another process; no notification to wait on
            delay = min(delay * 2, 0.5)
        return True

    async def _renew(self, key: SessionKey, token: str) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                await self.log.try_lock(key, LOCK_NAME, token, self.lease)
            except StoreError:
                logger.warning("could not renew the compaction lock of session %s", key.session)
