"""Head-and-tail elision of a long text around a marker naming where the whole text is kept.

A module of its own so that the summary generator (which clips what it
serialises for the summary model) and the projection share it without
importing each other.
"""

from __future__ import annotations

ELISION_MARKER = "[… {count} characters elided by ctxproxy; full text in the fact log, message index {index} …]"


def clip_text(text: str, max_chars: int, index: int) -> str:
    """Head and tail of ``text`` around a marker that says where the whole text is kept."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    marker = ELISION_MARKER.format(count=len(text) - max_chars, index=index)
    return f"{text[:head]}\n{marker}\n{text[len(text) - tail :] if tail else ''}"
