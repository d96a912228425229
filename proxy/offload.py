"""CPU-heavy work of a large request, run off the event loop so that the other sessions' requests are answered.

Parsing, hashing and counting a request are linear in its size: for a body of
tens of MiB or a history of 300,000 messages that is seconds of CPU, during
which an event loop running it answers nobody (issue 23). A request of at least
``LARGE_BYTES`` does that work in a worker thread instead. Pure Python holds the
GIL but hands it over every ``sys.getswitchinterval()`` (5 ms), and tiktoken
and orjson's long calls are single C calls: tiktoken releases the GIL while it
encodes. Small requests, nearly all of them, keep the direct call: no thread
hop, the same code and cost as before.

The pool is small on purpose: threads share one GIL, so more of them would
only slice the same CPU thinner; large requests queue for it instead.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

#: Body size from which a request's parsing, hashing and counting run in the pool (about 10 ms of work).
LARGE_BYTES = 1024 * 1024
#: Messages new to the log from which a sync plans them in the pool (``HistoryManager._append``).
LARGE_ITEMS = 10_000
#: Facts one append of a sync writes at most: a store transaction of some 20 ms (``HistoryManager._append``).
APPEND_CHUNK = 1_000
#: Facts folded into a session's state between two turns of the event loop (``ConversationState.apply``).
FOLD_STEP = 2_000

_WORKERS = 2
_P = ParamSpec("_P")
_R = TypeVar("_R")


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="ctxproxy-offload")


def is_large(size: int) -> bool:
    """Whether a request of ``size`` bytes does its CPU-heavy work off the loop."""
    return size >= LARGE_BYTES


async def run(large: bool, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """``fn(*args, **kwargs)``: in the pool when ``large``, else right here.

    ``fn`` must not touch what the loop may change meanwhile (it runs beside
    other requests); a cancelled caller leaves it to finish, which the
    request's own bounds (body size, tokenizing budget) keep short.
    """
    if not large:
        return fn(*args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_pool(), functools.partial(fn, *args, **kwargs))
