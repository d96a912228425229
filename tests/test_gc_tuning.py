"""The served process collects young garbage less often than CPython's default (``proxy.server.tune_gc``).

At the default threshold (700) the collector took about 60 % of decoding 40,000
log entries; the timing is in docs/BENCHMARKS.md, the setting is checked here.
"""

from __future__ import annotations

import gc

from aiohttp import web

from proxy.server import GC_YOUNG_THRESHOLD, serving
from proxy.settings import Settings


async def test_serving_raises_only_the_young_generations_threshold() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, before[1], before[2])
        async with serving(web.Application(), Settings()):
            assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert GC_YOUNG_THRESHOLD > 700
    finally:
        gc.set_threshold(*before)
