"""When to compact: the seed's ContextBudgetPolicy.

Compaction is triggered early, at ``window * compression_threshold``, so the
model keeps room to answer; and never later than ``window - max_tokens`` when
the request reserves that much for the answer. The estimate is the largest of
the sources the ``estimator`` setting enables, because a low estimate means an
upstream rejection, a high one only an early compaction:

- ``chars``: characters ÷ 3 of the view, tool definitions included (the seed);
- ``usage``: the upstream's real ``prompt_tokens`` for the last call on the same
  view base, plus characters ÷ 3 of what the view gained since (always on: it
  is the only measured figure);
- ``tokenizer``: a tiktoken count (see ``tokens.py``).

``estimator`` picks ``chars`` (chars + usage), ``tokenizer`` (tokenizer + usage)
or ``max`` (all three). The default is ``tokenizer``: measured (docs/BENCHMARKS.md,
"Token estimators"), characters ÷ 3 undercounts Chinese by 42-72 % and hashes by
about 48 %, and overcounts prose and code by 40-58 %; the tokenizer stays within
5 % everywhere except Chinese on non-o200k tokenizers, where ``max`` does no
better because characters ÷ 3 is lower still.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from proxy.context.messages import message_hash, text_length
from proxy.context.tokens import TokenCounter, chars_tokens, tools_chars
from proxy.types import Message

Estimator = Literal["chars", "tokenizer", "max"]
ESTIMATORS: tuple[str, ...] = get_args(Estimator)
DEFAULT_ESTIMATOR: Estimator = "tokenizer"
DEFAULT_CONTEXT_WINDOW = 128_000
DEFAULT_COMPRESSION_THRESHOLD = 0.8
#: Tokens the upstream adds to prime the reply (``<|start|>assistant<|message|>``).
REPLY_PRIMING_TOKENS = 3


@dataclass(frozen=True)
class UsageSample:
    """The upstream's real prompt size for one view, kept to estimate the next view built on the same base.

    ``view_key`` names the base (``Checkpoint.view_key``, or ``""`` for no
    checkpoint); ``last_hash`` is the hash of the view's last message, so a
    client that rewound history does not inherit a stale figure.
    """

    prompt_tokens: int
    view_key: str
    view_length: int
    last_hash: str

    @classmethod
    def of(cls, prompt_tokens: int, view: Sequence[Message], view_key: str = "") -> UsageSample:
        return cls(prompt_tokens, view_key, len(view), message_hash(view[-1]) if view else "")


@dataclass(frozen=True)
class Estimate:
    """The estimate and the figures it was taken from (``None`` where a source did not apply)."""

    tokens: int
    chars: int | None
    usage: int | None
    tokenizer: int | None


def requested_output_tokens(body: Mapping[str, Any]) -> int | None:
    """The answer size a Chat Completions request reserves (``max_completion_tokens`` wins, as upstream)."""
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


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

    def message_tokens(self, message: Message, digest: str | None = None, /) -> int:
        """Per-message figure for planning a compaction, by the same estimator as ``estimate``."""
        chars = chars_tokens(text_length(message)) if self._uses_chars else 0
        tokenized = self.counter(message, digest) if self._uses_tokenizer else 0
        return max(chars, tokenized)

    def estimate(
        self,
        view: Sequence[Message],
        *,
        tools: Sequence[Any] | None = None,
        usage: UsageSample | None = None,
        view_key: str = "",
        source: tuple[Sequence[Message], Sequence[str]] | None = None,
    ) -> Estimate:
        """Estimate for sending ``view``.

        ``source`` is the conversation the view was built from and its message
        hashes: view messages that are the conversation's own objects reuse
        those hashes as cache keys instead of hashing megabytes again. When
        ``source[0]`` is ``view`` itself, the hashes are taken by position.
        """
        chars = None
        if self._uses_chars:
            chars = chars_tokens(sum(text_length(m) for m in view) + tools_chars(tools))
        tokenized = None
        if self._uses_tokenizer:
            if source is not None and source[0] is view:
                digests: Sequence[str | None] = source[1]
            else:
                known = {id(m): h for m, h in zip(*source, strict=True)} if source is not None else {}
                digests = [known.get(id(m)) for m in view]
            counted = self.counter.count_many(view, digests) + self.counter.tools_tokens(tools)
            tokenized = counted + REPLY_PRIMING_TOKENS
        measured = _usage_estimate(view, usage, view_key)
        figures = [figure for figure in (chars, measured, tokenized) if figure is not None]
        return Estimate(max(figures, default=0), chars, measured, tokenized)

    def should_compact(self, estimate: Estimate, max_output_tokens: int | None = None) -> bool:
        return estimate.tokens > self.threshold(max_output_tokens)


def _usage_estimate(view: Sequence[Message], usage: UsageSample | None, view_key: str) -> int | None:
    if usage is None or usage.view_key != view_key or not 0 < usage.view_length <= len(view):
        return None
    if message_hash(view[usage.view_length - 1]) != usage.last_hash:
        return None
    return usage.prompt_tokens + chars_tokens(sum(text_length(m) for m in view[usage.view_length :]))
