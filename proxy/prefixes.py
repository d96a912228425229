"""Who broke the prompt cache: each request's view compared with the previous request of the same conversation,
the change named by its cause.

A provider's prompt cache holds the longest prefix a request shares with what it read before, for a while (the
TTL: Anthropic's is 5 minutes by default). Each request whose view does not extend the previous view item for item
changed the prefix, and everything past the shared part is written to the cache again. ``PrefixTracker.compare``
names why, in this order:

- ``ttl``: the previous request is older than the cache's TTL, so the prefix was cold whatever the view holds: not
  the proxy's doing;
- ``client``: the client's own items no longer extend what it sent before (it edited or rewound its history);
- ``compaction``: the view stands on another checkpoint than before, one that summarises (a summary, or the
  model-free tier);
- ``masking``: anything else the proxy changed in the view (a masking batch's checkpoint, a tool result clipped
  or no longer clipped).

"Previous" is the previous request of the same conversation, not of the session: a client sends side calls under
its session id between two requests of its run (opencode's title call, Claude Code's small calls, Gemini CLI's
next-speaker check), and compared with those, the run's next request would look like the client's own edit, and a
change the proxy made to it would be filed as the client's. A conversation is told by its system prompt and
whether it offers tools (``conversation``, ``proxy.http.subagents.conversation``): a side call has its own system
prompt or offers no tools, while a client that edits or rewinds its history, or compacts it itself, keeps both.
The session's lineage would not tell them apart: a side call branching off the run and a rewind of the run are
both branches of the log's tree. A side call on the run's history (Gemini CLI's next-speaker check: the
run's items and a question) does not extend the previous one, which asked about an older history; it extends the
run's last request instead, and is no change of anyone's (the run's next request counts what the proxy changed).

The comparison is in memory, per process, for the sessions seen lately (``MAX_SESSIONS``) and, in each, the
conversations seen last (``CONVERSATIONS``: the run and the few side calls a client interleaves with it; a session
that opens a new conversation at every request cannot grow the tracker). After a restart, on another worker, or for
a conversation pushed out by newer ones, a first request has nothing to compare with and counts as unchanged. What
it finds goes into the reply's log entry (``prefix``), which ``proxy.savings`` folds. The tracker also keeps each
session's peak context (``grow``), the denominator of the re-write factor in ``/metrics``.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.context.checkpoint import Checkpoint
from proxy.context.log.tiers import derived_tier
from proxy.context.view.pace import DEFAULT_CACHE_TTL
from proxy.store.base import SessionKey

Cause = Literal["compaction", "masking", "client", "ttl"]
CAUSES: tuple[Cause, ...] = ("compaction", "masking", "client", "ttl")
#: The causes that are the proxy's doing: their cache writes are a cost of compacting (``proxy.savings``).
PROXY_CAUSES = frozenset({"compaction", "masking"})
MAX_SESSIONS = 10_000
#: Conversations remembered per session, the newest: the run and the side calls a client sends between two of its
#: requests (opencode's title call, Claude Code's two or three small calls, Gemini CLI's next-speaker check).
CONVERSATIONS = 4


@dataclass(frozen=True)
class _Seen:
    view: tuple[str, ...]
    #: How many items the client sent, and a digest of them all: enough to tell whether the next request extends
    #: them, without keeping every digest of a long history.
    client: int
    client_digest: bytes
    checkpoint: Checkpoint | None
    at: float


@dataclass
class _Session:
    #: The last request of each conversation, by its key, the least recently seen first.
    conversations: OrderedDict[str, _Seen] = field(default_factory=OrderedDict)
    #: The session's peak context, and the ratio its requests are scaled by (``grow``).
    peak: int = 0
    ratio: float | None = None


@dataclass(frozen=True)
class PrefixChange:
    """One request's prefix against the previous: ``kept`` items (``kept_tokens`` tokens) shared with it; the
    client's items from ``added`` on are new since (the previous reply and the client's new messages: what an
    unchanged prompt would have written to the cache too)."""

    changed: bool
    cause: Cause | None
    kept: int
    added: int = 0

    def entry(self, kept_tokens: int, added_tokens: int) -> dict[str, Any]:
        """The reply entry's ``prefix`` field."""
        return {"changed": self.changed, "cause": self.cause, "kept_tokens": kept_tokens,
                "added_tokens": added_tokens}


class PrefixTracker:
    """The last view of each recent conversation of each recent session. ``clock``: seconds (tests inject one);
    ``ttl``: the cache's life."""

    def __init__(self, clock: Callable[[], float] = time.time, ttl: float = DEFAULT_CACHE_TTL,
                 size: int = MAX_SESSIONS) -> None:
        self.clock, self.ttl, self.size = clock, ttl, size
        self._sessions: OrderedDict[SessionKey, _Session] = OrderedDict()

    def compare(self, key: SessionKey, conversation: str, view: Sequence[str], client: Sequence[str],
                checkpoint: Checkpoint | None) -> PrefixChange:
        """``conversation``: the key of the request's conversation in the session; ``view``:
        the digests of the items sent; ``client``: of the items the client sent; ``checkpoint``: the checkpoint the
        view stands on. Remembers this request as its conversation's last."""
        now = self.clock()
        session = self._sessions.pop(key, None) or _Session()
        self._sessions[key] = session
        while len(self._sessions) > self.size:
            self._sessions.popitem(last=False)
        last = session.conversations.pop(conversation, None)
        session.conversations[conversation] = _Seen(tuple(view), len(client), joined(client), checkpoint, now)
        while len(session.conversations) > CONVERSATIONS:
            session.conversations.popitem(last=False)
        if last is None:  # a conversation's first request: nothing of it is known to be cached
            return PrefixChange(False, None, 0)
        kept, added = shared(last.view, view), last.client
        if now - last.at > self.ttl:
            return PrefixChange(True, "ttl", 0, added)
        if kept == len(last.view):
            return PrefixChange(False, None, kept, added)
        if not extends(client, last):
            for name, other in session.conversations.items():
                if name != conversation and extends(client, other):  # a side call on another's history, asked again
                    return PrefixChange(False, None, shared(other.view, view), other.client)
            return PrefixChange(True, "client", kept, len(client))
        return PrefixChange(True, checkpoint_cause(checkpoint, last.checkpoint), kept, added)

    def ratio(self, key: SessionKey) -> float | None:
        """The session's ``proxy.savings.CacheFigures.ratio`` so far."""
        session = self._sessions.get(key)
        return session.ratio if session is not None else None

    def grow(self, key: SessionKey, context: int, ratio: float | None) -> int:
        """By how much ``context`` tokens (the client's request) raise the session's peak (0: not past it): what
        ``/metrics`` sums, so that cache writes over it are the re-write factor of the sessions it served. Keeps
        ``ratio`` for the session's next request."""
        session = self._sessions.get(key)
        if session is None:
            return 0
        session.ratio = ratio
        if context <= session.peak:
            return 0
        growth, session.peak = context - session.peak, context
        return growth


def checkpoint_cause(checkpoint: Checkpoint | None, previous: Checkpoint | None) -> Cause:
    """``masking`` for the same checkpoint (the view was clipped or no longer is) or one a masking batch made from
    the previous; ``compaction`` for any other (a summary, the model-free tier, an undone compaction)."""
    key = checkpoint.view_key if checkpoint is not None else ""
    if key == (previous.view_key if previous is not None else ""):
        return "masking"
    if checkpoint is not None and derived_tier(checkpoint, previous) == "mask":
        return "masking"
    return "compaction"


def extends(client: Sequence[str], seen: _Seen) -> bool:
    """Whether the client's items ``client`` begin with all those of request ``seen``."""
    return len(client) >= seen.client and joined(client[:seen.client]) == seen.client_digest


def joined(digests: Sequence[str]) -> bytes:
    """One digest of a run of item digests (they are hex or base64: a NUL parts them unambiguously)."""
    return hashlib.blake2b("\0".join(digests).encode(), digest_size=16).digest()


def shared(old: Sequence[object], new: Sequence[object]) -> int:
    """How many leading items (digests) ``old`` and ``new`` share (one comparison in C when one extends the other, the
    usual case: a request that changed nothing adds to the end)."""
    length = min(len(old), len(new))
    if tuple(old[:length]) == tuple(new[:length]):
        return length
    for index, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            return index
    return min(len(old), len(new))
