"""Reading a session back for people: its log page by page, its current lineage, its next view, and text for each.

The admin API and the ``ctxproxy sessions`` commands share this module so that
both show the same thing. Two rules shape it:

- A log is only ever read in pages (``pages``), and the transcript renders one
  fact at a time (``Transcript``), so a 100,000-entry log streams out without
  holding its messages (the transcript keeps the lineage's hashes only). Only
  the view needs the whole lineage in memory, because the view is built from
  it, and never the other branches of the log's tree.
- The view is what the next request would send upstream if the client resent
  the conversation at the log's head: the lineage and the engine's
  ``ConversationState`` are folded from the *same* facts (``replay``), so a
  request appending while we read cannot leave the messages and the
  checkpoint out of step.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from proxy.blocks import message_blocks, role_label
from proxy.context.engine import ContextEngine
from proxy.context.keep.literals import coverage
from proxy.context.log.lineage import ConversationState
from proxy.context.log.undo import Undone
from proxy.context.view.prepared import PreparedView
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT, Dialect
from proxy.savings import UsageTotals, dialect_of
from proxy.store.base import FactLog, SessionInfo, SessionKey, StoredFact
from proxy.types import Message

PAGE = 500
#: Clip limits of the human transcript, in characters: enough to recognise a call or a result, not to read it.
ARGUMENTS_CHARS = 200
TOOL_RESULT_CHARS = 500


# -- reading -------------------------------------------------------------------------------------


async def pages(store: FactLog, key: SessionKey, page: int = PAGE,
                through: int | None = None) -> AsyncGenerator[list[StoredFact], None]:
    """The session's facts, oldest first, ``page`` at a time (up to seq ``through``); nothing for an unknown session."""
    after = -1
    while through is None or after < through:
        limit = page if through is None else min(page, through - after)
        facts = await store.read(key, after=after, limit=limit)
        if facts:
            yield facts
        if len(facts) < limit:
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
    """The conversation a log's head describes (each message's predecessor followed back) and its engine state.

    Folded fact by fact (``apply``), as the inspector does to follow a live
    session, it keeps every message it met, since a later rewind may return to
    any branch; ``replay`` reads a log in two passes and keeps only the head's.
    """

    state: ConversationState = field(default_factory=ConversationState)
    #: Facts folded (0: no such session).
    facts: int = 0
    #: The API the session speaks, as its newest message entry names it.
    dialect: Dialect = CHAT
    usage: UsageTotals = field(default_factory=UsageTotals)
    _by_seq: dict[int, Message] = field(default_factory=dict, repr=False)
    _messages: list[Message] | None = field(default=None, repr=False)
    #: Seqs and hashes of the conversation described when it is not the head's (``replay(run=True)``).
    _path: tuple[list[int], list[str]] | None = field(default=None, repr=False)

    def apply(self, fact: StoredFact) -> None:
        """Fold one fact. The head's messages are kept up to date as the lineage grows by one message (the
        common case: rebuilding them on every message made a first look at a long session quadratic); a rewind
        has them rebuilt when next read."""
        self.facts += 1
        before = len(self.state.seqs)
        self.state.apply(fact)
        self.usage.add(fact)
        if fact.kind == "rewind":
            self._messages = None
        if fact.kind == "message" and fact.message is not None:
            message = self._by_seq[fact.seq] = dict(fact.message)
            self.dialect = dialect_of(fact)
            seqs = self.state.seqs
            if len(seqs) != before:  # the message joined the head's lineage
                if self._messages is not None and len(self._messages) == before and seqs[-1] == fact.seq:
                    self._messages.append(message)
                else:
                    self._messages = None

    @property
    def messages(self) -> list[Message]:
        if self._messages is None:
            self._messages = [self._by_seq[seq] for seq in (self._path[0] if self._path else self.state.seqs)]
        return self._messages

    @property
    def hashes(self) -> list[str]:
        return self._path[1] if self._path else self.state.hashes


async def replay(store: FactLog, key: SessionKey, *, until: int | None = None, run: bool = False) -> Lineage:
    """The lineage after the whole log, or after entry ``until`` (the conversation as it stood then); with ``run``,
    the run's conversation (``run_end``) instead of the head's.

    A log is a tree, and any later rewind may return to any branch, so one
    pass would have to hold every branch's messages; two passes hold only the
    lineage's. The second stops at the last fact the first folded, so a
    request appending meanwhile cannot put the messages and the checkpoint out
    of step.
    """
    state = ConversationState()
    dialect: Dialect = CHAT
    usage = UsageTotals()
    async for page in pages(store, key, through=until):
        for fact in page:
            state.apply(fact)
            usage.add(fact)
            if fact.kind == "message":
                dialect = dialect_of(fact)
    lineage = Lineage(state, state.next_seq, dialect, usage=usage)
    end = run_end(state) if run else state.head
    if end != state.head:
        lineage._path = state.path_to(end)
    wanted = set(lineage._path[0] if lineage._path else state.seqs)
    async for page in pages(store, key, through=state.next_seq - 1):
        for fact in page:
            if fact.seq in wanted:
                lineage._by_seq[fact.seq] = dict(fact.message or {})
    return lineage


def run_end(state: ConversationState) -> int:
    """The last message of the run's conversation: what an admin action on a session (its view, a compaction)
    addresses, wherever a side call left the log's head.

    Clients send side calls under the run's session (opencode's title call,
    Claude Code's small calls, Gemini CLI's next-speaker check), each on a
    branch of its own that the head moves to; none offers tools, and every
    real client's run does. So: the newest reply to a request that offered
    tools (``ConversationState.run_reply``; a run's request not answered yet
    is left out, as a compaction covers only older messages anyway), else
    the head. Nothing
    tells a tool-less client's side call from its rewind to an earlier
    message, and the head is right for the rewind.
    """
    return state.run_reply if state.run_reply is not None else state.head


@dataclass(frozen=True)
class SessionView:
    """The projection of a lineage, plus the window it was planned for (not part of the JSON contract)."""

    prepared: PreparedView
    window: int
    dialect: Dialect
    usage: UsageTotals = field(default_factory=UsageTotals)

    def to_json(self) -> dict[str, Any]:
        """The contract's three fields, and ``usage``: the upstream's figures summed over the logged replies."""
        checkpoint = self.prepared.checkpoint
        return {"messages": self.prepared.messages, "estimate": self.prepared.estimate.tokens,
                "checkpoint": orjson.loads(checkpoint.to_json()) if checkpoint is not None else None,
                "usage": self.usage.to_json()}


def build_view(engine: ContextEngine, lineage: Lineage, model: str) -> SessionView:
    """The view of ``lineage`` as a request without tools or ``max_tokens`` would get it (read-only)."""
    window = engine.window_for(model)
    prepared = engine.view(lineage.messages, lineage.hashes, lineage.state, dialect=lineage.dialect, window=window,
                           tools=None, max_output=None)
    return SessionView(prepared, window, lineage.dialect, lineage.usage)


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

    It folds the facts into a ``ConversationState`` (hashes and seqs, a few
    hundred bytes per message, never the messages themselves) to follow the
    lineage across rewinds, and remembers which messages lead their lineage
    with system messages only: a checkpoint never summarises those.
    """

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter if counter is not None else TokenCounter()
        self.state = ConversationState()
        self._system_lead: set[int] = set()

    def fact(self, fact: StoredFact) -> str:
        self.state.apply(fact)
        if fact.kind == "rewind":
            return _rewind_line(fact)
        if fact.kind == "checkpoint":
            return self._checkpoint(fact.extra.get("checkpoint"))
        if fact.kind == "retire":
            return f"── retire: the compaction at entry {fact.extra.get('checkpoint_seq')} is undone ──"
        message = dict(fact.message or {})
        tokens = self.counter.message_tokens(dialect_of(fact), message, fact.hash) if message else 0
        when = iso_time(fact.ts)
        if fact.kind == "summary":
            return f"### summary · {fact.source} · {tokens:,} tokens · {when}\n{message_body(message)}"
        seqs = self.state.seqs
        if (seqs and seqs[-1] == fact.seq and dialect_of(fact).role(message) == "system"
                and (len(seqs) == 1 or seqs[-2] in self._system_lead)):
            self._system_lead.add(fact.seq)
        partial = " · partial reply" if fact.extra.get("partial") else ""
        return (f"### #{fact.index} {role_label(message)} · {fact.source} · {tokens:,} tokens · {when}{partial}\n"
                f"{message_body(message)}")

    def _checkpoint(self, payload: Any) -> str:
        if not isinstance(payload, Mapping):
            return "── checkpoint (unreadable) ──"
        start = int(payload.get("retain_start_idx", 0))
        seqs = self.state.seqs
        first = 0
        while first < min(start, len(seqs)) and seqs[first] in self._system_lead:
            first += 1
        masked = int(payload.get("masked_until", 0))
        done = [f"{_span(first, start)} summarised"] if payload.get("summary") else []
        if masked > max(start, first):
            done.append(f"tool outputs of {_span(max(start, first), masked)} masked")
        before, after = int(payload.get("tokens_before", 0)), int(payload.get("tokens_after", 0))
        receipt = payload.get("literal_receipt")
        literals = f"; {coverage(receipt)}" if isinstance(receipt, Mapping) and receipt else ""
        return f"── checkpoint: {', '.join(done) or 'nothing'} ({before:,} → {after:,} tokens{literals}) ──"


def undo_line(undone: Undone) -> str:
    """What an undo did, in a sentence."""
    now = f"the checkpoint at entry #{undone.now}" if undone.now is not None else "the whole history"
    first, *later = undone.retired
    after = f" and the {len(later)} made from it ({', '.join(f'#{s}' for s in later)})" if later else ""
    return (f"Undid the compaction at entry #{first}{after} (retired by entry #{undone.entry}); "
            f"the next view is built from {now}.")


def _span(first: int, end: int) -> str:
    """Messages ``first`` to ``end - 1``, as a typographic range (en dash), as people write one."""
    return f"messages {first}–{end - 1}" if end - 1 > first else f"message {first}"  # noqa: RUF001


def _rewind_line(fact: StoredFact) -> str:
    """Where the lineage goes on: after the entry ``from_seq`` names, from the start, or (an old log) by position."""
    if "from_seq" not in fact.extra:
        return f"── rewind to message {fact.index} ──"
    from_seq = fact.extra["from_seq"]
    after = "from the start" if from_seq is None else f"after entry {from_seq}"
    return f"── rewind to message {fact.index}, {after} ──"


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
        tokens = counter.message_tokens(view.dialect, message)
        blocks.append(f"### [{position}] {role_label(message)} · {tokens:,} tokens\n{message_body(message)}")
    return "\n\n".join(blocks)
