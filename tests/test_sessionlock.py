"""The compaction lock of a session, on both stores: one holder at a time, released when the block ends."""

from __future__ import annotations

from proxy.context.log.sessionlock import CompactionLock
from proxy.store.base import FactLog, SessionKey

KEY = SessionKey("t", "s")


async def test_one_holder_at_a_time_and_released_after_the_block(store: FactLog) -> None:
    first, second = CompactionLock(store, wait=0.2), CompactionLock(store, wait=0.2)
    async with first.held(KEY) as taken:
        assert taken
        async with second.held(KEY) as also:
            assert not also, "held elsewhere: the second gives up after its wait"
        async with second.held(SessionKey("t", "other")) as other:
            assert other, "another session's lock is its own"
    async with second.held(KEY) as taken:
        assert taken, "released when the first block ended"


async def test_the_lease_is_short_and_bounded() -> None:
    assert [CompactionLock(None, wait=w).lease for w in (0.1, 5, 120)] == [1.0, 5, 15.0]  # type: ignore[arg-type]
