"""What a request pays to see another process's writes: ``HistoryManager.current`` on a cached session.

Run: ``python3 -m bench.freshness [--calls N] [--entries N]``.

A request whose session this process read or wrote less than ``FRESH_FOR`` ago uses the cached state as it is
(no store call); one after a quieter spell first reads the log's tail (``read(after=next_seq - 2)``: the last
entry, to check it, and whatever others appended). This times both, per store, on a session of ``--entries``
entries, in this process (no HTTP): the figure is the store round trip the refresh adds, against the zero of a
fresh state. SQLite in a private temp dir, Redis a private ``redis-server`` on a free port.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from proxy.context.log.history import HistoryManager
from proxy.store import FactLog, NewFact, SessionKey, open_store
from tests.redisproc import RedisProcess, free_port

KEY = SessionKey("bench", "fresh")


async def _fill(log: FactLog, entries: int) -> None:
    facts = [NewFact(kind="message", index=i, source="client", message={"role": "user", "content": f"m{i}"},
                     hash=f"h{i}") for i in range(entries)]
    await log.append(KEY, 0, facts, time.time())


async def _timed(history: HistoryManager, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        await history.current(KEY)
        out.append((time.perf_counter() - started) * 1e3)
    return out


def _line(store: str, name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    return (f"| {store} | {name} | {len(ms)} | {statistics.median(ms):.3f} | "
            f"{ms[int(len(ms) * 0.99) - 1]:.3f} |")


async def _measure(store: str, url: str, calls: int, entries: int) -> list[str]:
    log = await open_store(url)
    try:
        await _fill(log, entries)
        history = HistoryManager(log, clock=time.time)
        await history.state(KEY)  # cached, as a proxy that served the session has it
        fresh = await _timed(history, calls)
        history.fresh_for = 0.0  # every call now comes after a quiet spell
        stale = await _timed(history, calls)
        return [_line(store, "fresh (cached, no read)", fresh), _line(store, "quiet (reads the tail)", stale)]
    finally:
        await log.aclose()


async def main(calls: int, entries: int) -> None:
    rows = ["| store | state | calls | p50 ms | p99 ms |", "| --- | --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as tmp:
        rows += await _measure("sqlite", f"sqlite:///{tmp}/facts.db", calls, entries)
        redis = RedisProcess(free_port(), Path(tmp) / "redis")
        redis.start()
        try:
            rows += await _measure("redis", redis.url, calls, entries)
        finally:
            redis.stop()
    print("\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--entries", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.entries))
