"""The summary generator: folds messages into a rolling structured summary with an injected LLM call.

Rolling: each compaction summarises the previous summary plus only the
messages newly moved out of the verbatim tail, so the cost of a compaction does
not grow with the length of the run. Input too large for the summary model is
cut into chunks folded in order (``s1 = f(prev, c1)``, ``s2 = f(s1, c2)``…);
when the upstream still says the prompt is too long (``complete`` raises
``SummaryInputTooLong``) the chunk size halves, down to a minimum.

The LLM call is injected (``complete``): the HTTP layer implements it with the
caller's credentials and model, which keeps this module free of I/O. It is
given the output bound, and says whether the answer finished normally. The
whole fold, every chunk call together, is bounded by ``timeout``. An answer is
used only when it finished normally and has every section heading of
``SECTIONS`` in order: a refusal ("I'm sorry, I can't help with that"), an
answer cut at the output bound or one that lost a section would otherwise
replace the history it summarises. A failure, a timeout or an unusable answer
is an outcome, never an exception, and produces no summary.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from proxy.context.items import ItemModel
from proxy.context.elision import clip_text
from proxy.context.tokens import chars_tokens
from proxy.types import Message

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

SECTIONS = (
    "Goals and constraints: what the user asked for and every constraint they set, in their own words where "
    "the wording matters",
    "Work completed",
    "Key decisions and why they were made",
    "Files touched and how (created, edited, deleted; what changed)",
    "Errors met and how they were resolved (or that they are still open)",
    "Current state",
    "Next steps",
    "Identifiers worth keeping: exact paths, commands, function and variable names, URLs, versions, values",
)
#: The word each section's heading must contain (any case): lenient about numbering and wording, not about a
#: missing section.
SECTION_KEYWORDS = ("goal", "work", "decision", "file", "error", "state", "next", "identifier")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]*(.*)$", re.MULTILINE)
SYSTEM_PROMPT = (
    "You maintain the working memory of a long-running coding agent. Older messages of its conversation are "
    "being removed from its context window; your summary replaces them, so anything you leave out is lost to "
    "the agent. Merge the previous summary (if any) with the new messages into one updated summary. Be "
    "specific and factual; keep exact identifiers; drop pleasantries and superseded detail. Use exactly these "
    "Markdown sections, in this order, writing 'None' under a section with nothing to say:\n"
    + "\n".join(f"## {index}. {section}" for index, section in enumerate(SECTIONS, 1))
    + "\nAnswer with the summary only."
)


class SummaryInputTooLong(Exception):
    """Raised by ``complete`` when the summary model rejects the prompt as too long."""


@dataclass(frozen=True)
class SummaryAnswer:
    """What the summary model answered.

    ``finished`` is False when the answer stopped early (cut at the output
    bound, filtered): its text is never used. ``reason`` is the upstream's own
    word for how it ended, for the outcome's detail.
    """

    text: str
    finished: bool = True
    reason: str = "stop"


#: The summary call: the prompt and the output bound in tokens.
Complete = Callable[[list[Message], int], Awaitable[SummaryAnswer]]


@dataclass(frozen=True)
class SummaryResult:
    """``summary`` is set only when ``outcome`` is ``"ok"``; ``calls`` counts LLM calls made."""

    outcome: SummaryOutcome
    summary: str | None = None
    calls: int = 0
    error: str | None = None


def missing_section(text: str) -> int | None:
    """The number (from 1) of the first section of ``SECTIONS`` without its heading, in order; None if all are there."""
    # One pass over the headings: each section is looked for after the previous one's heading.
    headings = iter(match.group(1).lower() for match in _HEADING.finditer(text))
    for number, keyword in enumerate(SECTION_KEYWORDS, 1):
        pattern = re.compile(r"\b" + keyword)
        if not any(pattern.search(heading) for heading in headings):
            return number
    return None


def unusable(answer: SummaryAnswer) -> str | None:
    """Why ``answer`` cannot be a summary, or None when it can."""
    if not answer.finished:
        return f"summary did not finish (finish_reason {answer.reason!r})"
    if not answer.text.strip():
        return "empty summary"
    missing = missing_section(answer.text)
    if missing is not None:
        return f"summary lacks section {missing} ({SECTIONS[missing - 1].split(':')[0]})"
    return None


def serialise_message(dialect: ItemModel, message: Message, index: int, clip_chars: int) -> str:
    """One item as transcript text: its role (a tool result names its call), then its text, long parts clipped."""
    role = dialect.role(message)
    if role == "tool":
        header = f"[#{index} tool result for call {', '.join(dialect.results(message)) or '?'}]"
    else:
        header = f"[#{index} {role}]"
    text = dialect.transcript(message, lambda part: clip_text(part, clip_chars, index))
    return f"{header}\n{text}" if text else header


def build_prompt(previous: str | None, transcript: str, instructions: str | None = None) -> list[Message]:
    parts = []
    if previous:
        parts.append(f"<previous-summary>\n{previous}\n</previous-summary>")
    parts.append(f"<new-messages>\n{transcript}\n</new-messages>")
    parts.append("Write the updated summary." if previous else "Write the summary.")
    if instructions:
        parts.append(f"Additional instructions for this summary:\n{instructions}")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


def _split_block(block: str, limit: int, count: Callable[[str], int]) -> list[str]:
    """Cuts one block too big for a chunk into pieces of about ``limit`` tokens, in proportion to length."""
    tokens = count(block)
    if tokens <= limit:
        return [block]
    size = max(1, len(block) * limit // tokens)
    return [block[i : i + size] for i in range(0, len(block), size)]


def take_chunk(blocks: Sequence[str], limit: int, count: Callable[[str], int]) -> tuple[str, list[str]]:
    """The longest run of leading blocks within ``limit`` tokens (at least part of one), and the rest."""
    pieces = _split_block(blocks[0], limit, count)
    if len(pieces) > 1:
        return pieces[0], [*pieces[1:], *blocks[1:]]
    used = count(blocks[0])
    end = 1
    while end < len(blocks):
        used += count(blocks[end]) + 1  # the joining newline
        if used > limit:
            break
        end += 1
    return "\n".join(blocks[:end]), list(blocks[end:])


class SummaryGenerator:
    """Writes and updates summaries; one instance per caller, since ``complete`` carries its credentials.

    ``max_input_tokens`` bounds a prompt and ``max_output_tokens`` the answer: together they must fit the summary
    model's window, which the caller knows.
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

    @classmethod
    def for_window(cls, complete: Complete, window: int, *, max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
                   timeout: float = DEFAULT_TIMEOUT) -> SummaryGenerator:
        """A generator whose calls fit a summary model with a ``window``-token context.

        The answer gets at most a quarter of the window: a summary bigger than
        that would crowd the view it is written for. A prompt gets half, since
        chunks are measured as characters / 3, which undercounts dense text (the
        last quarter is that margin); a small window gets up to 4,000 prompt
        tokens beside the answer. The smallest chunk worth a call shrinks with a
        small window, so that one still fits beside a rolling summary.
        """
        output = max(1, min(max_output_tokens, window // 4))
        max_input = max(window // 2, min(4_000, window - output))
        return cls(complete, timeout=timeout, max_input_tokens=max_input, max_output_tokens=output,
                   min_chunk_tokens=max(1, min(DEFAULT_MIN_CHUNK_TOKENS, max_input // 4)))

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
        pending = [serialise_message(dialect, m, i, self.tool_clip_chars) for i, m in enumerate(messages, first_index)]
        if not pending:
            return SummaryResult("failed", error="nothing to summarise")
        summary = previous
        cap = self.max_input_tokens
        calls = 0
        try:
            async with asyncio.timeout(self.timeout):
                while pending:
                    overhead = self.count_text("\n".join(m["content"] for m in build_prompt(summary, "", instructions)))
                    limit = min(cap, self.max_input_tokens - overhead - PROMPT_OVERHEAD_TOKENS)
                    if limit < self.min_chunk_tokens:
                        return SummaryResult("failed", calls=calls, error=f"chunk limit {limit} under the minimum")
                    chunk, rest = take_chunk(pending, limit, self.count_text)
                    calls += 1
                    try:
                        answer = await self.complete(build_prompt(summary, chunk, instructions),
                                                     self.max_output_tokens)
                    except SummaryInputTooLong:
                        cap = limit // 2
                        continue
                    except Exception as exc:  # the injected call may fail in any way; the outcome says so
                        return SummaryResult("failed", calls=calls, error=f"{type(exc).__name__}: {exc}")
                    problem = unusable(answer)
                    if problem is not None:
                        return SummaryResult("failed", calls=calls, error=problem)
                    summary = answer.text.strip()
                    pending = rest
        except TimeoutError:
            return SummaryResult("timeout", calls=calls, error=f"no summary within {self.timeout} s")
        return SummaryResult("ok", summary=summary, calls=calls)
