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

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from proxy.context.checkpoint import (
    Checkpoint,
    CompactionOutcome,
    CompactionResult,
    Pin,
    UserWords,
    masking_checkpoint,
    prefix_hash,
)
from proxy.context.items import ItemModel, cut_points, leading_system_count, round_start_for
from proxy.context.keep.literals import LiteralMaker, shown_text
from proxy.context.keep.pins import carry as carry_pins
from proxy.context.keep.room import Caps, caps
from proxy.context.keep.userwords import carry
from proxy.context.keep.workingset import WorkingSetMaker, refreshed
from proxy.context.summary.callusage import CallUsage
from proxy.context.summary.fallback import reduced_checkpoint
from proxy.context.summary.summarizer import SummaryGenerator
from proxy.context.view.batches import typical_growth
from proxy.context.view.clipping import Measure
from proxy.context.view.masking import first_unmasked, mask_end
from proxy.context.view.projection import ProjectionBuilder
from proxy.context.view.tokens import MessageCounter
from proxy.types import Message

__all__ = ["DEFAULT_KEEP_TOOL_OUTPUTS", "DEFAULT_MIN_GAIN", "DEFAULT_MIN_RETAIN_ROUNDS", "DEFAULT_RETAIN_FRACTION",
           "Checkpoint", "CompactionBackoff", "CompactionResult", "ContextCompactor", "plan_retain_start",
           "prefix_hash", "retain_budget_for"]

DEFAULT_MIN_RETAIN_ROUNDS = 10
#: Share of the window the retained tail may take at most.
DEFAULT_RETAIN_FRACTION = 0.35
#: A compaction that frees less than this share of the request (the view with its fixed part: tool definitions,
#: the answer's room) is not worth its summary call, unless
#: the view is over the window: then any gain counts, and clipping takes care of the rest.
DEFAULT_MIN_GAIN = 0.10
#: Tool outputs never masked: the last ten (``--keep-tool-outputs``), as in "The Complexity Trap".
DEFAULT_KEEP_TOOL_OUTPUTS = 10
#: The most a first summary is taken to cost when judging whether it is worth its call (a later one is taken to be
#: the size of the one before it): the eight sections answered briefly.
FIRST_SUMMARY_TOKENS = 400


def first_summary_tokens(covered: int) -> int:
    """What a first summary of ``covered`` tokens is taken to cost: a quarter of them, at most FIRST_SUMMARY_TOKENS."""
    return min(FIRST_SUMMARY_TOKENS, covered // 4)


#: The artifact trail for a checkpoint: from the previous one's artifacts (JSON form), the conversation, the range
#: ``[start, end)`` newly leaving the verbatim tail and the log's seqs, the merged artifacts and their rendering.
TrailMaker = Callable[[tuple[object, ...], Sequence[Message], int, int, Sequence[int]], tuple[tuple[object, ...], str]]


def retain_budget_for(context_window: int, fraction: float = DEFAULT_RETAIN_FRACTION) -> int:
    return max(1, int(context_window * fraction))


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
    index when there is nothing to split off. A last step over the budget
    keeps the step before it when that one alone fits (``counts`` are view
    tokens: a masked step costs its placeholders): the last step's output is
    the one the next step masks, and a tail that began with it changed the
    view's head twice per summary.
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
    last = cuts[-1]
    if len(cuts) > 1 and suffix[cuts[-2]] - suffix[last] <= retain_budget:
        return cuts[-2]  # the step before fits alone (it is masked): the next masking batch leaves the head as it is
    return last


class CompactionBackoff:
    """Stops proactive compaction of a session after repeated failures, for a cool-down.

    ``failed``, ``timeout`` and ``fallback`` (the model failed, the model-free tier stood in) count; ``ok``
    clears the record; ``skipped`` (a
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
        elif outcome in ("failed", "timeout", "fallback"):
            count = self._failures.pop(key, (0, None))[0] + 1
            until = self._clock() + self.cooldown if count >= self.max_failures else None
            self._failures[key] = (count, until)
            if len(self._failures) > self._max_sessions:
                self._failures.popitem(last=False)


class ContextCompactor:
    """Plans a reduction, has a summary written when one is needed, and returns a checkpoint; pure apart from the
    summary call.

    The tiers, cheapest first: masking old tool outputs (``proxy.context.view.masking``,
    no model call) when that alone brings the view to ``mask_target``; otherwise
    a summary of what leaves the verbatim tail, whose checkpoint masks as well
    and carries the user's own words (``proxy.context.keep.userwords``). ``count``
    must be the estimator the budget policy uses, so that the tail is planned in
    the units the threshold is checked in, and ``measure`` its text measure;
    ``clock`` gives the checkpoint's ``created_at`` (wall-clock seconds).
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
        keep_tool_outputs: int = DEFAULT_KEEP_TOOL_OUTPUTS,
        keep_tool_tokens: int | None = None,
        measure: Measure | None = None,
        user_words_budget: int = 0,
        trail_of: TrailMaker | None = None,
        pins_budget: int = 0,
        working_set_of: WorkingSetMaker | None = None,
        literals_of: LiteralMaker | None = None,
        context_window: int = 0,
    ) -> None:
        self.summarizer = summarizer
        self.count = count
        self.clock = clock
        self.projection = projection
        self.min_retain_rounds = min_retain_rounds
        self.min_gain = min_gain
        self.keep_tool_outputs = keep_tool_outputs
        #: Tokens the kept outputs may take whole (None: only their count bounds them).
        self.keep_tool_tokens = keep_tool_tokens
        self.measure = measure
        self.user_words_budget = user_words_budget
        self.trail_of = trail_of
        self.pins_budget = pins_budget
        self.working_set_of = working_set_of
        self.literals_of = literals_of
        #: The window the parts' floors are shares of (``proxy.context.keep.room``).
        self.context_window = context_window

    def view_tokens(self, view: Sequence[Message], known: Mapping[int, str]) -> int:
        """Tokens of a view; ``known`` maps ``id()`` of conversation messages to their hashes."""
        masked = self.projection.masker.digests
        return sum(self.count(m, known.get(id(m)) or masked.get(id(m))) for m in view)

    def message_counts(self, messages: Sequence[Message], hashes: Sequence[str]) -> list[int]:
        return [self.count(message, digest) for message, digest in zip(messages, hashes, strict=True)]

    def tail_counts(self, messages: Sequence[Message], hashes: Sequence[str], masked_until: int,
                    seqs: Sequence[int], keys: Sequence[str]) -> list[int]:
        """Tokens of each item as the compacted view shows it: an output before ``masked_until`` costs its
        placeholder. The retained tail is budgeted in view tokens; counted whole, the masked steps before the last
        one each cost a full output, the tail of a summary was the last step alone, and the next step's masking
        changed the view's head again (two prefix changes per summary, 15 in 60 steps with 9k of tools)."""
        counts = self.message_counts(messages, hashes)
        masker = self.projection.masker
        for index in range(leading_system_count(self.projection.dialect, messages), masked_until):
            shown = masker.item(self.projection.dialect, messages, index, seqs, keys)
            if shown is not messages[index]:
                counts[index] = self.count(shown, masker.digests.get(id(shown)))
        return counts

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
        mask_target: int | None = None,
        seqs: Sequence[int] = (),
        keys: Sequence[str] = (),
        fallback: bool = False,
        use_model: bool = True,
        fixed: int = 0,
        soft: int | None = None,
        lands_after: int = 0,
    ) -> CompactionResult:
        """Reduce the view: mask when that reaches ``mask_target`` (None: go straight to a summary), else summarise.

        ``budget`` is the token budget of the retained tail; each ``level`` (the
        reactive path) halves it, the retained rounds and the tool outputs kept
        whole. A ``previous`` checkpoint whose prefix no longer matches
        ``hashes`` is ignored. ``min_gain`` overrides the compactor's for this
        call (0 when the view is over the window: any gain is then worth it). The gain is a share of the whole
        request: the messages and the ``fixed`` part no compaction frees (tool definitions, the answer's room);
        measured on the messages alone, a summary freeing 9 % of what Codex sent (8.5k of tools) passed.
        ``soft``: the tokens the view's messages may take before the next summary starts (the soft threshold); a
        summary item whose parts would leave the view nearer it than the rule of ``proxy.context.keep.room``
        allows carries less of them (None: no such rule); ``lands_after``: what the conversation is expected to
        grow before the checkpoint lands.
        ``seqs`` and ``keys`` are the log's seqs and prefix hashes of the
        conversation, which name masked outputs and carried user words.

        With ``fallback``, a summary that cannot be had (failed, timed out,
        refused, or not tried: ``use_model`` False while the failure backoff is
        open) is replaced by the model-free tier (``proxy.context.summary.fallback``):
        the same split, the older turns elided behind a marker, outcome
        ``fallback``. Without it a failed summary changes nothing, except that a
        masking the same compaction computed is kept.
        """
        gain = self.min_gain if min_gain is None else min_gain
        if len(hashes) != len(messages):
            raise ValueError(f"{len(hashes)} hashes for {len(messages)} messages")
        if previous is not None and not previous.matches(hashes):
            previous = None
        known = {id(m): h for m, h in zip(messages, hashes, strict=True)}

        def tokens(checkpoint: Checkpoint | None) -> int:
            return self.view_tokens(self.projection.build(messages, checkpoint, seqs=seqs, keys=keys), known)

        def worth(after: int) -> bool:
            return before - after >= gain * (before + fixed) and before > after

        before = tokens(previous)
        dialect = self.projection.dialect
        system_end = leading_system_count(dialect, messages)
        masked_until = self._mask_until(messages, hashes, previous, level)
        masking: CompactionResult | None = None
        if masked_until > (previous.covers if previous is not None else system_end):
            checkpoint = masking_checkpoint(previous, masked_until, hashes, system_end=system_end, model=model,
                                            created_at=self.clock(), tokens_before=before)
            checkpoint = refreshed(checkpoint, self.working_set_of, messages, seqs)
            after = tokens(checkpoint)
            if worth(after):
                masking = CompactionResult("ok", replace(checkpoint, tokens_after=after), before, after,
                                           f"masked tool outputs before #{masked_until}", tier="mask")
                if mask_target is not None and after <= mask_target:
                    return masking
        counts = self.tail_counts(messages, hashes, masked_until, seqs, keys)
        start = plan_retain_start(dialect, messages, counts, max(1, self.min_retain_rounds >> level),
                                  max(1, budget >> level))
        split_from = previous.retain_start_idx if previous is not None else system_end
        base = previous.summary_end if previous is not None else system_end
        folding_back = base < split_from and use_model  # a model summary would fold the elided range back in
        if start <= split_from and not folding_back:
            return masking or CompactionResult("skipped", None, before, before, "nothing new to summarise")
        start = max(start, split_from)
        opener = round_start_for(dialect, messages, start)
        words, artifacts, trail = self._carried(messages, previous, split_from, start, opener, seqs, counts)
        pins = self._pins(messages, previous, split_from, start, opener, seqs)
        in_hand = self._in_hand(messages, start, masked_until, seqs)
        # Worth a summary call? Judged on the checkpoint it would make, with what the proxy carries and a summary
        # the size of the last one (a first one: ``first_summary_tokens``): judged without them, 11 of 20 calls in
        # 60 steps with 9k of tools were thrown away after the call ("summary left it over 90 %").
        last = previous.summary if previous is not None else ""
        if start > split_from and not worth(tokens(reduced_checkpoint(
                summary=last, summary_end=start, start=start, opener=opener, hashes=hashes,
                masked_until=masked_until, user_words=words, artifacts=artifacts, trail=trail, seqs=seqs,
                model=model, created_at=0.0, tokens_before=before, pins=pins, working_set=in_hand[0],
                files=in_hand[1])) + (0 if last else first_summary_tokens(sum(counts[base:start])))):
            return masking or CompactionResult("skipped", None, before, before, f"would free under {gain:.0%}")
        summary, summary_end, detail, error, outcome, usage = await self._summary(
            messages, previous, base, start, instructions, use_model)
        if error is not None and not fallback:
            # A failed summary keeps the masking the same compaction computed (the backoff still counts it).
            return (replace(masking, summary_error=error, usage=usage) if masking is not None
                    else CompactionResult(outcome, None, before, before, error, usage=usage))
        checkpoint = reduced_checkpoint(
            summary=summary, summary_end=summary_end, start=start, opener=opener, hashes=hashes,
            masked_until=masked_until, user_words=words, artifacts=artifacts, trail=trail, seqs=seqs, model=model,
            created_at=self.clock(), tokens_before=before, pins=pins, working_set=in_hand[0], files=in_hand[1])
        checkpoint = self._with_literals(checkpoint, messages, previous, split_from, start, seqs, keys)
        after = tokens(checkpoint)
        checkpoint, after = self._leaving_room(checkpoint, after, (soft, lands_after), messages, hashes, previous,
                                               split_from, seqs, keys, tokens)
        if not worth(after) and not (folding_back and error is None):
            skipped = CompactionResult("skipped", None, before, after, f"summary left it over {1 - gain:.0%}",
                                       usage=usage)
            return replace(masking or skipped, usage=usage) if error is not None else skipped
        if error is not None:
            return CompactionResult("fallback", replace(checkpoint, tokens_after=after), before, after,
                                    f"model-free tier: {error}", tier="fallback", summary_error=error, usage=usage)
        return CompactionResult("ok", replace(checkpoint, tokens_after=after), before, after, detail, usage=usage)

    def _carried(self, messages: Sequence[Message], previous: Checkpoint | None, split_from: int, start: int,
                 opener: int | None, seqs: Sequence[int], counts: Sequence[int],
                 ) -> tuple[tuple[UserWords, ...], tuple[object, ...], str]:
        """What the proxy itself carries past a split at ``start``: the user's words and the artifact trail of
        ``messages[split_from:start]`` added to the previous checkpoint's."""
        words = previous.user_words if previous is not None else ()
        if self.measure is not None and self.user_words_budget > 0:
            words = carry(self.projection.dialect, messages, words, start=split_from, end=start, opener=opener,
                          previous_opener=previous.round_start_idx if previous is not None else None, seqs=seqs,
                          measure=self.measure, budget=self.user_words_budget, counts=counts)
        artifacts, trail = (previous.artifacts, previous.trail) if previous is not None else ((), "")
        if self.trail_of is not None and start > split_from:
            artifacts, trail = self.trail_of(artifacts, messages, split_from, start, seqs)
        return words, artifacts, trail

    def _leaving_room(self, checkpoint: Checkpoint, after: int, room: tuple[int | None, int],
                      messages: Sequence[Message], hashes: Sequence[str], previous: Checkpoint | None,
                      split_from: int, seqs: Sequence[int], keys: Sequence[str],
                      tokens: Callable[[Checkpoint | None], int]) -> tuple[Checkpoint, int]:
        """``checkpoint`` (a view of ``after`` tokens) with its files in hand and literals capped as
        ``proxy.context.keep.room`` says, so that the view, when it lands (after growing ``room[1]``), sits steps of
        the session's growth below ``room[0]``, where the next summary starts (None: as it is); the view's tokens
        with it."""
        soft, lands_after = room
        if self.measure is None or soft is None:
            return checkpoint, after
        limits = caps(view=after, soft=soft,
                      growth=typical_growth(self.projection.dialect, messages, hashes, self.count),
                      literals=self.measure.text_tokens(checkpoint.literals_text) if checkpoint.literals_text else 0,
                      files=self.measure.text_tokens(checkpoint.files) if checkpoint.files else 0,
                      window=self.context_window, lands_after=lands_after)
        if limits == Caps():
            return checkpoint, after
        start = checkpoint.retain_start_idx
        if limits.files is not None and self.working_set_of is not None:
            rows, files = self.working_set_of(messages, start, checkpoint.masked_until, seqs, limits.files)
            checkpoint = replace(checkpoint, working_set=rows, files=files, files_cap=limits.files)
        checkpoint = self._with_literals(checkpoint, messages, previous, split_from, start, seqs, keys,
                                         cap=limits.literals)
        return checkpoint, tokens(checkpoint)

    def _with_literals(self, checkpoint: Checkpoint, messages: Sequence[Message], previous: Checkpoint | None,
                       split_from: int, start: int, seqs: Sequence[int], keys: Sequence[str],
                       cap: int | None = None) -> Checkpoint:
        """``checkpoint`` with the exact literals of ``messages[:start]`` its view lacks added back
        (``proxy.context.keep.literals``; at most ``cap`` tokens of them, None: their budget), and its receipt; as it
        is without ``literals_of``. The previous checkpoint's literals stand for ``messages[:split_from]``; one
        without a receipt read none, so all is read."""
        if self.literals_of is None:
            return checkpoint
        dialect = self.projection.dialect
        shown = shown_text(dialect, self.projection.build(messages, replace(checkpoint, literals_text=""), seqs=seqs,
                                                          keys=keys))
        if previous is not None and not previous.literal_receipt:  # made before literals were read: read it all
            previous, split_from = None, leading_system_count(dialect, messages)
        rows, text, receipt = self.literals_of(previous.literals if previous is not None else (), messages,
                                               split_from, start, seqs, shown, checkpoint.files, cap=cap)
        return replace(checkpoint, literals=rows, literals_text=text, literal_receipt=receipt.to_json())

    def _pins(self, messages: Sequence[Message], previous: Checkpoint | None, split_from: int, start: int,
              opener: int | None, seqs: Sequence[int]) -> tuple[Pin, ...]:
        """The instruction files and user-pinned text (``proxy.context.keep.pins``) of ``messages[split_from:start]``
        added to the previous checkpoint's."""
        pins = previous.pins if previous is not None else ()
        if self.measure is None or self.pins_budget <= 0:
            return pins
        return carry_pins(self.projection.dialect, messages, pins, start=split_from, end=start, opener=opener,
                          previous_opener=previous.round_start_idx if previous is not None else None, seqs=seqs,
                          measure=self.measure, budget=self.pins_budget)

    def _in_hand(self, messages: Sequence[Message], start: int, masked_until: int,
                 seqs: Sequence[int]) -> tuple[tuple[object, ...], str]:
        """The files in hand whose text a split at ``start`` takes out of the view (``proxy.context.keep.workingset``),
        as of the newest item: (rows for the checkpoint, the section)."""
        if self.working_set_of is None:
            return (), ""
        return self.working_set_of(messages, start, masked_until, seqs)

    async def _summary(self, messages: Sequence[Message], previous: Checkpoint | None, base: int, start: int,
                       instructions: str | None, use_model: bool,
                       ) -> tuple[str, int, str, str | None, CompactionOutcome, CallUsage | None]:
        """The model's summary of ``messages[base:start]`` folded into the previous one: (summary, where it ends,
        detail, error or None, outcome, what the calls cost). On failure the previous summary and its end stand."""
        summary, end = (previous.summary, base) if previous is not None else ("", base)
        if not use_model:
            return summary, end, "", "no summary call: the failure backoff is open", "failed", None
        result = await self.summarizer.summarise(previous.summary if previous is not None else None,
                                                 messages[base:start], self.projection.dialect, first_index=base,
                                                 instructions=instructions)
        if result.outcome == "ok" and result.summary is not None:
            return result.summary, base + result.folded, result.error or "", None, "ok", result.usage
        return summary, end, "", result.error or result.outcome, result.outcome, result.usage

    def _mask_until(self, messages: Sequence[Message], hashes: Sequence[str], previous: Checkpoint | None,
                    level: int) -> int:
        """How far the checkpoint masks: up to the last ``keep_tool_outputs`` outputs that fit ``keep_tool_tokens``
        (fewer, harder pressed)."""
        dialect = self.projection.dialect
        masked = previous.masked_until if previous is not None else 0
        start = first_unmasked(dialect, messages, previous.retain_start_idx if previous is not None else None, masked)
        budget = max(1, self.keep_tool_tokens >> level) if self.keep_tool_tokens is not None else None
        end = mask_end(dialect, messages, start, max(1, self.keep_tool_outputs >> level), budget=budget,
                       size=lambda index: self.count(messages[index], hashes[index]))
        return max(masked, end)
