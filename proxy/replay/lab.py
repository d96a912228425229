"""A recorded session replayed through the context engine, offline and deterministically.

The session goes through the engine as its agent sent it: each run of
assistant items ends a step, and the step's request is every item before it
(``steps``). Per step, as a front door does (``proxy.http.turn.Turn``): the
session's state is read, ``ContextEngine.prepare`` builds the view (compacting
when it must), and the recorded reply is logged with the request, the stand-in
model having answered with it. A background compaction the step started is
awaited before the next, so a run makes the same decisions every time.

The engine's clock is the recording's (``Recorded``): each step's request
goes at the time its last item was recorded, so the engine sees the session's
idle gaps as the provider's cache did (``proxy.context.view.worth``: a reduction
nothing forces waits mid-burst and lands after a gap past ``--cache-ttl``), and
the cost prices a request after such a gap as a cold cache, its whole prompt
written (``bench/lastingcost.py`` does the same). A format that records no
times (a Gemini CLI saved chat, Chat messages, the store) keeps the clock at 0:
every request mid-burst.

Nothing reaches the user's store: the log is a SQLite file in a temporary
directory, removed afterwards. The clock reads only the recording, a summary
takes no time on it, and the report holds counts and tokens only, never a time,
so two runs of the same input give the same report byte for byte.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy.context.checkpoint import CompactionResult
from proxy.context.engine import ContextEngine, EngineSettings, Trigger
from proxy.context.items import leading_system_count
from proxy.context.log.history import HistoryManager
from proxy.context.summary.summarizer import SECTIONS, Complete, SummaryAnswer
from proxy.context.view.pace import SessionPace
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import Dialect
from proxy.prefixes import shared as common_prefix_length
from proxy.replay import probes as probing
from proxy.replay.cost import Prices, prices_for
from proxy.replay.sources import Recording
from proxy.store.base import SessionKey
from proxy.store.sqlite import SqliteFactLog
from proxy.types import Message

KEY = SessionKey("replay", "replay")
#: What the built-in summariser answers: every section of the summary prompt, holding nothing.
NOTHING = "\n\n".join(f"## {title.split(':')[0]}\n(nothing kept)" for title in SECTIONS)


async def keep_nothing(messages: list[Message], max_tokens: int) -> SummaryAnswer:
    """The built-in summariser (``--summariser none``): a summary that keeps nothing, so that what a view still
    holds after a compaction is the proxy's own doing."""
    return SummaryAnswer(NOTHING)


def steps(dialect: Dialect, items: Sequence[Message]) -> list[tuple[int, int]]:
    """``(start, end)`` of each step's reply: a run of assistant items; the request is ``items[:start]``."""
    out: list[tuple[int, int]] = []
    index = 0
    while index < len(items):
        if dialect.role(items[index]) != "assistant" or index == 0:
            index += 1
            continue
        end = index
        while end < len(items) and dialect.role(items[end]) == "assistant":
            end += 1
        out.append((index, end))
        index = end
    return out


@dataclass
class Compaction:
    """One compaction attempt: how it ended, and what the first view it shaped held (``step``: that view's step; a
    background compaction's checkpoint serves from the step after the one that started it)."""

    step: int
    trigger: str
    outcome: str
    tier: str
    tokens_before: int
    tokens_after: int
    retention: probing.Retention | None = None
    prefix_changes: int = 0
    cost: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "trigger": self.trigger, "outcome": self.outcome, "tier": self.tier,
                "tokens_before": self.tokens_before, "tokens_after": self.tokens_after,
                "prefix_changes_so_far": self.prefix_changes,
                "cost_so_far": None if self.cost is None else round(self.cost, 6),
                "retention": self.retention.to_json() if self.retention is not None else None}


@dataclass
class Report:
    dialect: str
    model: str
    window: int
    summariser: str
    items: int
    steps: int = 0
    probes_from: str = "derived"
    #: The last request as the client sent it, and the last view, in tokens.
    client_tokens: int = 0
    view_tokens: int = 0
    largest_view: int = 0
    over_window: int = 0
    prefix_changes: int = 0
    #: Where the clock came from ("recorded": the source's times; "fixed": none, every request mid-burst), and the
    #: requests after an idle gap past the cache's life (the first request is cold too, and not counted).
    clock: str = "fixed"
    cache_lapses: int = 0
    compactions: list[Compaction] = field(default_factory=list)
    #: Dollars of the prompts (cache reads at the cached price, none after a lapse) and the replies: the proxy's
    #: views, and the client's whole requests as sent (no window), None for a model without prices.
    cost: float | None = None
    cost_as_sent: float | None = None
    retention: probing.Retention | None = None
    truncation: probing.Retention | None = None

    def to_json(self) -> dict[str, Any]:
        def money(value: float | None) -> float | None:
            return None if value is None else round(value, 6)

        return {"dialect": self.dialect, "model": self.model, "window": self.window, "summariser": self.summariser,
                "items": self.items, "steps": self.steps, "probes": self.probes_from,
                "tokens": {"last_request": self.client_tokens, "last_view": self.view_tokens,
                           "largest_view": self.largest_view},
                "over_window": self.over_window, "prefix_changes": self.prefix_changes,
                "clock": self.clock, "cache_lapses": self.cache_lapses,
                "compactions": [c.to_json() for c in self.compactions if c.outcome in ("ok", "fallback")],
                "compaction_attempts": len(self.compactions),
                "cost": {"view": money(self.cost), "as_sent": money(self.cost_as_sent)},
                "retention": {"view": self.retention.to_json() if self.retention else None,
                              "truncation": self.truncation.to_json() if self.truncation else None},
                "missed": self.retention.missed_json() if self.retention else None}


def truncated(dialect: Dialect, items: Sequence[Message], tokens: Sequence[int], window: int) -> list[Message]:
    """Plain truncation: the leading system items and the newest items that fit ``window`` beside them."""
    head = leading_system_count(dialect, items)
    room = window - sum(tokens[:head])
    start = len(items)
    while start > head and tokens[start - 1] <= room:
        start -= 1
        room -= tokens[start]
    return [*items[:head], *items[start:]]


async def replay(recording: Recording, settings: EngineSettings, *, complete: Complete = keep_nothing,
                 summariser: str = "none", model: str | None = None) -> Report:
    """Replay ``recording`` through an engine of ``settings`` over a throwaway store; the report."""
    dialect, items = recording.dialect, recording.items
    model = model or recording.model
    hashes = [dialect.hash(item) for item in items]
    counter = TokenCounter()
    tokens = [counter.message_tokens(dialect, item, digest) for item, digest in zip(items, hashes, strict=True)]
    attempts: list[tuple[Trigger, CompactionResult]] = []

    def observe(key: SessionKey, trigger: Trigger, result: CompactionResult, seconds: float) -> None:
        attempts.append((trigger, result))

    clock = Recorded()
    with tempfile.TemporaryDirectory(prefix="ctxproxy-replay-") as tmp:
        log = await SqliteFactLog.open(Path(tmp) / "replay.db")
        engine = ContextEngine(HistoryManager(log, clock=clock), settings, clock=clock, observer=observe,
                               counter=counter)
        engine.pace = RecordedPace(clock, ttl=settings.cache_ttl)
        try:
            return await _run(engine, recording, model, hashes, tokens, complete, summariser, attempts, clock)
        finally:
            await engine.aclose()
            await log.aclose()


async def _run(engine: ContextEngine, recording: Recording, model: str, hashes: list[str], tokens: list[int],
               complete: Complete, summariser: str, attempts: list[tuple[Trigger, CompactionResult]],
               clock: Recorded) -> Report:
    dialect, items = recording.dialect, recording.items
    window = engine.window_for(model)
    prices = prices_for(model)
    report = Report(dialect.name, model, window, summariser, len(items))
    walk = steps(dialect, items)
    final = walk[-1][0] if walk else len(items)  # the last request: items[:final]
    probes = (probing.from_source(recording.probes, dialect, items, final) if recording.probes is not None
              else probing.derive(dialect, items, final))
    report.probes_from = "source" if recording.probes is not None else "derived"
    times = recording.times or []
    origin = next((t for t in times if t is not None), None)  # times from the first known: small, exact floats
    report.clock = "fixed" if origin is None else "recorded"
    last: float | None = None  # the previous request's time: the cache lives ``cache_ttl`` from it
    sums = [0, *itertools.accumulate(tokens)]  # sums[i]: tokens of items[:i]
    view_cost = Bill(prices)
    sent_cost = Bill(prices)
    previous: list[bytes] = []
    waiting: list[Compaction] = []
    view: Sequence[Message] = ()
    request: list[Message] = []
    for number, (start, end) in enumerate(walk, 1):
        request, reply = items[:start], items[start:end]
        if origin is not None:  # the request goes when its last item was recorded (a step without a time: at once)
            recorded = times[start - 1]
            clock.now = clock.now if recorded is None else max(clock.now, recorded - origin)
        cold = last is None or clock.now - last > engine.pace.ttl
        report.cache_lapses += cold and last is not None
        last = clock.now
        state = await engine.history.current(KEY)
        seen = len(attempts)
        prepared = await engine.prepare(KEY, request, hashes[:start], state, dialect=dialect, model=model,
                                        tools=None, max_output=None, complete=complete)
        ahead = len(attempts)  # a background compaction's checkpoint serves from the next step's view on
        if engine.background.running(KEY) is not None:
            await engine.background.join(KEY)
        view = prepared.messages
        current = [orjson.dumps(m) for m in view]
        shared = common_prefix_length(previous, current)
        if previous and shared < len(previous):
            report.prefix_changes += 1
        cached = 0 if cold else sum(engine.counter.message_tokens(dialect, m) for m in view[:shared])
        output = sums[end] - sums[start]
        view_cost.add(prepared.estimate.tokens, cached, output)
        sent_cost.add(sums[start], 0 if cold else report.client_tokens, output)
        report.client_tokens = sums[start]
        report.view_tokens = prepared.estimate.tokens
        report.largest_view = max(report.largest_view, prepared.estimate.tokens)
        report.over_window += prepared.estimate.tokens > window
        previous = current
        report.steps = number
        for made in waiting:  # made while the previous step's reply was awaited: this view is their first
            _measure(made, report, view_cost, probes, view, request)
        waiting = [_attempt(number + 1, trigger, result) for trigger, result in attempts[ahead:]]
        for trigger, result in attempts[seen:ahead]:
            _measure(_attempt(number, trigger, result), report, view_cost, probes, view, request)
        reply_hashes = hashes[start:end]
        extra = {"dialect": dialect.name, "model": model,
                 "tokens": {"client": report.client_tokens, "view": prepared.estimate.tokens}}
        await engine.history.sync(KEY, [*request, *reply], [*hashes[:start], *reply_hashes], upstream_from=start,
                                  extra_upstream=extra, extra_client={"dialect": dialect.name})
    report.compactions += waiting  # made after the last step: no view shows them
    whole = probing.text_of(request)
    report.retention = probing.retention(probes, probing.text_of(view), whole)
    cut = truncated(dialect, request, tokens[: len(request)], window)
    report.truncation = probing.retention(probes, probing.text_of(cut), whole)
    report.cost, report.cost_as_sent = view_cost.dollars, sent_cost.dollars
    return report


def _attempt(step: int, trigger: Trigger, result: CompactionResult) -> Compaction:
    return Compaction(step, trigger, result.outcome, result.tier, result.tokens_before, result.tokens_after)


def _measure(made: Compaction, report: Report, bill: Bill, probes: probing.Probes, view: Sequence[Message],
             request: Sequence[Message]) -> None:
    """Fill in what the view of ``made``'s step shows of it, and add it to the report (in step order)."""
    made.prefix_changes, made.cost = report.prefix_changes, bill.dollars
    if made.outcome in ("ok", "fallback"):
        made.retention = probing.retention(probes, probing.text_of(view), probing.text_of(request))
    report.compactions.append(made)


class Recorded:
    """The replay's clock: seconds since the recording's first known time, set per step (0 throughout for a source
    that records none)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RecordedPace(SessionPace):
    """The engine's pace on the recording's clock, except the time a summary takes: the replay's answer instantly
    (or at the upstream's speed that day), so the process's own figure would make two runs start background
    summaries at different steps; without one, they start a step ahead of the trigger, as at a session's first."""

    def summarised(self, key: Hashable, seconds: float) -> None:
        return None


@dataclass
class Bill:
    """Dollars of a run's requests: uncached and cached prompt tokens and the replies, at ``prices``."""

    prices: Prices | None
    dollars: float | None = None

    def add(self, prompt: int, cached: int, output: int) -> None:
        if self.prices is None:
            return
        cached = min(cached, prompt)
        self.dollars = (self.dollars or 0.0) + self.prices.cost(prompt - cached, cached, output)
