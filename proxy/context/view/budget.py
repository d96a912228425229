"""When to compact: the seed's ContextBudgetPolicy.

Compaction is triggered early, at ``window * compression_threshold``, so the
model keeps room to answer; and never later than ``window - max_tokens`` when
the request reserves that much for the answer. The estimate is the largest of
the sources the ``estimator`` setting enables, because a low estimate means an
upstream rejection, a high one only an early compaction:

- ``chars``: characters ÷ 3 of the view, tool definitions included (the seed);
- ``usage``: the upstream's real ``prompt_tokens`` for the last call on the same
  view base, plus what the view gained since, counted by the per-message
  measure of the estimator (always on: it is the only measured figure); on
  another base (the first view after a compaction) or after a rewind, the
  proxy's own count plus what the upstream counted more on the last call, per
  item (``carried``);
- ``tokenizer``: a tiktoken count (see ``tokens.py``).

``estimator`` picks ``chars`` (chars + usage), ``tokenizer`` (tokenizer + usage)
or ``max`` (all three). The default is ``tokenizer``: measured (docs/BENCHMARKS.md,
"Token estimators"), characters ÷ 3 undercounts Chinese by 42-72 % and hashes by
about 48 %, and overcounts prose and code by 40-58 %; the tokenizer stays within
5 % everywhere except Chinese on non-o200k tokenizers, where ``max`` does no
better because characters ÷ 3 is lower still.

Every figure includes the tool definitions (the model reads them as part of the
prompt), and the limits leave the requested answer room: ``threshold`` is where
compaction starts, ``hard_limit`` what the upstream would refuse.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import orjson

from proxy.context.items import ItemModel
from proxy.context.view.tokens import (
    NON_TEXT_PART_TOKENS,
    MessageCounter,
    TokenCounter,
    chars_tokens,
    text_length,
    tools_chars,
)
from proxy.types import Message

Estimator = Literal["chars", "tokenizer", "max"]
ESTIMATORS: tuple[str, ...] = get_args(Estimator)
DEFAULT_ESTIMATOR: Estimator = "tokenizer"
DEFAULT_CONTEXT_WINDOW = 128_000
DEFAULT_COMPRESSION_THRESHOLD = 0.8
#: Share of the threshold a view may take right after a compaction: the room left is what a steady
#: run grows into before the next compaction (and the next new prompt prefix).
POST_COMPACTION_SHARE = 0.6
#: Steps of growth a compaction leaves room for below the soft threshold, where the next summary starts: with
#: 1k-2.5k outputs in a 16k window the post-compaction target sat 12 % of the window below it (one step).
HEADROOM_STEPS = 5
#: Share of the room beside the fixed part a compacted view keeps at least, whatever the growth: below it the
#: summary would take nearly all of the verbatim tail for a few steps more.
MIN_POST_SHARE = 0.25
#: Room kept for the answer when a request reserves none (``max_tokens``): about one long answer.
DEFAULT_ANSWER_RESERVE = 4_096
#: Tokens the upstream adds to prime the reply (``<|start|>assistant<|message|>``).
REPLY_PRIMING_TOKENS = 3


@dataclass(frozen=True)
class UsageSample:
    """The upstream's real prompt size for one view, kept to estimate the next view built on the same base.

    ``view_key`` names the base (``Checkpoint.view_key``, or ``""`` for no
    checkpoint); ``last_hash`` is the hash of the view's last message, so a
    client that rewound history does not inherit a stale figure. ``local`` is
    the proxy's own count of that view (``Estimate.local``, the log's
    ``tokens.view``; None when not logged): what the upstream counted beyond it
    is carried over to a view on another base (``carried``).
    """

    prompt_tokens: int
    view_key: str
    view_length: int
    last_hash: str
    local: int | None = None

    @classmethod
    def of(cls, dialect: ItemModel, prompt_tokens: int, view: Sequence[Message], view_key: str = "",
           local: int | None = None) -> UsageSample:
        return cls(prompt_tokens, view_key, len(view), dialect.hash(view[-1]) if view else "", local)

    def carried(self, local: int, length: int) -> int | None:
        """The upstream's count of a view of ``length`` items the proxy counts ``local``, which this usage did not
        measure: ``local`` plus what the upstream counted beyond the proxy's count on the measured view, per item
        (None when it counted no more, or the proxy's count of that view is unknown).

        The upstream counts what the proxy's measure leaves out (the wire format's framing, ids, thinking
        signatures) on every item, and a masked item keeps all of it: right after a masking batch the proxy's
        count alone said 1,877 tokens where the upstream counted 6,748 (a fake billing the serialised prompt, 16k
        window), then 6,933 on the next request, when its usage applied again. A summary drops items, and what
        they carried with them: per item, the figure shrinks with the view.
        """
        if self.local is None or self.view_length <= 0 or self.prompt_tokens <= self.local:
            return None
        return local + (self.prompt_tokens - self.local) * length // self.view_length


@dataclass(frozen=True)
class Estimate:
    """The estimate and the figures it was taken from (``None`` where a source did not apply)."""

    tokens: int
    chars: int | None
    usage: int | None
    tokenizer: int | None

    @property
    def local(self) -> int:
        """The proxy's own count, the upstream's usage left out: two views compare by it on the same scale."""
        return max(figure for figure in (self.chars, self.tokenizer, 0) if figure is not None)


class ContextBudgetPolicy:
    """Threshold and estimate for one model window. Holds no per-session state."""

    def __init__(
        self,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        compression_threshold: float = DEFAULT_COMPRESSION_THRESHOLD,
        *,
        estimator: str = DEFAULT_ESTIMATOR,
        counter: TokenCounter | None = None,
    ) -> None:
        if context_window <= 0:
            raise ValueError(f"context_window must be positive, got {context_window}")
        if not 0 < compression_threshold <= 1:
            raise ValueError(f"compression_threshold must be in (0, 1], got {compression_threshold}")
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
        self.context_window = context_window
        self.compression_threshold = compression_threshold
        self.estimator = estimator
        self.counter = counter if counter is not None else TokenCounter()

    @property
    def _uses_chars(self) -> bool:
        return self.estimator in ("chars", "max")

    @property
    def _uses_tokenizer(self) -> bool:
        return self.estimator in ("tokenizer", "max")

    def threshold(self, max_output_tokens: int | None = None) -> int:
        """Estimated prompt tokens above which to compact.

        The answer reservation caps it only when it leaves something: a request
        whose ``max_tokens`` alone fills the window cannot be helped by
        compacting and is left for the upstream to reject.
        """
        limit = int(self.context_window * self.compression_threshold)
        if max_output_tokens is not None and 0 < self.context_window - max_output_tokens < limit:
            return self.context_window - max_output_tokens
        return limit

    def soft_threshold(self, share: float, threshold: int, fixed: int = 0, growth: int = 0) -> int:
        """Where a background summary starts: ``share`` of the window, never past the trigger ``threshold``
        (a large ``max_tokens`` lowers the trigger, and the soft threshold with it, in proportion).

        The share applies to the room beside the ``fixed`` part (the tool
        definitions): 9k of tools in a 16k window left 350 tokens of messages
        under a soft threshold at 60 % of the window, and a summary started at
        every step. It starts at least ``growth`` below the trigger (the steps
        a summary takes, ``proxy.context.view.pace``), so the summary is in before a
        request reaches the trigger.
        """
        soft = int(self.context_window * share)
        full = int(self.context_window * self.compression_threshold)
        scaled = min(soft * threshold // max(1, full), threshold)
        if fixed >= threshold or scaled >= threshold:
            return scaled
        room = threshold - max(0, fixed)
        return min(max(0, fixed) + scaled * room // threshold, max(fixed, threshold - growth))

    def hard_limit(self, max_output_tokens: int | None = None) -> int:
        """Prompt tokens the view must stay under: the window less the room kept for the answer.

        The room is the request's ``max_tokens`` (OpenAI and vLLM refuse a prompt
        it does not fit beside); without one, ``DEFAULT_ANSWER_RESERVE`` tokens,
        at most the window above the threshold, so that a view cut to fit still
        leaves the model room to answer. A reservation that fills the window is
        left for the upstream to reject.
        """
        if max_output_tokens is not None:
            reserve = max_output_tokens if max_output_tokens < self.context_window else 0
        else:
            share = self.context_window - int(self.context_window * self.compression_threshold)
            reserve = min(DEFAULT_ANSWER_RESERVE, share)
        return self.context_window - reserve

    def reduced_target(self, current: Estimate, threshold: int, tools: Sequence[Any] | None, *,
                       soft: int | None = None, growth: int = 0, head: int = 0) -> int:
        """Tokens the messages of a reduced view may take: with the tool definitions it then sits at
        ``POST_COMPACTION_SHARE`` of the room beside them (and the ``head``, the leading system messages' tokens:
        no compaction frees either) under ``threshold``, and at least ``HEADROOM_STEPS``
        steps of ``growth`` below ``soft`` (where the next background summary starts), though never below
        ``MIN_POST_SHARE`` of that room: a steady run grows that long before the next reduction.

        When the upstream's ``usage`` counts more than the local measure
        (``current``), the target shrinks by that ratio: the next threshold
        check believes the upstream.
        """
        local = max(1, current.local)
        scale = max(1.0, current.tokens / local)
        tools_part = self.tools_tokens(tools)
        fixed = tools_part + head
        room = max(0, threshold - fixed)
        total = fixed + room * POST_COMPACTION_SHARE
        if soft is not None and growth > 0:
            total = min(total, max(fixed + room * MIN_POST_SHARE, soft - HEADROOM_STEPS * growth))
        return int(total / scale) - tools_part

    def tail_budget(self, dialect: ItemModel, current: Estimate, threshold: int, retain_budget: int, *,
                    head: Sequence[Message], head_hashes: Sequence[str], summary: str | None,
                    tools: Sequence[Any] | None, soft: int | None = None, growth: int = 0) -> int:
        """Tokens the retained tail may take: the compacted view then sits at ``reduced_target``.

        ``threshold`` is the effective one: with window 8,000 and ``max_tokens``
        5,500 it is 2,500 while 35 % of the window (``retain_budget``) is 2,800,
        and a tail that large left every compacted view over the threshold: each
        step compacted again. The view also carries the leading system messages
        (``head``) and a summary (about as long as the last one, ``summary``).
        """
        leading = sum(self.message_tokens(dialect, m, h) for m, h in zip(head, head_hashes, strict=True))
        fixed = leading + (self.message_tokens(dialect, dialect.with_summary(None, summary)) if summary else 0)
        return max(1, min(retain_budget, self.reduced_target(current, threshold, tools, soft=soft, growth=growth,
                                                                    head=leading) - fixed))

    def text_tokens(self, text: str) -> int:
        """Tokens of a piece of text, by the estimator: what clipping measures a tool result in."""
        chars = chars_tokens(len(text)) if self._uses_chars else 0
        return max(chars, self.counter.text_tokens(text)) if self._uses_tokenizer else chars

    def part_tokens(self, part: Any) -> int:
        """Tokens of a non-text content part (an image, audio, a file), by the estimator."""
        chars = chars_tokens(len(orjson.dumps(part))) if self._uses_chars else 0
        return max(chars, NON_TEXT_PART_TOKENS) if self._uses_tokenizer else chars

    def tools_tokens(self, tools: Sequence[Any] | None) -> int:
        chars = chars_tokens(tools_chars(tools)) if self._uses_chars else 0
        return max(chars, self.counter.tools_tokens(tools)) if self._uses_tokenizer else chars

    def message_tokens(self, dialect: ItemModel, message: Message, digest: str | None = None, /) -> int:
        """Per-message figure for planning a compaction, by the same estimator as ``estimate``."""
        chars = chars_tokens(text_length(dialect, message)) if self._uses_chars else 0
        tokenized = self.counter.message_tokens(dialect, message, digest) if self._uses_tokenizer else 0
        return max(chars, tokenized)

    def counter_for(self, dialect: ItemModel) -> MessageCounter:
        """``message_tokens`` bound to one dialect: the compactor's counter."""

        def count(message: Message, digest: str | None = None, /) -> int:
            return self.message_tokens(dialect, message, digest)

        return count

    def estimate(
        self,
        dialect: ItemModel,
        view: Sequence[Message],
        *,
        tools: Sequence[Any] | None = None,
        usage: UsageSample | None = None,
        view_key: str = "",
        source: tuple[Sequence[Message], Sequence[str]] | None = None,
        made: Mapping[int, str] | None = None,
        session: Hashable | None = None,
    ) -> Estimate:
        """Estimate for sending ``view``.

        ``source`` is the conversation the view was built from and its message
        hashes: view messages that are the conversation's own objects reuse
        those hashes as cache keys instead of hashing megabytes again. When
        ``source[0]`` is ``view`` itself, the hashes are taken by position.
        ``made`` maps ``id()`` of items the projection made (masked outputs) to
        their hashes, for the same reason. ``session`` names whose view this
        is: the tokenizer's sum then starts where it parts from that session's
        last (``TokenCounter.count_many``).
        """
        if source is not None and source[0] is view:
            digests: Sequence[str | None] = source[1]
        else:
            known = reachable(source, len(view)) if source is not None else {}
            digests = [known.get(id(m)) or made.get(id(m)) for m in view] if made else [known.get(id(m)) for m in view]
        chars = None
        if self._uses_chars:
            chars = chars_tokens(sum(text_length(dialect, m) for m in view) + tools_chars(tools))
        tokenized = None
        if self._uses_tokenizer:
            counted = self.counter.count_many(dialect, view, digests, session=session)
            counted += self.counter.tools_tokens(tools)
            tokenized = counted + REPLY_PRIMING_TOKENS
        measured = self._usage_estimate(dialect, view, digests, usage, view_key,
                                        Estimate(0, chars, None, tokenized).local)
        figures = [figure for figure in (chars, measured, tokenized) if figure is not None]
        return Estimate(max(figures, default=0), chars, measured, tokenized)

    def _usage_estimate(self, dialect: ItemModel, view: Sequence[Message], digests: Sequence[str | None],
                        usage: UsageSample | None, view_key: str, local: int) -> int | None:
        """The upstream's count of the base, plus what was added since, measured like any message; for a view on
        another base, or a rewound one, the count carried over from it (``UsageSample.carried``).

        Characters ÷ 3 of a large tool result added since the last call more
        than doubled the estimate (15,025 against a true 6,912 for 66,756
        characters of prose); the tokenizer's counts are cached, so this costs
        nothing the estimate has not already paid.
        """
        if usage is None:
            return None
        if (usage.view_key != view_key or not 0 < usage.view_length <= len(view)
                or dialect.hash(view[usage.view_length - 1]) != usage.last_hash):
            return usage.carried(local, len(view))
        start = usage.view_length
        added = sum(self.message_tokens(dialect, m, d) for m, d in zip(view[start:], digests[start:], strict=True))
        return usage.prompt_tokens + added

    def fixed_tokens(self, tools: Sequence[Any] | None, max_output_tokens: int | None = None) -> int:
        """The part of every request no compaction frees: the tool definitions and the room kept for the answer."""
        return self.tools_tokens(tools) + self.context_window - self.hard_limit(max_output_tokens)

    def fixed_beside(self, estimate: Estimate, tools: Sequence[Any] | None,
                     max_output_tokens: int | None = None) -> int:
        """``fixed_tokens`` on the scale of the local measure of the messages, which a compaction's gain is measured
        in (``ContextCompactor.compact``). Where the upstream's usage counts the messages more than that measure
        (``estimate`` over its ``local`` figure, the fixed part taken out of both), a compaction frees that much more
        than it measures, and the fixed part weighs that much less beside it: Claude Code's 2,600 tokens of system
        prompt and tools, beside 700 tokens of messages measured locally and 2,300 by the upstream, made every summary
        "free under 10 %", and the view went upstream over the window."""
        fixed = self.fixed_tokens(tools, max_output_tokens)
        beside = self.tools_tokens(tools) + REPLY_PRIMING_TOKENS
        local, measured = estimate.local - beside, estimate.tokens - beside
        return fixed * local // measured if 0 < local < measured else fixed

    def should_compact(self, estimate: Estimate, max_output_tokens: int | None = None) -> bool:
        return estimate.tokens > self.threshold(max_output_tokens)


def reachable(source: tuple[Sequence[Message], Sequence[str]], reach: int) -> dict[int, str]:
    """``id()`` to hash of the items of a conversation (``source``: its items and their hashes) that a view of
    ``reach`` items built from it holds: its first and its last ``reach`` (a view keeps the leading system items and
    a tail, and makes what lies between its own: a summary, masked outputs), so that the work grows with the view,
    not with the whole history. An item found nowhere (the opener of a round split by the summary, from the middle
    of a long history) is hashed by whoever counts it, to the same count."""
    items, hashes = source
    known = dict(zip(map(id, items[:reach]), hashes[:reach], strict=True))
    tail = max(len(items) - reach, 0)
    known.update(zip(map(id, items[tail:]), hashes[tail:], strict=True))
    return known


def retry_limit(hard_limit: int, refused_tokens: int) -> int:
    """The prompt limit for a retry after the upstream refused a view estimated at ``refused_tokens``.

    The limit (usually from the window the upstream stated) when it is below
    what was refused; otherwise the estimate undercounts this upstream, and
    each retry asks for a tenth less than the one refused, so retries make
    progress even when the upstream states no figures.
    """
    return hard_limit if hard_limit < refused_tokens else refused_tokens - max(1, refused_tokens // 10)
