"""The summary generator: folds messages into a rolling structured summary with an injected LLM call.

Rolling: each compaction summarises the previous summary plus only the
messages newly moved out of the verbatim tail, so the cost of a compaction does
not grow with the length of the run. Input too large for the summary model is
cut into balanced chunks (``proxy.context.summary.chunking``) folded in order
(``s1 = f(prev, c1)``, ``s2 = f(s1, c2)``…). Each answer after the first is an
update: the sections that change, merged into the summary so far by
``proxy.context.summary.summarymerge`` and trimmed there to the summary's budget (the
share of the output bound a summary is asked to keep), so that a summary does
not erode by being rewritten whole at every compaction. When the upstream still says the
prompt is too long (``complete`` raises ``SummaryInputTooLong``) the chunk size
halves, down to a minimum. A previous summary that leaves no room for a chunk
beside it is first condensed by one call of its own.

The LLM call is injected (``complete``): the HTTP layer implements it with the
caller's credentials and model, which keeps this module free of I/O. It is
given the output bound, and says whether the answer finished normally; the
prompt asks for a summary within a word budget well under that bound, so that
the rolling summary stays bounded. The whole fold, every call together, is
bounded by ``timeout``: each call gets the time that is left.

Which answers are summaries is ``proxy.context.summary.summaryprompt``'s rule: any
finished, non-empty answer but a refusal. An unusable answer gets the same chunk
asked once more, with a reminder of the format (and, for a cut answer, of a
tighter length); a second unusable answer ends the fold. Each finished chunk is
kept: when a later call fails or the time runs out, the result covers the
messages folded so far (``folded``), so a long conversation compacts over
several steps. A failure, a timeout or an unusable answer is an outcome, never
an exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from proxy.context.items import ItemModel
from proxy.context.summary.callusage import CallUsage, added
from proxy.context.summary.chunking import Block, plan_chunk
from proxy.context.summary.summarymerge import update
from proxy.context.summary.summaryprompt import (
    SECTIONS,
    SUMMARY_SHARE,
    SYSTEM_PROMPT,
    WORDS_PER_TOKEN,
    SummaryAnswer,
    build_prompt,
    condense_prompt,
    reminder_for,
    serialise_message,
    summary_words,
    unusable,
)
from proxy.context.view.tokens import chars_tokens
from proxy.types import Message

__all__ = ["DEFAULT_MAX_INPUT_TOKENS", "DEFAULT_MAX_OUTPUT_TOKENS", "DEFAULT_MIN_CHUNK_TOKENS", "DEFAULT_TIMEOUT",
           "DEFAULT_TOOL_CLIP_CHARS", "PROMPT_OVERHEAD_TOKENS", "SECTIONS", "SYSTEM_PROMPT", "WINDOW_MARGIN",
           "Complete", "SummaryAnswer", "SummaryGenerator", "SummaryInputTooLong", "SummaryOutcome", "SummaryResult",
           "build_prompt", "serialise_message"]

SummaryOutcome = Literal["ok", "failed", "timeout"]

DEFAULT_TIMEOUT = 120.0
#: Output bound of one summary call. Eight sections of a long run fit in a few thousand tokens; the rest is room
#: for a reasoning model's hidden reasoning (which counts against the same bound) and stops a runaway answer.
DEFAULT_MAX_OUTPUT_TOKENS = 8_192
DEFAULT_MAX_INPUT_TOKENS = 64_000
DEFAULT_MIN_CHUNK_TOKENS = 2_000
DEFAULT_TOOL_CLIP_CHARS = 4_000
#: Chat-template tokens around the two prompt messages.
PROMPT_OVERHEAD_TOKENS = 16
#: Share of the summary model's window ``for_window`` leaves unused: the summary model's tokenizer is not the one
#: chunks are counted with, and its chat template adds tokens of its own.
WINDOW_MARGIN = 0.05


class SummaryInputTooLong(Exception):
    """Raised by ``complete`` when the summary model rejects the prompt as too long."""


#: The summary call: the prompt and the output bound in tokens.
Complete = Callable[[list[Message], int], Awaitable[SummaryAnswer]]


@dataclass(frozen=True)
class SummaryResult:
    """``summary`` is set only when ``outcome`` is ``"ok"``; ``calls`` counts LLM calls made.

    ``summary`` covers the first ``folded`` of the messages given, whole
    messages only: all of them on a full success; fewer when a later chunk
    failed or the time ran out (``error`` then says so), so that the caller
    can keep the part that was done.
    """

    outcome: SummaryOutcome
    summary: str | None = None
    calls: int = 0
    error: str | None = None
    folded: int = 0
    #: What the calls cost, whatever the outcome (None: no call answered, or none reported it).
    usage: CallUsage | None = None


class _Stop(Exception):
    """Ends a fold with an outcome (internal: ``summarise`` turns it into its result)."""

    def __init__(self, outcome: SummaryOutcome, error: str) -> None:
        super().__init__(error)
        self.outcome: SummaryOutcome = outcome
        self.error = error


class SummaryGenerator:
    """Writes and updates summaries; one instance per caller, since ``complete`` carries its credentials.

    ``max_input_tokens`` bounds a prompt and ``max_output_tokens`` the answer: together they must fit the summary
    model's window, which the caller knows. ``count_text`` counts a text's tokens (default: characters / 3).
    """

    def __init__(
        self,
        complete: Complete,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
        min_chunk_tokens: int = DEFAULT_MIN_CHUNK_TOKENS,
        tool_clip_chars: int = DEFAULT_TOOL_CLIP_CHARS,
        count_text: Callable[[str], int] | None = None,
    ) -> None:
        if min(timeout, max_input_tokens, max_output_tokens, min_chunk_tokens, tool_clip_chars) <= 0:
            raise ValueError("timeout, token bounds, min_chunk_tokens and tool_clip_chars must be positive")
        self.complete = complete
        self.timeout = timeout
        self.max_input_tokens = max_input_tokens
        self.max_output_tokens = max_output_tokens
        self.min_chunk_tokens = min_chunk_tokens
        self.tool_clip_chars = tool_clip_chars
        self.count_text = count_text if count_text is not None else (lambda text: chars_tokens(len(text)))
        self.words = summary_words(max_output_tokens)
        #: Tokens a merged summary is kept within: the share of the output bound one answer is asked to keep.
        self.summary_tokens = max(1, int(max_output_tokens * SUMMARY_SHARE))

    @classmethod
    def for_window(cls, complete: Complete, window: int, *, max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
                   timeout: float = DEFAULT_TIMEOUT, count_text: Callable[[str], int] | None = None,
                   ) -> SummaryGenerator:
        """A generator whose calls fit a summary model with a ``window``-token context.

        The answer gets at most a quarter of the window: a summary bigger than
        that would crowd the view it is written for. A prompt gets the rest but
        ``WINDOW_MARGIN`` of the window, counted with ``count_text`` (the
        tokenizer's text counter; the prompt's own skeleton is counted call by
        call, not guessed here). The smallest chunk worth a call shrinks with a
        small window, so that one still fits beside a rolling summary.
        """
        output = max(1, min(max_output_tokens, window // 4))
        max_input = max(1, window - output - int(window * WINDOW_MARGIN))
        return cls(complete, timeout=timeout, max_input_tokens=max_input, max_output_tokens=output,
                   min_chunk_tokens=max(1, min(DEFAULT_MIN_CHUNK_TOKENS, max_input // 4)), count_text=count_text)

    def room(self, summary: str | None, instructions: str | None) -> int:
        """Tokens left for a chunk in a prompt carrying ``summary`` and ``instructions``."""
        skeleton = build_prompt(summary, "", instructions, words=self.words)
        return self.max_input_tokens - self.count_text("\n".join(m["content"] for m in skeleton)) \
            - PROMPT_OVERHEAD_TOKENS

    async def summarise(
        self,
        previous: str | None,
        messages: Sequence[Message],
        dialect: ItemModel,
        *,
        first_index: int = 0,
        instructions: str | None = None,
    ) -> SummaryResult:
        """Fold ``messages`` (conversation indices from ``first_index``) into ``previous``, within ``timeout``."""
        texts = [serialise_message(dialect, m, i, self.tool_clip_chars) for i, m in enumerate(messages, first_index)]
        if not texts:
            return SummaryResult("failed", error="nothing to summarise")
        fold = _Fold(self, previous, [Block(text, self.count_text(text)) for text in texts], instructions)
        return await fold.run()


class _Fold:
    """One ``summarise``: the summary so far, what is left, and the last summary that ends on a whole message."""

    def __init__(self, generator: SummaryGenerator, previous: str | None, blocks: list[Block],
                 instructions: str | None) -> None:
        self.generator = generator
        self.summary = previous
        self.pending = blocks
        self.instructions = instructions
        self.total = len(blocks)
        self.folded = 0
        self.kept: str | None = None  # the summary of messages[:folded]
        self.calls = 0
        self.usage: CallUsage | None = None
        self.cap = generator.max_input_tokens
        self.condensed = False
        self.deadline = asyncio.get_running_loop().time() + generator.timeout

    async def run(self) -> SummaryResult:
        try:
            while self.pending:
                await self.step()
        except _Stop as stop:
            if self.kept is None:
                return SummaryResult(stop.outcome, calls=self.calls, error=stop.error, usage=self.usage)
            return SummaryResult("ok", self.kept, self.calls, f"partial: {self.folded} of {self.total} messages "
                                 f"folded, then {stop.error}", self.folded, self.usage)
        return SummaryResult("ok", self.summary, self.calls, None, self.folded, self.usage)

    async def step(self) -> None:
        """Folds the next chunk, or condenses a summary that leaves no room for one."""
        generator = self.generator
        room = generator.room(self.summary, self.instructions)
        if room < generator.min_chunk_tokens:
            await self.condense(room)
            return
        limit = min(self.cap, room)
        if limit < generator.min_chunk_tokens:
            raise _Stop("failed", f"chunk limit {limit} under the minimum")
        chunk, rest = plan_chunk(self.pending, limit, generator.count_text)
        transcript = "\n".join(block.text for block in chunk)
        try:
            answer = await self.ask(build_prompt(self.summary, transcript, self.instructions, words=generator.words))
            problem = unusable(answer)
            if problem is not None:
                answer = await self.ask(build_prompt(self.summary, transcript, self.instructions,
                                                     words=generator.words,
                                                     reminder=reminder_for(answer, generator.words)))
                if (second := unusable(answer)) is not None:
                    raise _Stop("failed", f"{problem}, twice" if second == problem else f"{problem}, then {second}")
        except SummaryInputTooLong:
            self.cap = limit // 2
            return
        self.summary = update(self.summary, answer.text, generator.summary_tokens, generator.count_text)
        self.condensed = False
        self.pending = rest
        self.folded += sum(block.last for block in chunk)
        if chunk[-1].last:
            self.kept = self.summary

    async def condense(self, room: int) -> None:
        """One call that shortens the summary to the word budget, at most half of what it shares with a chunk."""
        generator = self.generator
        summary = self.summary
        shared = room + (generator.count_text(summary) if summary else 0)
        target = min(int(generator.words / WORDS_PER_TOKEN), shared - max(generator.min_chunk_tokens, shared // 2))
        if summary is None or self.condensed or target < 1:
            after = " after condensing the summary" if self.condensed else ""
            raise _Stop("failed", f"chunk limit {room} under the minimum{after}")
        try:
            answer = await self.ask(condense_prompt(summary, max(1, int(target * WORDS_PER_TOKEN))))
        except SummaryInputTooLong:
            raise _Stop("failed", "the summary to condense was refused as too long") from None
        if (problem := unusable(answer)) is not None:
            raise _Stop("failed", f"condensing the summary: {problem}")
        if self.kept == summary:  # it covered whole messages, and the condensed one covers the same
            self.kept = answer.text.strip()
        self.summary = answer.text.strip()
        self.condensed = True

    async def ask(self, prompt: list[Message]) -> SummaryAnswer:
        """One call, within the time left of the whole fold."""
        generator = self.generator
        late = f"no summary within {generator.timeout} s"
        if asyncio.get_running_loop().time() >= self.deadline:
            raise _Stop("timeout", late)
        self.calls += 1
        scope = asyncio.timeout_at(self.deadline)
        try:
            async with scope:
                answer = await generator.complete(prompt, generator.max_output_tokens)
            self.usage = added(self.usage, answer.usage)
            return answer
        except SummaryInputTooLong:
            raise
        except TimeoutError as exc:
            if scope.expired():
                raise _Stop("timeout", late) from None
            raise _Stop("failed", f"{type(exc).__name__}: {exc}") from None
        except Exception as exc:  # the injected call may fail in any way; the outcome says so
            raise _Stop("failed", f"{type(exc).__name__}: {exc}") from None
