"""What the model sees: the seed's ProjectionBuilder / build_model_view.

The view is rebuilt from the conversation and the active checkpoint on every
call and never written back, so a checkpoint can be replaced and nothing is
lost. It is read-only towards its inputs: messages that pass through unchanged
are the caller's own objects (no copies on the hot path); a message that must
change (a clipped tool result, the system message carrying the summary) is a
new dict.

With a checkpoint the view is: leading system/developer messages, one summary
message, the opening user message of the current round when the checkpoint
split that round, then ``messages[retain_start_idx:]``. The compactor only
splits before a user message or before an assistant message (never between a
tool call and its results), which is what keeps the view well-formed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from proxy.types import Message

if TYPE_CHECKING:
    from proxy.context.compactor import Checkpoint

SummaryPlacement = Literal["user", "system"]
SYSTEM_ROLES = frozenset({"system", "developer"})
SUMMARY_HEADER = (
    "[ctxproxy] Summary of earlier work in this conversation. The messages it replaces were compacted "
    "to keep the conversation within the context window; the conversation continues after this summary."
)
ELISION_MARKER = "[… {count} characters elided by ctxproxy; full text in the fact log, message index {index} …]"


def leading_system_count(messages: Sequence[Message]) -> int:
    """Number of system/developer messages at the head: they are always in view and never summarised."""
    count = 0
    for message in messages:
        if message.get("role") not in SYSTEM_ROLES:
            break
        count += 1
    return count


def round_start_for(messages: Sequence[Message], index: int) -> int | None:
    """The user message opening the round that ``index`` falls inside.

    ``None`` when ``index`` is itself a round boundary (a user message, or the
    end of the conversation) or when no user message precedes it.
    """
    if index >= len(messages) or messages[index].get("role") == "user":
        return None
    for i in range(index - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


def clip_text(text: str, max_chars: int, index: int) -> str:
    """Head and tail of ``text`` around a marker that says where the whole text is kept."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    marker = ELISION_MARKER.format(count=len(text) - max_chars, index=index)
    return f"{text[:head]}\n{marker}\n{text[len(text) - tail :] if tail else ''}"


def clip_message(message: Message, index: int, max_chars: int | None) -> Message:
    """``message`` itself, or a clipped copy when it is a tool result longer than ``max_chars``.

    A tool result given as a list of text parts is joined and clipped as one
    string; anything with non-text parts is left alone.
    """
    if max_chars is None or message.get("role") != "tool":
        return message
    content = message.get("content")
    if isinstance(content, list):
        texts = [part.get("text") for part in content if isinstance(part, dict)]
        if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
            return message
        content = "".join(t for t in texts if isinstance(t, str))
    if not isinstance(content, str) or len(content) <= max_chars:
        return message
    return {**message, "content": clip_text(content, max_chars, index)}


def summary_text(checkpoint: Checkpoint) -> str:
    return f"{SUMMARY_HEADER}\n\n{checkpoint.summary.strip()}"


def _with_summary_in_system(head: list[Message], text: str) -> list[Message]:
    if not head:
        return [{"role": "system", "content": text}]
    last = head[-1]
    content = last.get("content")
    if isinstance(content, list):
        merged: Message = {**last, "content": [*content, {"type": "text", "text": text}]}
    else:
        prior = content if isinstance(content, str) else ""
        merged = {**last, "content": f"{prior}\n\n{text}" if prior else text}
    return [*head[:-1], merged]


class ProjectionBuilder:
    """Builds model views with one placement of the summary and one clip limit for tool results."""

    def __init__(self, *, summary_placement: SummaryPlacement = "user", clip_chars: int | None = None) -> None:
        if summary_placement not in ("user", "system"):
            raise ValueError(f"summary_placement must be 'user' or 'system', got {summary_placement!r}")
        if clip_chars is not None and clip_chars <= 0:
            raise ValueError(f"clip_chars must be positive, got {clip_chars}")
        self.summary_placement = summary_placement
        self.clip_chars = clip_chars

    def _tail(self, messages: Sequence[Message], start: int) -> list[Message]:
        if self.clip_chars is None:
            return list(messages[start:])
        return [clip_message(m, i, self.clip_chars) for i, m in enumerate(messages[start:], start)]

    def build(self, messages: Sequence[Message], checkpoint: Checkpoint | None) -> list[Message]:
        if checkpoint is None:
            return self._tail(messages, 0)
        system_end = leading_system_count(messages)
        head = list(messages[:system_end])
        text = summary_text(checkpoint)
        if self.summary_placement == "system":
            view = _with_summary_in_system(head, text)
        else:
            view = [*head, {"role": "user", "content": text}]
        round_start = checkpoint.round_start_idx
        if round_start is not None and system_end <= round_start < checkpoint.retain_start_idx:
            view.append(messages[round_start])
        view.extend(self._tail(messages, max(checkpoint.retain_start_idx, system_end)))
        return view


def build_model_view(
    messages: Sequence[Message],
    checkpoint: Checkpoint | None,
    *,
    summary_placement: SummaryPlacement = "user",
    clip_chars: int | None = None,
) -> list[Message]:
    """The messages to send upstream for ``messages`` under ``checkpoint`` (see the module docstring)."""
    return ProjectionBuilder(summary_placement=summary_placement, clip_chars=clip_chars).build(messages, checkpoint)
