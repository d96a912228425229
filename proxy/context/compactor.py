"""The seed's ContextCompactor: where to split, what to summarise, and the checkpoint that results.

Compaction never touches a message: it produces a ``Checkpoint`` (summary text
plus ``retain_start_idx``, where verbatim history resumes) that the projection
applies on every later call. The split keeps the last ``min_retain_rounds``
rounds (a round opens at a user message) but the retained tail must also fit a
token budget, because an agent often runs fifty tool steps inside one round;
then the split moves inside the round, to an assistant step, so a tool call is
never separated from its results, and the projection re-inserts the round's
opening user message.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

import orjson

from proxy.context.chain import chain_hash
from proxy.context.items import ItemModel, cut_points, leading_system_count, round_start_for
from proxy.context.projection import ProjectionBuilder
from proxy.context.summarizer import SummaryGenerator
from proxy.context.tokens import MessageCounter
from proxy.types import Message

CompactionOutcome = Literal["ok", "failed", "timeout", "skipped"]

DEFAULT_MIN_RETAIN_ROUNDS = 10
#: Share of the window the retained tail may take at most.
DEFAULT_RETAIN_FRACTION = 0.35
#: A compaction that frees less than this share of the view is not worth its summary call, unless
#: the view is over the window: then any gain counts, and clipping takes care of the rest.
DEFAULT_MIN_GAIN = 0.10
CHECKPOINT_FORMAT = 1


def retain_budget_for(context_window: int, fraction: float = DEFAULT_RETAIN_FRACTION) -> int:
    return max(1, int(context_window * fraction))


def prefix_hash(hashes: Sequence[str], end: int) -> str:
    """Chain hash over ``hashes[:end]``, folded from ``""``: names the exact prefix a checkpoint covers."""
    digest = ""
    for message_digest in hashes[:end]:
        digest = chain_hash(digest, message_digest)
    return digest


@dataclass(frozen=True)
class Checkpoint:
    """A summary of ``messages[:retain_start_idx]`` (leading system messages excepted).

    ``round_start_idx`` is the user message opening the round that the split
    falls inside, or ``None`` when the split is at a round boundary.
    """

    summary: str
    retain_start_idx: int
    prefix_hash: str
    round_start_idx: int | None
    tokens_before: int
    tokens_after: int
    model: str
    created_at: float

    @property
    def view_key(self) -> str:
        """Names the view base this checkpoint produces, for matching a remembered ``UsageSample``."""
        summary = hashlib.blake2b(self.summary.encode(), digest_size=8).hexdigest()
        return f"{self.retain_start_idx}:{self.prefix_hash}:{summary}"

    def matches(self, hashes: Sequence[str]) -> bool:
        """Whether the conversation still starts with the prefix this checkpoint summarised."""
        return len(hashes) >= self.retain_start_idx and prefix_hash(hashes, self.retain_start_idx) == self.prefix_hash

    def to_json(self) -> str:
        return orjson.dumps({"v": CHECKPOINT_FORMAT, **asdict(self)}, option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def from_json(cls, data: str | bytes | Mapping[str, Any]) -> Checkpoint:
        raw = orjson.loads(data) if isinstance(data, str | bytes) else dict(data)
        if not isinstance(raw, dict) or raw.get("v") != CHECKPOINT_FORMAT:
            raise ValueError(f"not a version {CHECKPOINT_FORMAT} checkpoint")
        try:
            checkpoint = cls(**{f.name: raw[f.name] for f in fields(cls)})
        except KeyError as exc:
            raise ValueError(f"checkpoint lacks field {exc}") from exc
        if not isinstance(checkpoint.summary, str) or not isinstance(checkpoint.retain_start_idx, int):
            raise ValueError("checkpoint has a malformed summary or retain_start_idx")
        return checkpoint


@dataclass(frozen=True)
class CompactionResult:
    """``checkpoint`` is the new one when ``outcome`` is ``"ok"``, else ``None`` (nothing changes)."""

    outcome: CompactionOutcome
    checkpoint: Checkpoint | None
    tokens_before: int
    tokens_after: int
    detail: str = ""


def plan_retain_start(
    dialect: ItemModel, messages: Sequence[Message], counts: Sequence[int], min_retain_rounds: int, retain_budget: int
) -> int:
    """Index where the verbatim tail should start.

    The last ``min_retain_rounds`` rounds, moved later until the tail (plus the
    round's opening user message, re-inserted when the split falls inside a
    round) fits ``retain_budget``. Splits happen only at the dialect's cut
    points (``cut_points``: never between a call and its result, nor after an
    item that travels with the next). When nothing fits, the tail is the last
    step alone: the smallest well-formed tail. Returns the first non-system
    index when there is nothing to split off.
    """
    if len(counts) != len(messages):
        raise ValueError(f"{len(counts)} counts for {len(messages)} messages")
    if min_retain_rounds < 1:
        raise ValueError(f"min_retain_rounds must be at least 1, got {min_retain_rounds}")
    floor = leading_system_count(dialect, messages)
    cuts = cut_points(dialect, messages, floor)
    if not cuts:
        return floor
    roles = [dialect.role(m) for m in messages]
    rounds = [i for i in cuts if roles[i] == "user"]
    by_rounds = rounds[-min_retain_rounds] if len(rounds) > min_retain_rounds else floor
    suffix = [0] * (len(messages) + 1)
    for i in range(len(messages) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + counts[i]
    at_cut = set(cuts)
    opener: int | None = None
    for i in range(floor, len(messages)):
        reinserted = counts[opener] if opener is not None and roles[i] != "user" else 0
        if roles[i] == "user":
            opener = i
        if i in at_cut and i >= by_rounds and suffix[i] + reinserted <= retain_budget:
            return i
    return cuts[-1]


class CompactionBackoff:
    """Stops proactive compaction of a session after repeated failures, for a cool-down.

    ``failed`` and ``timeout`` count; ``ok`` clears the record; ``skipped`` (a
    compaction not worth doing, decided before or after the call) leaves it as
    it is. When the cool-down ends the session gets a fresh set of attempts.
    Bounded: the oldest records are forgotten past ``max_sessions``.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        max_failures: int = 3,
        cooldown: float = 300.0,
        max_sessions: int = 10_000,
    ) -> None:
        self._clock = clock
        self.max_failures = max_failures
        self.cooldown = cooldown
        self._max_sessions = max_sessions
        self._failures: OrderedDict[str, tuple[int, float | None]] = OrderedDict()

    def allowed(self, key: str) -> bool:
        record = self._failures.get(key)
        if record is None or record[1] is None:
            return True
        if self._clock() < record[1]:
            return False
        del self._failures[key]
        return True

    def record(self, key: str, outcome: str) -> None:
        if outcome == "ok":
            self._failures.pop(key, None)
        elif outcome in ("failed", "timeout"):
            count = self._failures.pop(key, (0, None))[0] + 1
            until = self._clock() + self.cooldown if count >= self.max_failures else None
            self._failures[key] = (count, until)
            if len(self._failures) > self._max_sessions:
                self._failures.popitem(last=False)


class ContextCompactor:
    """Plans a split, has the summary written, and returns a checkpoint; pure apart from the summary call.

    ``count`` must be the estimator the budget policy uses, so that the tail is
    planned in the units the threshold is checked in; ``clock`` gives the
    checkpoint's ``created_at`` (wall-clock seconds).
    """

    def __init__(
        self,
        summarizer: SummaryGenerator,
        count: MessageCounter,
        *,
        clock: Callable[[], float],
        projection: ProjectionBuilder,
        min_retain_rounds: int = DEFAULT_MIN_RETAIN_ROUNDS,
        min_gain: float = DEFAULT_MIN_GAIN,
    ) -> None:
        self.summarizer = summarizer
        self.count = count
        self.clock = clock
        self.projection = projection
        self.min_retain_rounds = min_retain_rounds
        self.min_gain = min_gain

    def view_tokens(self, view: Sequence[Message], known: Mapping[int, str]) -> int:
        """Tokens of a view; ``known`` maps ``id()`` of conversation messages to their hashes."""
        return sum(self.count(m, known.get(id(m))) for m in view)

    def message_counts(self, messages: Sequence[Message], hashes: Sequence[str]) -> list[int]:
        return [self.count(message, digest) for message, digest in zip(messages, hashes, strict=True)]

    async def compact(
        self,
        messages: Sequence[Message],
        hashes: Sequence[str],
        previous: Checkpoint | None,
        *,
        budget: int,
        model: str,
        level: int = 0,
        instructions: str | None = None,
        min_gain: float | None = None,
    ) -> CompactionResult:
        """Summarise what moves out of the verbatim tail into a new checkpoint.

        ``budget`` is the token budget of the retained tail; each ``level`` (the
        reactive path) halves it and the retained rounds. A ``previous``
        checkpoint whose prefix no longer matches ``hashes`` is ignored.
        ``min_gain`` overrides the compactor's for this call (0 when the view is
        over the window: any gain is then worth the call).
        """
        gain = self.min_gain if min_gain is None else min_gain
        if len(hashes) != len(messages):
            raise ValueError(f"{len(hashes)} hashes for {len(messages)} messages")
        if previous is not None and not previous.matches(hashes):
            previous = None
        known = {id(m): h for m, h in zip(messages, hashes, strict=True)}
        before = self.view_tokens(self.projection.build(messages, previous), known)
        counts = self.message_counts(messages, hashes)
        rounds = max(1, self.min_retain_rounds >> level)
        dialect = self.projection.dialect
        start = plan_retain_start(dialect, messages, counts, rounds, max(1, budget >> level))
        system_end = leading_system_count(dialect, messages)
        base = previous.retain_start_idx if previous is not None else system_end
        if start <= base:
            return CompactionResult("skipped", None, before, before, "nothing new to summarise")
        opener = round_start_for(dialect, messages, start)
        planned = sum(counts[:system_end]) + sum(counts[start:])
        planned += counts[opener] if opener is not None else 0
        if previous is not None:
            planned += self.count(dialect.with_summary(None, previous.summary))
        if before - planned < gain * before or before <= planned:
            return CompactionResult("skipped", None, before, before, f"would free under {gain:.0%}")
        result = await self.summarizer.summarise(
            previous.summary if previous is not None else None,
            messages[base:start],
            dialect,
            first_index=base,
            instructions=instructions,
        )
        if result.outcome != "ok" or result.summary is None:
            return CompactionResult(result.outcome, None, before, before, result.error or "")
        checkpoint = Checkpoint(
            summary=result.summary,
            retain_start_idx=start,
            prefix_hash=prefix_hash(hashes, start),
            round_start_idx=opener,
            tokens_before=before,
            tokens_after=0,
            model=model,
            created_at=self.clock(),
        )
        after = self.view_tokens(self.projection.build(messages, checkpoint), known)
        if before - after < gain * before or before <= after:
            return CompactionResult("skipped", None, before, after, f"summary left it over {1 - gain:.0%}")
        return CompactionResult("ok", replace(checkpoint, tokens_after=after), before, after)
