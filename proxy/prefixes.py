"""Who broke the prompt cache: each request's view compared with the session's previous one, the change named by
its cause.

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

The comparison is in memory, per process, for the sessions seen lately (``MAX_SESSIONS``): after a restart, or on
another worker, a session's first request has nothing to compare with and counts as unchanged. What it finds goes
into the reply's log entry (``prefix``), which ``proxy.savings`` folds.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class _Seen:
    view: tuple[str, ...]
    #: How many items the client sent, and a digest of them all: enough to tell whether the next request extends
    #: them, without keeping every digest of a long history.
    client: int
    client_digest: bytes
    checkpoint: Checkpoint | None
    at: float
    #: The session's largest prompt so far (``grow``).
    peak: int = 0


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
    """The last view of each recent session. ``clock``: seconds (tests inject one); ``ttl``: the cache's life."""

    def __init__(self, clock: Callable[[], float] = time.time, ttl: float = DEFAULT_CACHE_TTL,
                 size: int = MAX_SESSIONS) -> None:
        self.clock, self.ttl, self.size = clock, ttl, size
        self._seen: OrderedDict[SessionKey, _Seen] = OrderedDict()

    def compare(self, key: SessionKey, view: Sequence[str], client: Sequence[str],
                checkpoint: Checkpoint | None) -> PrefixChange:
        """``view``: the digests of the items sent; ``client``: of the items the client sent; ``checkpoint``: the
        checkpoint the view stands on. Remembers this request as the session's last."""
        now = self.clock()
        last = self._seen.pop(key, None)
        self._seen[key] = _Seen(tuple(view), len(client), joined(client), checkpoint, now,
                                last.peak if last is not None else 0)
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)
        if last is None:
            return PrefixChange(False, None, 0)
        kept, added = shared(last.view, view), last.client
        if now - last.at > self.ttl:
            return PrefixChange(True, "ttl", 0, added)
        if kept == len(last.view):
            return PrefixChange(False, None, kept, added)
        if len(client) < last.client or joined(client[:last.client]) != last.client_digest:
            return PrefixChange(True, "client", kept, len(client))
        return PrefixChange(True, checkpoint_cause(checkpoint, last.checkpoint), kept, added)

    def grow(self, key: SessionKey, prompt: int) -> int:
        """By how much ``prompt`` tokens raise the session's peak (0: not past it): what ``/metrics`` sums so that
        cache writes over it are the re-write factor of the sessions it served."""
        seen = self._seen.get(key)
        if seen is None or prompt <= seen.peak:
            return 0
        self._seen[key] = replace(seen, peak=prompt)
        return prompt - seen.peak


def checkpoint_cause(checkpoint: Checkpoint | None, previous: Checkpoint | None) -> Cause:
    """``masking`` for the same checkpoint (the view was clipped or no longer is) or one a masking batch made from
    the previous; ``compaction`` for any other (a summary, the model-free tier, an undone compaction)."""
    key = checkpoint.view_key if checkpoint is not None else ""
    if key == (previous.view_key if previous is not None else ""):
        return "masking"
    if checkpoint is not None and derived_tier(checkpoint, previous) == "mask":
        return "masking"
    return "compaction"


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
