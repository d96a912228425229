"""CPU-heavy work of a large request, run off the event loop so that the other sessions' requests are answered.

Parsing, hashing and counting a request are linear in its size: for a body of
tens of MiB or a history of 300,000 messages that is seconds of CPU, during
which an event loop running it answers nobody (issue 23). A request of at least
``LARGE_BYTES`` does that work in a worker thread instead. Pure Python holds the
GIL but hands it over every ``sys.getswitchinterval()`` (5 ms), and tiktoken
releases it while it encodes (checked: a spinning thread kept about half its
pace beside one long ``encode_ordinary``). orjson does not: parsing a 30 MiB
body is one C call that keeps the loop waiting for its 0.1-0.3 s. Small
requests, nearly all of them, keep the direct call: no thread hop, the same
code and cost as before.

The pool is small on purpose: threads share one GIL, so more of them would
only slice the same CPU thinner; large requests queue for it instead.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
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

#: Seconds after a large request before the freed heap is handed back: its objects are gone by then.
TRIM_DELAY = 1.0

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


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None on another C library (musl returns freed memory by itself)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_trimming: set[asyncio.AbstractEventLoop] = set()


def trim_soon() -> None:
    """Hand the heap a large request freed back to the OS, ``TRIM_DELAY`` seconds from now (once, however many
    large requests end meanwhile).

    glibc keeps freed memory in its arenas: a 300,000-message request left the
    process 1.5 GB larger after it ended. ``malloc_trim`` runs in the pool
    (ctypes releases the GIL around it): walking a large heap takes a while.
    """
    trim = _malloc_trim()
    loop = asyncio.get_running_loop()
    if trim is None or loop in _trimming:
        return
    _trimming.add(loop)

    def start() -> None:
        _trimming.discard(loop)
        loop.run_in_executor(_pool(), trim, 0)

    loop.call_later(TRIM_DELAY, start)
