"""When a reduction the trigger does not force is worth its cache write: the cost model of issue 34, in the engine's
terms (tokens, steps, the model's cache prices as multiples of its input price).

Every change of the prompt prefix makes the provider write everything after the change again (Anthropic bills a
write at 1.25 times the input price, a read at 0.1 times), and a prompt cache lives minutes (Anthropic's 5 by
default: ``--cache-ttl``). So the same reduction costs very different amounts by when it lands:

- **forced**: the view passes the trigger (``window * compression_threshold``, the contract's "compact when the
  estimate exceeds"): it is reduced whatever the cache holds;
- **cold**: the request comes after an idle gap longer than the cache's life, so the provider writes the whole
  prompt anyway: a reduction then rewrites nothing it would not have written. One that would otherwise come before
  the session's next expected gap (``Moment.steps_to_cold``, learned from its gaps so far, ``DUE_STEPS`` at least)
  is made now; at a session's first request (a resumed session, a restarted process: no gap known), any that is
  there to make;
- **warm** (mid-burst): a reduction that nothing forces waits, unless the view is near the trigger (fewer than
  ``DUE_STEPS`` steps of growth below it: far from it, a batch changed the prefix every few steps at 128k, each
  rewriting the ten kept outputs) and what it saves over the steps until the trigger or the next expected gap
  would force or allow it anyway (tokens freed, times the steps, times the read price) exceeds what it rewrites
  at the write price.

All of this assumes a prompt read from the cache up to its end mid-burst. A client of Anthropic's that sets no
breakpoint near its prompt's end has no such cache (entries are written at breakpoints only): everything after the
proxy's own breakpoints is read at the full input price on every request, and a reduction that frees tokens saves
them at once (``CacheRates.cached``: the dialect says which, ``Dialect.caches_tail``).

Deferring a reduction to the trigger never costs a change: the reduction comes then anyway, and the trigger's
masking is as deep (``proxy.context.view.batches``). What it costs is the reads of the tokens it would have freed
meanwhile, which is what the warm test weighs.

A summary call's own cost is in no test here: the engine starts a summary only past the soft threshold (the trigger
a few steps of growth away), and only where masking would not bring the view back under it
(``ContextEngine.prepare``), so every way to the trigger pays for that summary, and once made it is spent. When it
lands is the one choice left, and ``timely`` makes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from proxy.context.view.window import model_prices

__all__ = ["COLD", "DUE_STEPS", "WARM", "CacheRates", "Moment", "cache_rates", "steps_left", "timely"]

#: Steps of growth below the trigger inside which a reduction counts as due: a cold moment makes it at once, a warm
#: one weighs it; farther away, the prefix stays as it is mid-burst.
DUE_STEPS = 5
#: Anthropic's cache prices, as multiples of the input price: where the model map names none.
WRITE_RATE, READ_RATE = 1.25, 0.1


@dataclass(frozen=True)
class CacheRates:
    """A cached prompt's prices per token, as multiples of the model's uncached input price."""

    write: float = WRITE_RATE
    read: float = READ_RATE

    @property
    def cached(self) -> bool:
        """Whether a read costs less than the input price: else nothing is saved by deferring a reduction."""
        return self.read < 1.0


@functools.lru_cache(maxsize=256)
def cache_rates(model: str | None, *, tail_cached: bool = True) -> CacheRates:
    """``model``'s cache write and read prices over its input price: the model map's, a write at the input price
    where it names none (OpenAI's and Gemini's implicit caches bill no premium), Anthropic's for a model it does not
    price. ``tail_cached``: whether the request's prompt is cached to its end (``Dialect.caches_tail``); if not, a
    read is at the input price."""
    prices = model_prices(model) if model else None
    rates = CacheRates() if prices is None else CacheRates(
        prices.cache_write / prices.input if prices.cache_write is not None else 1.0,
        prices.cache_read / prices.input if prices.cache_read is not None else READ_RATE)
    return rates if tail_cached else replace(rates, read=1.0)


@dataclass(frozen=True)
class Moment:
    """The provider's cache as a request finds it: ``cold`` after an idle gap past its life (or at a session's
    first request), and the steps until the session's next such gap is expected (None: it has had none yet)."""

    cold: bool
    steps_to_cold: float | None = None


WARM, COLD = Moment(False), Moment(True)


def steps_left(tokens: int, threshold: int, growth: int) -> int:
    """Requests still under ``threshold`` before a view of ``tokens``, growing ``growth`` a step, passes it (0: the
    next one passes it); a large number when it does not grow."""
    if growth <= 0:
        return 1 << 30
    return max(0, (threshold - tokens) // growth)


def timely(moment: Moment, *, tokens: int, threshold: int, growth: int, freed: int, rewritten: Callable[[], int],
           rates: CacheRates) -> bool:
    """Whether a reduction freeing ``freed`` tokens of a view of ``tokens``, that makes the provider write
    ``rewritten()`` tokens it holds cached again, is to be made now (the module's docstring says when).
    ``rewritten`` is asked only near the trigger mid-burst: counting it walks the view's tail."""
    if tokens > threshold or not rates.cached:
        return True
    left = steps_left(tokens, threshold, growth)
    if moment.cold:
        return moment.steps_to_cold is None or left < max(DUE_STEPS, moment.steps_to_cold)
    if left >= DUE_STEPS:
        return False
    horizon = left if moment.steps_to_cold is None else min(left, moment.steps_to_cold)
    return freed * rates.read * horizon > rewritten() * rates.write
