"""A growing delay after failed sign-ins and admin tokens, per client address: guessing the token stays slow.

After ``n`` failures in a row from one address, its next attempt is not
checked until ``BASE * 2^(n-1)`` seconds (at most ``CAP``) after the last
failure: it is refused (429 with ``Retry-After``) without comparing the token,
so what is bounded is the rate of guesses, not only of wrong answers. One
mistyped token costs half a second; guessing settles at one try a minute. A
success clears the address.

Memory is bounded: at most ``max_addresses`` addresses are kept, the one that
failed longest ago forgotten first, and an address whose delay ran out
``FORGET`` seconds ago starts afresh. The record is per process: under
``--workers N`` each worker keeps its own, so guesses go N times as fast. The
address is the connection's peer: behind a reverse proxy every client shares
the proxy's, so one guesser delays everyone (the price of not trusting a
forwarded-for header a client can write).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

BASE = 0.5
CAP = 60.0
FORGET = 15 * 60.0
MAX_ADDRESSES = 10_000


@dataclass(slots=True)
class _Record:
    failures: int
    until: float


class FailureThrottle:
    """Failed attempts per address, oldest failure first; the clock is ``time.monotonic`` unless given."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_addresses: int = MAX_ADDRESSES) -> None:
        self._clock = clock
        self._max = max_addresses
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def wait(self, address: str) -> float:
        """Seconds before ``address`` may try again; 0 when it may now."""
        record = self._records.get(address)
        return max(0.0, record.until - self._clock()) if record is not None else 0.0

    def failed(self, address: str) -> float:
        """Record a failure of ``address``; the delay it now has to wait."""
        now = self._clock()
        self._forget(now)
        record = self._records.pop(address, None)
        failures = record.failures + 1 if record is not None else 1
        delay = min(CAP, BASE * 2.0 ** min(failures - 1, 32))
        self._records[address] = _Record(failures, now + delay)
        while len(self._records) > self._max:
            self._records.popitem(last=False)
        return delay

    def succeeded(self, address: str) -> None:
        self._records.pop(address, None)

    def _forget(self, now: float) -> None:
        """Drop the addresses whose delay ran out ``FORGET`` ago: the oldest failures come first."""
        while self._records:
            address, record = next(iter(self._records.items()))
            if record.until + FORGET > now:
                return
            del self._records[address]
