"""A sub-agent that names no sub-agent: a conversation of its own under its parent's session.

Claude Code and Codex mark a sub-agent's requests with a header
(``proxy.sessions.agent_of``); Gemini CLI's sub-agents (its codebase
investigator, any agent it runs as a tool) send nothing of the kind, and under
``ctxproxy run`` they carry the parent's ``X-Session-Id``. Logged in the
parent's session, such a request would move the parent's head to a lineage of
its own (a ``rewind`` to the start), and the parent's next request would look
like a return from a rewind: the parent's log would no longer be what it is
without the sub-agent.

What tells a sub-agent from the parent is how it opens: its own system prompt
(``opening``: the system field and the leading system items), which each
conversation's first message in the log carries (``ConversationState.openings``).
A request is another agent's conversation when the log holds none of its
messages and it opens as none of the session's conversations did, the
session holds more than side calls (a lone exchange: Claude Code's first
request is its quota probe, and the run after it is the parent, not a
sub-agent of the probe; a title call sent since the parent's last request
leaves the head on such an exchange, but not the parent's lineage), and it does
not continue a compaction the client made itself (Claude Code's and Codex's
summaries, Codex's compaction items, Gemini CLI's ``<state_snapshot>``), which
restarts the parent's conversation. A client that edits its first message keeps
its system prompt: that stays an edit (a ``rewind`` in the session, as the
contract has it), and so does anything in a session logged before openings
were. A request that continues an upstream response (``previous_response_id``)
sends only what is new: it is never another's. Another agent's conversation is
the session ``<session>/<fingerprint>``, the fingerprint of its own opening and
first message (``proxy.sessions.fingerprint_session``): every request of the
sub-agent lands there, and the parent's log and checkpoints never see it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import orjson

from proxy.clientcompact import compaction_references, find_boundary
from proxy.context.items import leading_system_count
from proxy.context.log.lineage import TOOLS, ConversationState
from proxy.dialects.base import Dialect, ParsedRequest

#: The request fields that hold a system prompt, by API (Messages, Responses, Gemini).
SYSTEM_FIELDS = ("system", "instructions", "systemInstruction")
#: What Gemini CLI's history starts again with after its own compression (its snapshot, as a user turn).
GEMINI_SNAPSHOT = "<state_snapshot>"
#: How far into a request a client's own compaction shows: Gemini CLI puts its snapshot after its environment turn.
OPENING_ITEMS = 3
#: A conversation of this many items at most is a side call (Claude Code's quota probe, a title request), not a
#: parent: a run whose first request was one is the run, not a sub-agent of its probe.
SIDE_CALL_ITEMS = 2


def opening(dialect: Dialect, parsed: ParsedRequest) -> str:
    """A digest of what a conversation opens with: its system prompt fields and its leading system items."""
    return _system_digest(b"ctxproxy-opening-v1\x00", dialect, parsed,
                          parsed.items[:leading_system_count(dialect, parsed.items)])


def conversation(dialect: Dialect, parsed: ParsedRequest) -> str:
    """What tells a session's conversations apart (``proxy.prefixes``): its system prompt fields, and whether the
    request offers tools. A side call has a system prompt of its own (opencode's title call, Claude Code's small
    calls) or offers no tools (those, and Gemini CLI's next-speaker check: the run's history and one question); a
    client that edits, rewinds or compacts its history keeps both. A system prompt carried as an item (Chat
    Completions) is left out: it is the conversation's first item, which the comparison covers, and a Chat side
    call is told by the tools it does not offer."""
    return _system_digest(b"ctxproxy-conversation-v1\x00", dialect, parsed, ()) + (TOOLS if parsed.tools else "")


def _system_digest(tag: bytes, dialect: Dialect, parsed: ParsedRequest, items: Sequence[Any]) -> str:
    digest = hashlib.blake2b(tag, digest_size=12)
    option = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
    try:
        digest.update(orjson.dumps([parsed.payload.get(name) for name in SYSTEM_FIELDS], option=option))
        for item in items:
            digest.update(orjson.dumps(dialect.identity(item), option=option))
    except orjson.JSONEncodeError:  # nested too deeply to write: such a prompt opens as nothing else does
        digest.update(b"\x00unwritable")
    return digest.hexdigest()


def separate(dialect: Dialect, sent: ParsedRequest, hashes: Sequence[str], state: ConversationState | None) -> bool:
    """Whether a request is another agent's conversation in a session with ``state``: ``sent`` as the client sent
    it (a Codex compaction item not yet expanded), ``hashes`` those of its conversation (expanded)."""
    if state is None or not state.openings or not hashes or "previous_response_id" in sent.payload:
        return False
    if state.longest <= SIDE_CALL_ITEMS:  # the log's conversations so far are side calls: no parent to keep
        return False
    if state.locate(hashes)[0] > 0 or opening(dialect, sent) in state.openings:
        return False
    return not restarts(dialect.name, sent.items)


def restarts(dialect: str, items: Sequence[Any]) -> bool:
    """Whether ``items`` continue a compaction the client made itself, which replaces its history's start."""
    if find_boundary(dialect, items) is not None or compaction_references(items):
        return True
    return dialect == "gemini" and any(GEMINI_SNAPSHOT in _texts(item) for item in items[:OPENING_ITEMS])


def _texts(item: Any) -> str:
    """The text parts of a Gemini content joined (anything else: nothing)."""
    parts = item.get("parts") if isinstance(item, dict) else None
    if not isinstance(parts, list):
        return ""
    return "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
