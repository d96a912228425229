"""Reading a session back for people: its log page by page, its current lineage, its next view, and text for each.

The admin API and the ``ctxproxy sessions`` commands share this module so that
both show the same thing. Two rules shape it:

- A log is only ever read in pages (``pages``), and the transcript renders one
  fact at a time (``Transcript``), so a 100,000-entry log streams out in
  constant memory. Only the view needs the whole lineage in memory, because the
  view is built from it.
- The view is what the next request would send upstream if the client resent
  the logged conversation: the lineage and the engine's ``ConversationState``
  are folded from the *same* facts (``replay``), so a request appending while
  we read cannot leave the messages and the checkpoint out of step.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from proxy.blocks import message_blocks, role_label
from proxy.context.engine import ContextEngine, PreparedView
from proxy.context.history import ConversationState
from proxy.context.messages import message_hash
from proxy.context.projection import SYSTEM_ROLES
from proxy.context.tokens import TokenCounter
from proxy.store.base import FactLog, SessionInfo, SessionKey, StoredFact
from proxy.types import Message

PAGE = 500
#: Clip limits of the human transcript, in characters: enough to recognise a call or a result, not to read it.
ARGUMENTS_CHARS = 200
TOOL_RESULT_CHARS = 500


# -- reading -------------------------------------------------------------------------------------


async def pages(store: FactLog, key: SessionKey, page: int = PAGE) -> AsyncGenerator[list[StoredFact], None]:
    """The session's facts, oldest first, ``page`` at a time; nothing for an unknown session."""
    after = -1
    while True:
        facts = await store.read(key, after=after, limit=page)
        if facts:
            yield facts
        if len(facts) < page:
            return
        after = facts[-1].seq


async def find_tenants(store: FactLog, session: str) -> list[str]:
    """Every tenant that has a session called ``session`` (a full scan of the session index)."""
    return sorted({info.tenant async for info in store.sessions() if info.session == session})


async def session_infos(store: FactLog) -> list[SessionInfo]:
    """Every session, most recently updated first (ties by tenant and id, so the order is stable)."""
    infos = [info async for info in store.sessions()]
    infos.sort(key=lambda i: (-i.updated_at, i.tenant, i.session))
    return infos


def info_json(info: SessionInfo) -> dict[str, Any]:
    """The contract's five fields (``entries`` is for readers of the log, not part of the listing)."""
    return {"tenant": info.tenant, "session": info.session, "messages": info.messages,
            "checkpoints": info.checkpoints, "updated_at": info.updated_at}


def fact_line(fact: StoredFact) -> bytes:
    """One NDJSON line of the log, the entry as the contract prints it."""
    return orjson.dumps(fact.to_json(), default=_plain) + b"\n"


def _plain(obj: object) -> object:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


@dataclass
class Lineage:
    """The conversation a log describes now (messages by index, cut back at rewinds) and its engine state."""

    messages: list[Message] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    state: ConversationState = field(default_factory=ConversationState)
    facts: int = 0

    def apply(self, fact: StoredFact) -> None:
        self.facts += 1
        self.state.apply(fact)
        if fact.kind == "rewind" and fact.index is not None:
            del self.messages[fact.index:], self.hashes[fact.index:]
        elif fact.kind == "message" and fact.message is not None:
            message = dict(fact.message)
            self.messages.append(message)
            self.hashes.append(fact.hash if fact.hash is not None else message_hash(message))


async def replay(store: FactLog, key: SessionKey, *, until: int | None = None) -> Lineage:
    """The lineage after the whole log, or after entry ``until`` (the conversation as it stood then)."""
    lineage = Lineage()
    async with contextlib.aclosing(pages(store, key)) as log:
        async for page in log:
            for fact in page:
                if until is not None and fact.seq > until:
                    return lineage
                lineage.apply(fact)
    return lineage


@dataclass(frozen=True)
class SessionView:
    """The projection of a lineage, plus the window it was planned for (not part of the JSON contract)."""

    prepared: PreparedView
    window: int

    def to_json(self) -> dict[str, Any]:
        checkpoint = self.prepared.checkpoint
        return {"messages": self.prepared.messages, "estimate": self.prepared.estimate.tokens,
                "checkpoint": orjson.loads(checkpoint.to_json()) if checkpoint is not None else None}


def build_view(engine: ContextEngine, lineage: Lineage, model: str) -> SessionView:
    """The view of ``lineage`` as a request without tools or ``max_tokens`` would get it (read-only)."""
    window = engine.window_for(model)
    prepared = engine.view(lineage.messages, lineage.hashes, lineage.state, window=window, tools=None,
                           max_output=None)
    return SessionView(prepared, window)


# -- rendering ------------------------------------------------------------------------------------


def iso_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sessions_table(infos: Sequence[SessionInfo]) -> str:
    """A Markdown table, padded so it also reads as plain text."""
    if not infos:
        return "No sessions."
    header = ("tenant", "session", "messages", "checkpoints", "updated_at")
    rows = [(i.tenant, i.session, str(i.messages), str(i.checkpoints), iso_time(i.updated_at)) for i in infos]
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(len(header))]
    right = {2, 3}

    def line(cells: Iterable[str]) -> str:
        padded = [c.rjust(w) if n in right else c.ljust(w) for n, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "| " + " | ".join(padded) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if n in right else "-" * w for n, w in enumerate(widths)) + " |"
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def clip(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit:,} more characters]"


def message_body(message: Mapping[str, Any]) -> str:
    """Content (tool results clipped), then one ``→ name(arguments)`` line per tool call (arguments clipped)."""
    lines = []
    for block in message_blocks(message):
        if block.kind == "call":
            lines.append(f"→ {block.name}({clip(' '.join(block.text.split()), ARGUMENTS_CHARS)})")
        else:
            lines.append(clip(block.text, TOOL_RESULT_CHARS if block.kind == "result" else None))
    return "\n".join(lines) if lines else "(empty)"


class Transcript:
    """Renders a log one fact at a time, in seq order, as Markdown-ish blocks.

    It keeps only the lineage's roles (to say which messages a checkpoint
    summarised: the leading system messages never are), so memory grows by one
    short string per message, never by the messages themselves.
    """

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter if counter is not None else TokenCounter()
        self.roles: list[str] = []

    def fact(self, fact: StoredFact) -> str:
        if fact.kind == "rewind":
            del self.roles[fact.index or 0:]
            return f"── rewind to message {fact.index} ──"
        if fact.kind == "checkpoint":
            return self._checkpoint(fact.extra.get("checkpoint"))
        message = fact.message or {}
        tokens = self.counter.message_tokens(dict(message), fact.hash) if message else 0
        when = iso_time(fact.ts)
        if fact.kind == "summary":
            return f"### summary · {fact.source} · {tokens:,} tokens · {when}\n{message_body(message)}"
        self.roles.append(str(message.get("role")))
        partial = " · partial reply" if fact.extra.get("partial") else ""
        return (f"### #{fact.index} {role_label(message)} · {fact.source} · {tokens:,} tokens · {when}{partial}\n"
                f"{message_body(message)}")

    def _checkpoint(self, payload: Any) -> str:
        if not isinstance(payload, Mapping):
            return "── checkpoint (unreadable) ──"
        start = int(payload.get("retain_start_idx", 0))
        first = 0
        while first < min(start, len(self.roles)) and self.roles[first] in SYSTEM_ROLES:
            first += 1
        # A typographic range (en dash), as people write one.
        span = f"messages {first}–{start - 1}" if start - 1 > first else f"message {first}"  # noqa: RUF001
        before, after = int(payload.get("tokens_before", 0)), int(payload.get("tokens_after", 0))
        return f"── checkpoint: {span} summarised ({before:,} → {after:,} tokens) ──"


def render_view(view: SessionView, key: SessionKey, counter: TokenCounter | None = None) -> str:
    """The view as the model would read it, one block per message, under a line of figures."""
    counter = counter if counter is not None else TokenCounter()
    prepared = view.prepared
    figures = (f"{prepared.estimate.tokens:,} tokens estimated of a {view.window:,}-token window "
               f"(compaction above {prepared.threshold:,})")
    checkpoint = prepared.checkpoint
    if checkpoint is not None:
        figures += (f"; checkpoint: messages before #{checkpoint.retain_start_idx} summarised "
                    f"({checkpoint.tokens_before:,} → {checkpoint.tokens_after:,} tokens)")
    blocks = [f"# View of session {key.session} (tenant {key.tenant})", figures + "."]
    for position, message in enumerate(prepared.messages):
        tokens = counter.message_tokens(message)
        blocks.append(f"### [{position}] {role_label(message)} · {tokens:,} tokens\n{message_body(message)}")
    return "\n\n".join(blocks)
