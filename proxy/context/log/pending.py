"""Replies the client received that the log does not hold yet, kept until they are logged in their place.

When an append fails (the store is down, or other replicas kept winning until
the conflict deadline), the upstream's reply is the one message that exists
nowhere else. It is kept here, bounded, with what it takes to log it where it
belongs: the logged message its conversation continues from (``base``) and the
messages after it that the log did not have (the step's own client messages,
the reply last). Only those are kept, not the whole conversation.

Whichever comes first settles it: the client echoing it (the next request's
sync finds its hash here and logs it as the upstream's), or the background
retry of ``HistoryManager``, which logs it on its own branch and, if that
moved the head, rewinds back to where the client last was, so that the log
still replays to the conversation as the client last sent it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.context.log.lineage import ROOT, ConversationState
from proxy.store.base import SessionKey
from proxy.types import Message

#: A digest string and its tuple slot.
RECORD_HASH_BYTES = 90


@dataclass(frozen=True, slots=True)
class PendingReply:
    """One upstream message not yet logged, and the unlogged messages between its base and it."""

    #: Seq of the logged message the tail continues from (``ROOT``: the start).
    base: int
    #: Position of ``tail[0]`` in the conversation.
    index: int
    #: The unlogged messages, this reply last, and their hashes.
    tail: tuple[Message, ...]
    digests: tuple[str, ...]
    #: Position from which the conversation's messages came from the upstream in that request.
    upstream_from: int
    #: What the reply's entry carries (``usage``, ``view``, ``partial``).
    extra: Mapping[str, Any]

    @property
    def message(self) -> Message:
        return self.tail[-1]

    @property
    def digest(self) -> str:
        return self.digests[-1]


def pending_replies(state: ConversationState | None, messages: Sequence[Message], digests: Sequence[str],
                    upstream_from: int, extra: Mapping[str, Any]) -> list[PendingReply]:
    """A record for each upstream message of a sync that failed, based on what ``state`` knows is logged.

    ``state`` may be behind the log (or missing when the store never
    answered): the base is then earlier and the tail longer, never wrong,
    because a logged message stays logged.
    """
    known, base = state.locate(digests) if state is not None else (0, ROOT)
    return [PendingReply(base, known, tuple(messages[known:end + 1]), tuple(digests[known:end + 1]), upstream_from,
                         extra)
            for end in range(max(known, upstream_from), len(messages))]


def record_bytes(record: PendingReply) -> int:
    """What a record holds, about: its messages as JSON (kept only while the store fails, so measured exactly)."""
    return len(orjson.dumps(list(record.tail))) + len(record.digests) * RECORD_HASH_BYTES


class PendingReplies:
    """Pending replies per session, keyed by hash; at most ``max_sessions`` sessions and ``max_bytes`` of records,
    the oldest sessions dropped first (never the one just kept)."""

    def __init__(self, max_sessions: int, max_bytes: int = 64 * 1024 * 1024) -> None:
        self._sessions: OrderedDict[SessionKey, dict[str, PendingReply]] = OrderedDict()
        self._sizes: dict[tuple[SessionKey, str], int] = {}
        self._max_sessions = max_sessions
        self._max_bytes = max_bytes
        self.bytes = 0

    def of(self, key: SessionKey) -> Mapping[str, PendingReply]:
        return self._sessions.get(key, {})

    def keep(self, key: SessionKey, records: Iterable[PendingReply]) -> None:
        bucket = self._sessions.setdefault(key, {})
        for record in records:
            self._drop(key, bucket, record.digest)
            bucket[record.digest] = record
            self._sizes[(key, record.digest)] = size = record_bytes(record)
            self.bytes += size
        self._sessions.move_to_end(key)
        while len(self._sessions) > 1 and (len(self._sessions) > self._max_sessions or self.bytes > self._max_bytes):
            dropped, old = self._sessions.popitem(last=False)
            for digest in list(old):
                self._drop(dropped, old, digest)

    def _drop(self, key: SessionKey, bucket: dict[str, PendingReply], digest: str) -> None:
        if bucket.pop(digest, None) is not None:
            self.bytes -= self._sizes.pop((key, digest))

    def settle(self, key: SessionKey, digests: Iterable[str]) -> None:
        """Forget the replies among ``digests``: they are in the log now."""
        bucket = self._sessions.get(key)
        if not bucket:
            return
        for digest in digests:
            self._drop(key, bucket, digest)
        if not bucket:
            del self._sessions[key]

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._sessions.values())
