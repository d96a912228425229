"""HTML for messages and log entries. Every string from the log is untrusted and goes through ``e``.

Messages are read through ``render.message_blocks`` (the one place that knows
what a Chat message, a Responses item or an Anthropic message looks like), so
the inspector shows what the CLI shows. Long texts are collapsed (``<details>``)
and clipped at ``SHOWN_CHARS``, with a link to the entry's own page, so one huge
tool output cannot make a page of megabytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from proxy.blocks import content_text, message_blocks, role_label
from proxy.render import iso_time
from proxy.store.base import StoredFact
from proxy.ui import tiers
from proxy.ui.timeline import Mark

#: Texts longer than this, or with more lines, are collapsed.
LONG_CHARS = 1_200
LONG_LINES = 20
#: Characters of one text shown in a request's view; the rest is on the entry's own page.
SHOWN_CHARS = 8_000
#: The same in the log's listing, where a page holds many entries.
LOG_CHARS = 2_000
#: Characters of a one-line preview.
PREVIEW_CHARS = 200


def e(value: object) -> str:
    """Escaped for HTML text and for double- or single-quoted attributes."""
    return escape(str(value), quote=True)


def preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


def is_long(text: str) -> bool:
    return len(text) > LONG_CHARS or text.count("\n") > LONG_LINES


def text_html(text: str, *, label: str, entry_url: str | None = None, limit: int | None = SHOWN_CHARS,
              collapse: bool = True) -> str:
    """``text`` as preformatted text: clipped at ``limit`` (None: whole), collapsed under ``label`` when long."""
    cut = limit is not None and len(text) > limit
    body = f"<pre>{e(text[:limit] if cut else text)}</pre>"
    if cut and limit is not None:
        link = f' <a href="{e(entry_url)}">Whole entry</a>' if entry_url else ""
        body += f'<p class="more">… {len(text) - limit:,} more characters.{link}</p>'
    if collapse and is_long(text):
        lines = text.count("\n") + 1
        return (f'<details class="long"><summary>{e(label)}: {len(text):,} characters, {lines:,} lines · '
                f"{e(preview(text, 80))}</summary>{body}</details>")
    return body


def message_html(message: Mapping[str, Any], *, entry_url: str | None = None, limit: int | None = SHOWN_CHARS) -> str:
    parts = []
    for block in message_blocks(message):
        if block.kind == "call":
            parts.append(f'<div class="call">→ <b>{e(block.name)}</b>'
                         f"{text_html(block.text, label='arguments', entry_url=entry_url, limit=limit)}</div>")
        elif block.kind == "result":
            label = f"tool output ({block.name})" if block.name else "tool output"
            parts.append(f'<div class="result">{text_html(block.text, label=label, entry_url=entry_url, limit=limit)}'
                         "</div>")
        elif block.kind == "reasoning":
            parts.append(f'<details class="reasoning"><summary>reasoning</summary>'
                         f"{text_html(block.text, label='reasoning', entry_url=entry_url, limit=limit, collapse=False)}"
                         "</details>")
        elif block.kind == "other":
            parts.append(f'<p class="part">{e(block.text)}</p>')
        else:
            parts.append(text_html(block.text, label="text", entry_url=entry_url, limit=limit))
    return "".join(parts) or '<p class="empty">(empty)</p>'


def message_preview(message: Mapping[str, Any]) -> str:
    """One line for a message: its text, or its calls."""
    pieces = [f"→ {b.name}({b.text})" if b.kind == "call" else b.text for b in message_blocks(message)]
    return preview(" ".join(pieces)) or "(empty)"


def _head(*cells: str) -> str:
    return '<div class="head">' + " ".join(cells) + "</div>"


def entry_html(fact: StoredFact, *, tokens: int | None, mark: Mark | None, entry_url: str,
               request_url: str | None = None, undo: str = "") -> str:
    """One log entry as an ``<li>``; ``request_url`` links an upstream reply to the request's view, ``undo`` (a
    form) undoes a checkpoint that still applies."""
    seq = f'<a class="seq" href="{e(entry_url)}">#{fact.seq}</a>'
    when = f'<time datetime="{e(iso_time(fact.ts))}">{e(iso_time(fact.ts))}</time>'
    li = f'<li class="entry kind-{e(fact.kind)} source-{e(fact.source)}" id="e{fact.seq}">'
    if fact.kind == "rewind":
        after = ""
        if "from_seq" in fact.extra:  # the lineage tree's rewinds name the entry the branch grows from
            origin = fact.extra["from_seq"]
            after = f" after entry #{e(origin)}" if origin is not None else " from the start"
        text = f"<b>rewind</b>: the conversation continues at message {e(fact.index)}{after}"
        return f"{li}{_head(seq, text, when)}</li>"
    if fact.kind == "retire":
        target = fact.extra.get("checkpoint_seq")
        return f"{li}{_head(seq, f'<b>undo</b>: the compaction at entry #{e(target)} is retired', when)}</li>"
    if fact.kind == "checkpoint":
        return _checkpoint_html(fact, seq, when, mark, undo)
    message = fact.message or {}
    count = f"{tokens:,} tokens" if tokens is not None else ""
    if fact.kind == "summary":
        head = _head(seq, "<b>summary</b>", e(fact.source), e(count), when)
        summary = text_html(content_text(message.get("content")), label="summary", entry_url=entry_url,
                            limit=LOG_CHARS)
        return f"{li}{head}{summary}</li>"
    cells = [seq, f'<span class="idx">[{e(fact.index)}]</span>', f'<b class="role">{e(role_label(message))}</b>',
             e(fact.source), e(count), when]
    if fact.extra.get("partial"):
        cells.append('<span class="badge warn">partial reply</span>')
    if request_url is not None:
        cells.append(f'<a class="req" href="{e(request_url)}">what the model saw</a>')
    return f"{li}{_head(*cells)}{message_html(message, entry_url=entry_url, limit=LOG_CHARS)}</li>"


def _checkpoint_html(fact: StoredFact, seq: str, when: str, mark: Mark | None, undo: str) -> str:
    text, badges, retired = "checkpoint (unreadable)", "", ""
    if mark is not None:
        text = (f"checkpoint ({tiers.LABELS[mark.tier]}): {mark.what} (its messages, by the proxy's count: "
                f"{mark.tokens_before:,} → {mark.tokens_after:,} tokens)")
        if mark.tier == "fallback":
            badges = '<span class="badge warn">no summary could be made: the oldest messages were left out</span>'
        if mark.retired_by is not None:
            badges += f'<span class="badge retired">undone by entry #{mark.retired_by}</span>'
            retired = " retired"
    li = f'<li class="entry kind-checkpoint source-{e(fact.source)}{retired}" id="e{fact.seq}">'
    return f"{li}{_head(seq, f'<b>{e(text)}</b>', when)}{badges}{undo}</li>"
