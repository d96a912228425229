"""The summary generator: folds messages into a rolling structured summary with an injected LLM call.

Rolling: each compaction summarises the previous summary plus only the
messages newly moved out of the verbatim tail, so the cost of a compaction does
not grow with the length of the run. Input too large for the summary model is
cut into chunks folded in order (``s1 = f(prev, c1)``, ``s2 = f(s1, c2)``…);
when the upstream still says the prompt is too long (``complete`` raises
``SummaryInputTooLong``) the chunk size halves, down to a minimum.

The LLM call is injected (``complete``): the HTTP layer implements it with the
caller's credentials and model, which keeps this module free of I/O. Every
call is bounded by ``timeout``; a failure, a timeout or an empty answer is an
outcome, never an exception, and produces no summary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from proxy.context.projection import clip_text
from proxy.context.tokens import chars_tokens
from proxy.types import Message

Complete = Callable[[list[Message]], Awaitable[str]]
SummaryOutcome = Literal["ok", "failed", "timeout"]

DEFAULT_TIMEOUT = 120.0
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
class SummaryResult:
    """``summary`` is set only when ``outcome`` is ``"ok"``; ``calls`` counts LLM calls made."""

    outcome: SummaryOutcome
    summary: str | None = None
    calls: int = 0
    error: str | None = None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) else None for p in content]
        return "\n".join(p if isinstance(p, str) else "[non-text part]" for p in parts)
    return ""


def serialise_message(message: Message, index: int, clip_chars: int) -> str:
    """One message as transcript text; tool outputs and call arguments clipped head + tail."""
    role = str(message.get("role") or "unknown")
    text = _content_text(message.get("content"))
    if role in ("tool", "function"):
        label = f"tool result {message.get('name') or ''} for call {message.get('tool_call_id') or '?'}"
        header = f"[#{index} {' '.join(label.split())}]"
        text = clip_text(text, clip_chars, index)
    else:
        header = f"[#{index} {role}]"
    lines = [header, text] if text else [header]
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            lines.append(f"-> call {orjson.dumps(call).decode()}")
            continue
        arguments = clip_text(str(function.get("arguments") or ""), clip_chars, index)
        lines.append(f"-> call {function.get('name')} {arguments} (id {call.get('id')})")
    return "\n".join(lines)


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
    """Writes and updates summaries; one instance per caller, since ``complete`` carries its credentials."""

    def __init__(
        self,
        complete: Complete,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
        min_chunk_tokens: int = DEFAULT_MIN_CHUNK_TOKENS,
        tool_clip_chars: int = DEFAULT_TOOL_CLIP_CHARS,
        count_text: Callable[[str], int] | None = None,
    ) -> None:
        if timeout <= 0 or max_input_tokens <= 0 or min_chunk_tokens <= 0 or tool_clip_chars <= 0:
            raise ValueError("timeout, max_input_tokens, min_chunk_tokens and tool_clip_chars must be positive")
        self.complete = complete
        self.timeout = timeout
        self.max_input_tokens = max_input_tokens
        self.min_chunk_tokens = min_chunk_tokens
        self.tool_clip_chars = tool_clip_chars
        self.count_text = count_text if count_text is not None else (lambda text: chars_tokens(len(text)))

    async def _call(self, prompt: list[Message]) -> str:
        async with asyncio.timeout(self.timeout):
            return await self.complete(prompt)

    async def summarise(
        self,
        previous: str | None,
        messages: Sequence[Message],
        *,
        first_index: int = 0,
        instructions: str | None = None,
    ) -> SummaryResult:
        """Fold ``messages`` (conversation indices from ``first_index``) into ``previous``."""
        pending = [serialise_message(m, i, self.tool_clip_chars) for i, m in enumerate(messages, first_index)]
        if not pending:
            return SummaryResult("failed", error="nothing to summarise")
        summary = previous
        cap = self.max_input_tokens
        calls = 0
        while pending:
            overhead = self.count_text("\n".join(m["content"] for m in build_prompt(summary, "", instructions)))
            limit = min(cap, self.max_input_tokens - overhead - PROMPT_OVERHEAD_TOKENS)
            if limit < self.min_chunk_tokens:
                return SummaryResult("failed", calls=calls, error=f"chunk limit {limit} under the minimum")
            chunk, rest = take_chunk(pending, limit, self.count_text)
            calls += 1
            try:
                answer = await self._call(build_prompt(summary, chunk, instructions))
            except SummaryInputTooLong:
                cap = limit // 2
                continue
            except TimeoutError:
                return SummaryResult("timeout", calls=calls, error=f"no answer within {self.timeout} s")
            except Exception as exc:  # the injected call may fail in any way; the outcome says so
                return SummaryResult("failed", calls=calls, error=f"{type(exc).__name__}: {exc}")
            if not isinstance(answer, str) or not answer.strip():
                return SummaryResult("failed", calls=calls, error="empty summary")
            summary = answer.strip()
            pending = rest
        return SummaryResult("ok", summary=summary, calls=calls)
