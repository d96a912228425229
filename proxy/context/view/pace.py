"""How fast a session's steps come and how long its summaries take: when a background summary must start.

A background summary started one step below the trigger is in time only when
it takes less than one step. Agents differ by an order of magnitude in both:
a scripted loop steps every 0.6 s against a summary model taking 3 s (and a
first compaction of two chunk calls, 7 s), and one step waited 2.2 s. So the
engine learns, per session, the time between its requests and the time its
compactions took (the process's own figure stands in for a session's first),
and starts the summary as many steps of growth ahead as the summary takes.

It also learns when the provider's prompt cache is cold (issue 34): a request
after an idle gap longer than the cache's life (``ttl``, ``--cache-ttl``), or a
session's first, finds it so, and the steps between such moments, averaged,
say how soon the next one is expected (``proxy.context.view.worth``).

Bounded: a small record per session, the least recently seen dropped past
``max_sessions``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from proxy.context.view.worth import Moment

__all__ = ["MAX_STEPS_AHEAD", "SessionPace"]

#: Weight of the newest observation in the running averages.
ALPHA = 0.3
#: A gap between two requests longer than this is a pause (a user reading, a laptop asleep), not a step.
IDLE_SECONDS = 120.0
#: The most steps of growth a background summary starts ahead of the trigger (slow summaries, fast steps).
MAX_STEPS_AHEAD = 8
#: Anthropic's default prompt-cache life, in seconds (``--cache-ttl``).
DEFAULT_CACHE_TTL = 300.0


@dataclass
class _Pace:
    last_step: float | None = None
    step_seconds: float | None = None
    summary_seconds: float | None = None
    #: Requests since the cache was last cold, and the running average of the steps between cold moments.
    since_cold: int = 0
    cold_every: float | None = None


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + ALPHA * (new - old)


class SessionPace:
    """Per-session running averages of the time between steps and the time a compaction with a summary took."""

    def __init__(self, clock: Callable[[], float], *, max_sessions: int = 10_000,
                 ttl: float = DEFAULT_CACHE_TTL) -> None:
        self._clock = clock
        self.ttl = ttl
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[Hashable, _Pace] = OrderedDict()
        #: The process's figure for a summary, for a session that has not had one yet.
        self._summary_seconds: float | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    def _of(self, key: Hashable) -> _Pace:
        pace = self._sessions.get(key)
        if pace is None:
            pace = self._sessions[key] = _Pace()
            if len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(key)
        return pace

    def step(self, key: Hashable) -> Moment:
        """A request of the session arrived: the cache as it finds it."""
        pace = self._of(key)
        now = self._clock()
        if pace.last_step is not None and 0 < now - pace.last_step <= IDLE_SECONDS:
            pace.step_seconds = _average(pace.step_seconds, now - pace.last_step)
        cold = pace.last_step is None or now - pace.last_step > self.ttl
        if cold and pace.last_step is not None:  # a gap, not the session's first request
            pace.cold_every = _average(pace.cold_every, pace.since_cold + 1)
        pace.since_cold = 0 if cold else pace.since_cold + 1
        pace.last_step = now
        return Moment(cold, max(1.0, pace.cold_every - pace.since_cold) if pace.cold_every is not None else None)

    def summarised(self, key: Hashable, seconds: float) -> None:
        """A compaction of the session that called the summary model took ``seconds``."""
        self._of(key).summary_seconds = _average(self._of(key).summary_seconds, seconds)
        self._summary_seconds = _average(self._summary_seconds, seconds)

    def steps_ahead(self, key: Hashable) -> int:
        """Steps of growth a background summary should start ahead of the trigger: those the summary takes, and
        one more (1 while either figure is unknown)."""
        pace = self._sessions.get(key)
        if pace is None or pace.step_seconds is None:
            return 1
        summary = pace.summary_seconds if pace.summary_seconds is not None else self._summary_seconds
        if summary is None:
            return 1
        steps = summary / max(pace.step_seconds, 1e-3)
        return min(MAX_STEPS_AHEAD, 1 + math.ceil(steps - 1e-6))  # 3 s over steps of 0.6 s is 5, not 5.000001
