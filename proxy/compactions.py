"""Recent compaction attempts per session, as this process saw them: what the log cannot say.

The log records a compaction only when it succeeded (a ``summary`` and a
``checkpoint`` entry), and not what triggered it or how long it took. The
inspector wants both, and the failures, timeouts and skips too. Writing them to
the log would add entries a replay must skip, for the benefit of a viewer; so
they are kept here instead, fed by the engine's observer: in memory, bounded
(the newest ``per_session`` attempts of the ``max_sessions`` most recently
compacted sessions, plus per-session totals), per process. A restart forgets
them, and under ``serve --workers N`` each worker knows its own.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.context.compactor import CompactionResult
from proxy.store.base import SessionKey


@dataclass(frozen=True, slots=True)
class CompactionEvent:
    ts: float
    trigger: str
    outcome: str
    seconds: float
    tokens_before: int
    tokens_after: int
    detail: str
    #: ``Checkpoint.view_key`` of the checkpoint an ``ok`` attempt wrote ("" otherwise): ties it to its log entry.
    view_key: str


@dataclass
class _SessionRecord:
    events: deque[CompactionEvent]
    totals: Counter[tuple[str, str]] = field(default_factory=Counter)


class RecentCompactions:
    def __init__(self, clock: Callable[[], float], *, max_sessions: int = 1_000, per_session: int = 200) -> None:
        self._clock = clock
        self._max_sessions = max_sessions
        self._per_session = per_session
        self._sessions: OrderedDict[SessionKey, _SessionRecord] = OrderedDict()

    def record(self, key: SessionKey, trigger: str, result: CompactionResult, seconds: float) -> None:
        """The engine's observer (with the metrics'): O(1), never raises."""
        record = self._sessions.get(key)
        if record is None:
            record = self._sessions[key] = _SessionRecord(deque(maxlen=self._per_session))
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
        self._sessions.move_to_end(key)
        view_key = result.checkpoint.view_key if result.checkpoint is not None else ""
        record.events.append(CompactionEvent(self._clock(), trigger, result.outcome, seconds, result.tokens_before,
                                             result.tokens_after, result.detail, view_key))
        record.totals[(trigger, result.outcome)] += 1

    def events(self, key: SessionKey) -> list[CompactionEvent]:
        """The session's newest attempts, oldest first."""
        record = self._sessions.get(key)
        return list(record.events) if record is not None else []

    def totals(self, key: SessionKey) -> dict[tuple[str, str], int]:
        """Attempts by (trigger, outcome) since this process started (or first forgot the session)."""
        record = self._sessions.get(key)
        return dict(record.totals) if record is not None else {}
