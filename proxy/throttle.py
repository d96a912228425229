"""A delay after failed sign-ins and admin tokens, per client address and over all of them: guessing stays slow,
and the operator is not locked out by someone else's guesses.

Only a token that was compared and found wrong is a failure; a request that
carries none is no guess and is never delayed. Per address, the first ``FREE``
failures cost nothing (a mistyped token, a script with a stale one); after
them, the address's next attempt is not compared until ``BASE * 2^(n-1)``
seconds (at most ``CAP``) after its ``n``-th failure past the free ones: it is
refused (429 with ``Retry-After``) uncompared, so what is bounded is the rate of
guesses, not only of wrong answers. Guessing from one address settles at one try
a minute. A success clears the address.

Many addresses each guessing a few times would pass under that, so the
failures of all addresses also draw on one budget: ``GLOBAL_BURST`` of them at
once, refilled at ``GLOBAL_RATE`` a second. While it is spent, attempts are
refused uncompared, except from an address that presented the right token in
the last ``TRUSTED_FOR`` seconds: the operator's usual address is compared (and
a right token accepted) however many others are guessing. One address alone
cannot spend the budget (its own delay holds it to about a dozen failures a
minute, against the budget's 30 a minute), so a second address guessing never
delays anyone else; only a guesser with many addresses brings the global delay
on, and then a fresh address waits it out too: that is what bounds the guesses.

Memory is bounded: at most ``max_addresses`` addresses are kept (failures and
trusted ones each), the one that failed (or succeeded) longest ago forgotten
first, and an address whose delay ran out ``FORGET`` seconds ago starts afresh.
The record is per process: under ``--workers N`` each worker keeps its own, so
guesses go N times as fast. The address is the connection's peer: behind a
reverse proxy every client shares the proxy's, so one guesser past its free
failures delays everyone behind it (the price of not trusting a forwarded-for
header a client can write).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

FREE = 5
BASE = 0.5
CAP = 60.0
FORGET = 15 * 60.0
MAX_ADDRESSES = 10_000
GLOBAL_BURST = 30
GLOBAL_RATE = 0.5
TRUSTED_FOR = 24 * 3600.0


@dataclass(slots=True)
class _Record:
    failures: int
    until: float


def delay_after(failures: int, free: int = FREE) -> float:
    """Seconds an address waits after its ``failures``-th failure in a row: none within the free ones."""
    past = failures - free
    return 0.0 if past <= 0 else min(CAP, BASE * 2.0 ** min(past - 1, 32))


class FailureThrottle:
    """Failed attempts per address (oldest failure first) and over all addresses; the clock is ``time.monotonic``
    unless given."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_addresses: int = MAX_ADDRESSES,
                 free: int = FREE, global_burst: int = GLOBAL_BURST, global_rate: float = GLOBAL_RATE) -> None:
        self._clock = clock
        self._max = max_addresses
        self._free = free
        self._records: OrderedDict[str, _Record] = OrderedDict()
        #: Addresses that presented the right token, by when: compared even while the global budget is spent.
        self._trusted: OrderedDict[str, float] = OrderedDict()
        self._burst = float(global_burst)
        self._rate = global_rate
        self._budget = self._burst
        self._refilled = clock()

    def __len__(self) -> int:
        return len(self._records)

    def wait(self, address: str) -> float:
        """Seconds before ``address``'s next token is compared; 0 when it is now."""
        own = self.address_wait(address)
        return max(own, 0.0 if self._is_trusted(address) else self.global_wait())

    def address_wait(self, address: str) -> float:
        """Seconds before ``address`` may try again for its own failures alone."""
        record = self._records.get(address)
        return max(0.0, record.until - self._clock()) if record is not None else 0.0

    def global_wait(self) -> float:
        """Seconds before the failures of all addresses leave room for one more."""
        self._refill()
        return 0.0 if self._budget >= 1 else (1 - self._budget) / self._rate

    def failed(self, address: str) -> float:
        """Record a failure of ``address``; the delay it now has to wait for its own failures."""
        now = self._clock()
        self._forget(now)
        self._refill()
        self._budget = max(0.0, self._budget - 1)
        record = self._records.pop(address, None)
        failures = record.failures + 1 if record is not None else 1
        delay = delay_after(failures, self._free)
        self._records[address] = _Record(failures, now + delay)
        while len(self._records) > self._max:
            self._records.popitem(last=False)
        return delay

    def succeeded(self, address: str) -> None:
        self._records.pop(address, None)
        self._trusted.pop(address, None)
        self._trusted[address] = self._clock()
        while len(self._trusted) > self._max:
            self._trusted.popitem(last=False)

    def _is_trusted(self, address: str) -> bool:
        since = self._trusted.get(address)
        return since is not None and self._clock() - since < TRUSTED_FOR

    def _refill(self) -> None:
        now = self._clock()
        self._budget = min(self._burst, self._budget + (now - self._refilled) * self._rate)
        self._refilled = now

    def _forget(self, now: float) -> None:
        """Drop the addresses whose delay ran out ``FORGET`` ago (the oldest failures come first), and the trusted
        ones past ``TRUSTED_FOR``."""
        while self._records:
            address, record = next(iter(self._records.items()))
            if record.until + FORGET > now:
                break
            del self._records[address]
        while self._trusted and now - next(iter(self._trusted.values())) >= TRUSTED_FOR:
            self._trusted.popitem(last=False)
