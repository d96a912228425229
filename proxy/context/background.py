"""Compactions that run beside the requests instead of in front of them: at most one per session per process.

The engine starts one when a view passes the soft threshold (``--precompact-threshold``); requests keep
going out with the view they have meanwhile, and the checkpoint it records is simply there for the next
request (the session's state is shared and updated in place by the append). Across processes and replicas
the compaction's store lock still keeps it to one per session: a job that finds the lock taken waits like
any compaction and then skips, the other's checkpoint in hand.

A job holds the triggering request's summary call (and so its credentials) in memory until it ends; it is
never stored. Shutdown cancels every job: a compaction writes its summary and checkpoint in one append, so a
cancelled one leaves nothing half-written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from proxy.store.base import SessionKey

logger = logging.getLogger(__name__)


class BackgroundCompactions:
    """The running background compaction of each session; bounded, since each holds a conversation."""

    def __init__(self, max_jobs: int = 1_000) -> None:
        self._jobs: dict[SessionKey, asyncio.Task[Any]] = {}
        self._max_jobs = max_jobs
        #: Set whenever a request starts waiting on a job (what an observer of the waits can await).
        self.joined = asyncio.Event()

    def running(self, key: SessionKey) -> asyncio.Task[Any] | None:
        job = self._jobs.get(key)
        return job if job is not None and not job.done() else None

    async def join(self, key: SessionKey) -> None:
        """Wait for the session's running job, if any; the job goes on if the waiter is cancelled."""
        job = self.running(key)
        if job is not None:
            self.joined.set()
            await asyncio.shield(job)

    def start(self, key: SessionKey, work: Coroutine[Any, Any, Any]) -> bool:
        """Run ``work`` for ``key`` unless a job of that session runs or too many do; whether it started."""
        if self.running(key) is not None or len(self._jobs) >= self._max_jobs:
            work.close()
            return False
        job = asyncio.create_task(work, name=f"ctxproxy-background-compaction-{key.session}")
        self._jobs[key] = job
        job.add_done_callback(lambda done: self._finished(key, done))
        return True

    def _finished(self, key: SessionKey, job: asyncio.Task[Any]) -> None:
        if self._jobs.get(key) is job:
            del self._jobs[key]
        if not job.cancelled() and job.exception() is not None:
            logger.error("background compaction of session %s failed", key.session, exc_info=job.exception())

    async def aclose(self) -> None:
        jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel()
        for job in jobs:
            with contextlib.suppress(asyncio.CancelledError):
                await job
