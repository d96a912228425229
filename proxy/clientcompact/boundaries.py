"""What a client sends after its own compaction: its summary message, or Codex's ``compaction`` item.

After compacting, a client drops its history and starts the next requests with its own summary: Claude Code
with a user message ``This session is being continued from a previous conversation…`` then ``Summary:``;
Codex (local compaction) with the retained user messages and then a user message starting with its summary
prefix. The proxy logs that as a client compaction boundary in the same session, not as a rewind to message 0
that would throw the checkpoints away. Codex's remote compaction instead leaves a ``compaction`` item in its
history, whose ``encrypted_content`` is the reference the proxy signed (``proxy.secret``).

Each function looks at one item, so the request path can ask about the new items only; ``find_boundary`` and
``compaction_references`` walk a list from ``start``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.clientcompact import texts
from proxy.clientcompact.recognise import input_text

#: An optional line Claude Code puts before the continuation text (content written by others was summarised).
_CLAUDE_LEAD_LINE = "<artifact-content-authored-by-others/>\n"


@dataclass(frozen=True, slots=True)
class SummaryBoundary:
    """``items[index]`` carries the client's summary of everything before its compaction."""

    client: Literal["claude_code", "codex"]
    index: int
    summary: str


def claude_code_summary(item: Any) -> str | None:
    """The summary in Claude Code's continuation message, or None when ``item`` is not one.

    The text after ``Summary:`` up to the notes Claude Code appends (transcript path, resume instruction).
    """
    if not isinstance(item, dict) or item.get("role") != "user":
        return None
    for text in _texts(item.get("content")):
        body = text.removeprefix(_CLAUDE_LEAD_LINE)
        if body.startswith(texts.CLAUDE_CONTINUATION):
            return _claude_summary_text(body[len(texts.CLAUDE_CONTINUATION):])
    return None


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [block["text"] for block in content
            if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)]


def _claude_summary_text(rest: str) -> str:
    label = rest.find(texts.CLAUDE_SUMMARY_LABEL)
    summary = rest[label + len(texts.CLAUDE_SUMMARY_LABEL):] if label != -1 else rest
    trailer = texts.CLAUDE_TRAILERS.search(summary)
    return (summary[: trailer.start()] if trailer is not None else summary).strip()


def codex_summary(item: Any) -> str | None:
    """The summary in Codex's summary message (a user message starting with its summary prefix), or None."""
    if not isinstance(item, dict) or item.get("role") != "user" or item.get("type", "message") != "message":
        return None
    text = input_text(item.get("content"))
    if not text.startswith(texts.CODEX_SUMMARY_PREFIX):
        return None
    _, newline, summary = text.partition("\n")
    return summary.strip() if newline else ""


def find_boundary(dialect: str, items: Sequence[Any], start: int = 0) -> SummaryBoundary | None:
    """The last client summary message in ``items[start:]``, for a ``messages`` or ``responses`` request."""
    if dialect == "messages":
        client: Literal["claude_code", "codex"] = "claude_code"
        summary_of = claude_code_summary
    elif dialect == "responses":
        client, summary_of = "codex", codex_summary
    else:
        return None
    for index in range(len(items) - 1, max(start, 0) - 1, -1):
        summary = summary_of(items[index])
        if summary is not None:
            return SummaryBoundary(client, index, summary)
    return None


def compaction_reference(item: Any) -> str | None:
    """The ``encrypted_content`` of a Codex ``compaction`` item carried back, or None for any other item.

    A ``compaction`` item without one gives ``""``, which no reference verifies: it is refused like a forged one.
    """
    kind = item.get("type") if isinstance(item, dict) else None
    if type(kind) is not str or kind not in texts.CODEX_COMPACTION_TYPES:  # a type that is not one: refused later
        return None
    content = item.get("encrypted_content")
    return content if isinstance(content, str) else ""


def compaction_references(items: Sequence[Any], start: int = 0) -> list[tuple[int, str]]:
    """``(index, encrypted_content)`` of every ``compaction`` item in ``items[start:]``, in order."""
    found = []
    for index in range(max(start, 0), len(items)):
        reference = compaction_reference(items[index])
        if reference is not None:
            found.append((index, reference))
    return found
