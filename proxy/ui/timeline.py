"""A session's log folded for the inspector: one point per upstream request, one mark per checkpoint (retired
once a ``retire`` entry undid it).

A point is an upstream reply in the log (a ``message`` entry from the
upstream; the first item of a reply logged as several): the request that produced it sent ``messages[:index]`` of the
lineage, so what the client sent is a prefix sum of message tokens, and what
the model saw is the upstream's own ``usage`` (or, without one, an estimate of
the view from the same prefix sums and the checkpoint its ``view.key`` names).

The log is append-only, so a fold is never redone: ``TimelineCache`` keeps the
folds of the few sessions people are looking at and catches each up with what
was appended since (what a live page polls for); a log that no longer holds the
last entry folded (a store that lost data) is folded afresh. Folding runs in a worker
thread, so a first look at a long session does not stall the proxy's requests;
the request that started it holds the fold's lock until the thread has stopped,
and a request that goes away stops it at the next entry (a fold never outlives
its request, and two never write one timeline). A look folds for at most
``FOLD_SECONDS``; a longer log is read in stretches, one a look, the page polling
for the next at once. A catching-up (one look, or the stretches of a long log's
first reading) tokenizes at most ``tokens.BUDGET_CHARS``; past it messages count
as characters ÷ 3. The folds kept are bounded by count and by bytes
(``TimelineCache.bytes``).
Replay semantics are ``render.Lineage``'s; this module only follows it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import orjson

from proxy.context.checkpoint import Tier
from proxy.context.compactor import Checkpoint
from proxy.context.items import leading_system_count
from proxy.context.log.lineage import common_prefix
from proxy.context.log.tiers import tier_of_entry
from proxy.context.view.projection import SUMMARY_END, summary_text
from proxy.context.view.tokens import BUDGET_CHARS, TokenCounter
from proxy.render import PAGE, Lineage
from proxy.store.base import FactLog, SessionKey, StoredFact
from proxy.ui.tiers import described

#: Folds kept: each holds its session's lineage, so only a handful, and at most ``MAX_CACHED_BYTES`` of them.
MAX_CACHED = 4
MAX_CACHED_BYTES = 256 * 1024 * 1024
#: Seconds one look folds for at most, a page of entries at a time: a longer log is shown as far as it is read
#: (the page says so), and each live poll (or reload) reads on from there. Time, not a count of entries, since
#: an entry's cost ranges from a short message to a megabyte: the first look at any session answers in about
#: this, and a 40,000-entry session is whole a poll or two later.
FOLD_SECONDS = 0.5
#: What a fold keeps per entry besides the message's text (its dict, the state's index, the prefix sum).
ENTRY_BYTES = 600


@dataclass(frozen=True, slots=True)
class Point:
    """One upstream request."""

    n: int
    seq: int
    #: Position of the reply in its lineage: the request carried the ``index`` messages before it.
    index: int
    ts: float
    sent: int
    #: The upstream's prompt tokens when ``measured``, else the estimate of the view.
    seen: int
    measured: bool
    cached: int | None
    view_key: str
    view_length: int | None
    partial: bool


@dataclass(frozen=True, slots=True)
class Mark:
    """One checkpoint: it stands in for messages ``first`` … ``retain_start - 1`` from point ``position`` on."""

    seq: int
    ts: float
    position: int
    first: int
    retain_start: int
    tokens_before: int
    tokens_after: int
    view_key: str
    #: Where the model-free tier's elided range starts (``Checkpoint.summarised_until``); None: nothing elided.
    elided_from: int | None = None
    #: The ``retire`` entry that undid this compaction (``proxy.context.log.undo``); None: it still applies.
    retired_by: int | None = None
    #: The compaction's literal receipt (``Checkpoint.literal_receipt``; empty: made before literals were checked).
    literals: Mapping[str, int] = field(default_factory=dict)
    #: Which tier made it (``proxy.ui.tiers``), and for a masking batch the messages whose tool outputs it masked.
    tier: Tier = "summary"
    masked_from: int = 0
    masked_until: int = 0

    @property
    def what(self) -> str:
        """What it did, in words ("tool outputs of messages 4-9 shortened", "messages 1-44 summarised")."""
        return described(self.tier, first=self.first, retain_start=self.retain_start, elided_from=self.elided_from,
                         masked_from=self.masked_from, masked_until=self.masked_until)


def usage_figures(usage: Mapping[str, object]) -> tuple[int | None, int | None]:
    """(prompt tokens, of which cached) from a Chat, Responses or Anthropic ``usage``; None where absent."""

    def number(value: object) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def detail(name: str) -> int | None:
        details = usage.get(name)
        return number(details.get("cached_tokens")) if isinstance(details, Mapping) else None

    if "prompt_tokens" in usage:
        return number(usage.get("prompt_tokens")), detail("prompt_tokens_details")
    read, created = number(usage.get("cache_read_input_tokens")), number(usage.get("cache_creation_input_tokens"))
    prompt = number(usage.get("input_tokens"))
    if read is not None or created is not None:  # Anthropic: input_tokens excludes the cached parts
        return (prompt or 0) + (read or 0) + (created or 0), read
    return prompt, detail("input_tokens_details")


class Timeline:
    def __init__(self) -> None:
        self.lineage = Lineage()
        self.counter = TokenCounter(maxsize=10_000)
        #: ``prefix[i]``: tokens of the lineage's first ``i`` messages, taken over ``_hashes``.
        self.prefix = [0]
        self._hashes: list[str] = []
        self.points: list[Point] = []
        self.marks: list[Mark] = []
        self.checkpoints: dict[str, Checkpoint] = {}
        #: The checkpoint each mark was made from (``proxy.context.view.applying``), by seq.
        self._made_from: dict[int, int | None] = {}
        #: Each checkpoint by its entry's seq (the tier a mark was made by is read off the one it was made from).
        self._by_seq: dict[int, Checkpoint] = {}
        #: The seq and figures of the last upstream reply folded: the items of one reply make one point.
        self._last_reply: tuple[int, object, object, object] = (-2, None, None, None)
        self._summary_tokens: dict[tuple[str, int | None], int] = {}
        self.kinds: Counter[str] = Counter()
        self.next_seq = 0
        self.updated_at = 0.0
        #: The last entry folded (id, time, hash): a log that no longer has it is not the one folded.
        self.last: tuple[str, float, str | None] = ("", 0.0, None)
        #: Characters the current look may still tokenize (``TimelineCache.fold`` sets it).
        self.budget = BUDGET_CHARS
        #: What the fold holds, estimated: its messages as JSON and ``ENTRY_BYTES`` per entry.
        self.bytes = 0
        #: Whether the last look read the log to its end (else it stopped after ``FOLD_SECONDS``).
        self.complete = True

    def extend(self, facts: Sequence[StoredFact], stop: threading.Event | None = None) -> None:
        """Fold ``facts`` in order, up to the first one met after ``stop`` is set: whole entries only."""
        for fact in facts:
            if stop is not None and stop.is_set():
                return
            self.apply(fact)

    def apply(self, fact: StoredFact) -> None:
        self.bytes += ENTRY_BYTES + (len(orjson.dumps(fact.message)) if fact.message is not None else 0)
        self.lineage.apply(fact)
        self.next_seq, self.updated_at, self.last = fact.seq + 1, fact.ts, (fact.id, fact.ts, fact.hash)
        self.kinds[fact.kind] += 1
        if fact.kind in ("message", "rewind"):
            self._follow(fast=fact.kind == "message")
        if fact.kind == "checkpoint":
            self._mark(fact)
        elif fact.kind == "retire":
            self._retire(fact)
        elif fact.kind == "message" and fact.source == "upstream":
            self._point(fact)

    def message_tokens(self, index: int) -> int:
        return self.prefix[index + 1] - self.prefix[index]

    def _follow(self, *, fast: bool) -> None:
        """Bring the prefix sums to the lineage: one more message, or (after a rewind) whatever changed."""
        hashes, known = self.lineage.hashes, self._hashes
        keep = len(known)
        if not fast or len(hashes) != keep + 1:
            keep = common_prefix(known, hashes)
            del known[keep:], self.prefix[keep + 1:]
        dialect, messages = self.lineage.dialect, self.lineage.messages
        for i in range(keep, len(hashes)):
            known.append(hashes[i])
            tokens, spent = self.counter.count_one(dialect, messages[i], hashes[i], exact=self.budget > 0)
            self.budget -= spent
            self.prefix.append(self.prefix[-1] + tokens)

    def _mark(self, fact: StoredFact) -> None:
        payload = fact.extra.get("checkpoint")
        try:
            checkpoint = Checkpoint.from_json(payload if isinstance(payload, Mapping) else {})
        except ValueError:
            return
        self.checkpoints[checkpoint.view_key] = checkpoint
        made_from = fact.extra.get("made_from") if "made_from" in fact.extra else next(  # logged before entries said
            (m.seq for m in reversed(self.marks) if m.retired_by is None), None)
        self._made_from[fact.seq] = made_from if type(made_from) is int else None
        system = leading_system_count(self.lineage.dialect, self.lineage.messages)
        previous = self._by_seq.get(made_from) if type(made_from) is int else None
        self._by_seq[fact.seq] = checkpoint
        masked_from = max(previous.masked_until, checkpoint.retain_start_idx) if previous is not None else (
            checkpoint.retain_start_idx)
        self.marks.append(Mark(fact.seq, fact.ts, len(self.points), system,
                               checkpoint.retain_start_idx, checkpoint.tokens_before, checkpoint.tokens_after,
                               checkpoint.view_key,
                               checkpoint.summary_end if checkpoint.elision else None,
                               literals=checkpoint.literal_receipt,
                               tier=tier_of_entry(fact.extra, checkpoint, previous), masked_from=masked_from,
                               masked_until=checkpoint.masked_until))

    def _retire(self, fact: StoredFact) -> None:
        """Mark the compaction the entry undid, and the live ones made from it, as retired (as the engine's fold,
        ``ConversationState``, does)."""
        target = fact.extra.get("checkpoint_seq")
        at = bisect.bisect_left(self.marks, target, key=lambda m: m.seq) if type(target) is int else len(self.marks)
        if at == len(self.marks) or self.marks[at].seq != target or self.marks[at].retired_by is not None:
            return
        gone = {self.marks[at].seq}
        for i in range(at, len(self.marks)):
            mark = self.marks[i]
            if mark.retired_by is None and (i == at or self._made_from.get(mark.seq) in gone):
                gone.add(mark.seq)
                self.marks[i] = replace(mark, retired_by=fact.seq)

    def _point(self, fact: StoredFact) -> None:
        """A point per upstream request: a reply logged as several items (Codex's reasoning and message, say)
        carries its figures on each, and its items after the first add none (as ``savings.UsageTotals``)."""
        figures = (fact.extra.get("usage"), fact.extra.get("view"), fact.extra.get("tokens"))
        same_reply = any(f is not None for f in figures) and self._last_reply == (fact.seq - 1, *figures)
        self._last_reply = (fact.seq, *figures)
        if same_reply:
            return
        index = len(self.lineage.messages) - 1
        view = fact.extra.get("view")
        view = view if isinstance(view, Mapping) else {}
        key, length = str(view.get("key") or ""), view.get("length")
        usage = fact.extra.get("usage")
        prompt, cached = usage_figures(usage) if isinstance(usage, Mapping) else (None, None)
        seen = prompt if prompt is not None else self._estimate(index, key)
        self.points.append(Point(len(self.points), fact.seq, index, fact.ts, self.prefix[index], seen,
                                 prompt is not None, cached, key, length if isinstance(length, int) else None,
                                 bool(fact.extra.get("partial"))))

    def _estimate(self, index: int, view_key: str) -> int:
        """The view's tokens from the prefix sums: system, the split round's opener, the tail, and the summary.

        The summary leads the view's first user item (``ProjectionBuilder``), so
        what it adds is that item folded less that item alone, counted once per
        checkpoint and item.
        """
        checkpoint = self.checkpoints.get(view_key)
        if checkpoint is None:
            return self.prefix[index]
        dialect, messages = self.lineage.dialect, self.lineage.messages
        system_end = min(leading_system_count(dialect, messages), index)
        start = min(max(checkpoint.retain_start_idx, system_end), index)
        opener = checkpoint.round_start_idx
        reinserted = opener is not None and system_end <= opener < start
        first = opener if reinserted else start if start < index else None
        key = (view_key, first)
        summary = self._summary_tokens.get(key)
        if summary is None:
            text = summary_text(checkpoint)
            if first is not None and dialect.role(messages[first]) == "user":
                folded = dialect.with_summary(messages[first], text + SUMMARY_END)
                summary = self.counter.message_tokens(dialect, folded) - self.message_tokens(first)
            else:
                summary = self.counter.message_tokens(dialect, dialect.with_summary(None, text))
            self._summary_tokens[key] = summary
        extra = self.message_tokens(opener) if reinserted and opener is not None else 0
        return self.prefix[system_end] + summary + extra + self.prefix[index] - self.prefix[start]


class TimelineCache:
    """The folds of recently viewed sessions (LRU), each caught up under its own lock before use."""

    def __init__(self, size: int = MAX_CACHED, max_bytes: int = MAX_CACHED_BYTES) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self._folds: OrderedDict[SessionKey, tuple[asyncio.Lock, Timeline]] = OrderedDict()

    @property
    def bytes(self) -> int:
        """What the folds kept hold, estimated (``Timeline.bytes``)."""
        return sum(timeline.bytes for _, timeline in self._folds.values())

    def _evict(self, keep: SessionKey) -> None:
        """Drop the least recently used folds but ``keep`` while over the count or the bytes: a fold in use by
        a request stays with it, and its memory goes when that request ends."""
        for key in list(self._folds):
            if len(self._folds) <= self.size and self.bytes <= self.max_bytes:
                return
            if key != keep:
                del self._folds[key]

    @contextlib.asynccontextmanager
    async def fold(self, store: FactLog, key: SessionKey) -> AsyncIterator[Timeline]:
        """The session's fold, caught up with its log (for at most ``FOLD_SECONDS``: see ``Timeline.complete``)
        and held (no one else extends it) until the block ends."""
        entry = self._folds.get(key)
        if entry is None:
            entry = self._folds[key] = (asyncio.Lock(), Timeline())
            self._evict(key)
        self._folds.move_to_end(key)
        lock, timeline = entry
        async with lock:
            if timeline.complete:  # a log read in several looks shares one tokenizing budget
                timeline.budget = BUDGET_CHARS
            started = time.monotonic()
            while True:
                known = timeline.next_seq
                facts = await store.read(key, after=known - 2, limit=PAGE + 1 if known else PAGE)
                if known:  # the read starts at the last entry folded, to check it is still there
                    first = facts[0] if facts else None
                    if first is None or first.seq != known - 1 or (first.id, first.ts, first.hash) != timeline.last:
                        timeline = Timeline()  # a store that lost or replaced the log: fold it afresh
                        if key in self._folds:
                            self._folds[key] = (lock, timeline)
                        continue
                    facts = facts[1:]
                if facts:
                    await extend_off_loop(timeline, facts)
                timeline.complete = len(facts) < PAGE
                if timeline.complete or time.monotonic() - started >= FOLD_SECONDS:
                    break
            self._evict(key)
            yield timeline


async def extend_off_loop(timeline: Timeline, facts: Sequence[StoredFact]) -> None:
    """``timeline.extend(facts)`` in a worker thread, returning only once the thread has stopped: a caller
    cancelled meanwhile (its viewer left) stops it at the next entry, waits for that, then is cancelled."""
    stop = threading.Event()
    done = asyncio.get_running_loop().run_in_executor(None, timeline.extend, facts, stop)
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        stop.set()
        while not done.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([done])
        raise
