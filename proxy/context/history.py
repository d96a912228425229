"""HistoryManager: keeps the fact log in step with the conversation the client resends.

Chat Completions is stateless, so every request carries the whole history as
the client sees it. ``sync`` compares it, hash by hash, with the lineage the log
already holds (``ConversationState``, a fold over the log's facts): the common
prefix is recognised, a divergence becomes a ``rewind`` fact, and only what is
new is appended. Work per request therefore grows with what is new, plus one
hash per message the client sent.

The state is cached per session in this process and caught up from the log
(``read(after=...)``) whenever an append meets a ``ConflictError``: another
request or replica wrote first. That is the whole multi-replica protocol.

When the store fails, the upstream's reply is the only message that exists
nowhere else; it is kept in memory (bounded) and logged, with its upstream
source, when the client echoes it back on the next request.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.context.messages import chain_hash, message_hash
from proxy.errors import ConflictError, StoreError
from proxy.store.base import FactLog, NewFact, SessionKey, Source, StoredFact
from proxy.types import Message

logger = logging.getLogger(__name__)

MAX_CONFLICT_RETRIES = 8


@dataclass
class ConversationState:
    """The current lineage of one session, derived from its facts; never stored on its own."""

    next_seq: int = 0
    hashes: list[str] = field(default_factory=list)
    #: ``prefixes[i]`` is the chain hash of ``hashes[: i + 1]``.
    prefixes: list[str] = field(default_factory=list)
    #: Seq of the fact that logged each message of the lineage (names log entries in views).
    seqs: list[int] = field(default_factory=list)
    #: Checkpoints still valid for the lineage, oldest first (raw ``checkpoint`` payloads).
    checkpoints: list[Mapping[str, Any]] = field(default_factory=list)
    #: The last upstream ``usage`` seen, the view it measured (key, length, last hash) and its lineage index.
    last_usage: Mapping[str, Any] | None = None
    last_view: Mapping[str, Any] | None = None
    last_usage_len: int = 0

    def apply(self, fact: StoredFact) -> None:
        """Fold one fact into the state. Facts must arrive in seq order."""
        self.next_seq = fact.seq + 1
        if fact.kind == "message" and fact.hash is not None:
            self._push(fact.hash, fact.seq)
            usage = fact.extra.get("usage")
            if fact.source == "upstream" and isinstance(usage, Mapping):
                view = fact.extra.get("view")
                self.last_usage, self.last_view = usage, view if isinstance(view, Mapping) else None
                self.last_usage_len = len(self.hashes) - 1
        elif fact.kind == "rewind" and fact.index is not None:
            self.truncate(fact.index)
        elif fact.kind == "checkpoint":
            payload = fact.extra.get("checkpoint")
            if isinstance(payload, Mapping):
                self.checkpoints.append(payload)

    def _push(self, digest: str, seq: int) -> None:
        self.prefixes.append(chain_hash(self.prefixes[-1] if self.prefixes else "", digest))
        self.hashes.append(digest)
        self.seqs.append(seq)

    def truncate(self, length: int) -> None:
        """Cut the lineage to ``length`` messages; checkpoints covering a cut prefix retire."""
        del self.hashes[length:], self.prefixes[length:], self.seqs[length:]
        self.checkpoints = [c for c in self.checkpoints if int(c.get("retain_start_idx", 0)) <= length]
        if self.last_usage_len >= length:
            self.last_usage, self.last_view, self.last_usage_len = None, None, 0

    @property
    def checkpoint(self) -> Mapping[str, Any] | None:
        """The newest checkpoint whose covered prefix is still the lineage's."""
        return self.checkpoint_for(self.hashes)

    def checkpoint_for(self, hashes: Sequence[str]) -> Mapping[str, Any] | None:
        """The newest checkpoint whose covered prefix is both the lineage's and ``hashes``'s.

        Lets a request use the session's checkpoint before its own new messages
        are logged: only the prefix the checkpoint covers has to agree.
        """
        shared = common_prefix(self.hashes, hashes) if hashes is not self.hashes else len(hashes)
        for payload in reversed(self.checkpoints):
            idx = int(payload.get("retain_start_idx", 0))
            if idx == 0 or (idx <= shared and self.prefixes[idx - 1] == payload.get("prefix_hash")):
                return dict(payload)
        return None


def common_prefix(known: Sequence[str], incoming: Sequence[str]) -> int:
    """Length of the longest common prefix of two hash lists."""
    n = min(len(known), len(incoming))
    if known[:n] == incoming[:n]:
        return n
    lo, hi = 0, n  # binary search: a prefix of equal lists is equal
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if known[:mid] == incoming[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_sync(
    state: ConversationState,
    messages: Sequence[Message],
    hashes: Sequence[str],
    upstream_from: int,
    pending: Mapping[str, Message],
    extra_upstream: Mapping[str, Any],
) -> list[NewFact]:
    """The facts that make the log's lineage equal ``messages``: maybe a rewind, then what is new.

    Messages at ``upstream_from`` and beyond came from the upstream in this request;
    a new client message whose hash matches a reply kept in ``pending`` is logged
    as that reply, with its upstream source.
    """
    keep = common_prefix(state.hashes, hashes)
    facts: list[NewFact] = []
    if keep < len(state.hashes):
        facts.append(NewFact(kind="rewind", index=keep, source="client"))
    for i in range(keep, len(messages)):
        digest = hashes[i]
        source: Source = "client"
        message = messages[i]
        extra: Mapping[str, Any] = {}
        if i >= upstream_from:
            source, extra = "upstream", extra_upstream
        elif digest in pending:
            source, message = "upstream", pending[digest]
        facts.append(NewFact(kind="message", index=i, source=source, message=message, hash=digest, extra=extra))
    return facts


class HistoryManager:
    """Syncs conversations into the fact log; one per process, shared by all sessions."""

    def __init__(
        self,
        log: FactLog,
        *,
        clock: Callable[[], float],
        max_sessions: int = 10_000,
        max_pending: int = 1_000,
        on_append: Callable[[Sequence[StoredFact]], None] | None = None,
        recent_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.log = log
        self._recent: OrderedDict[SessionKey, tuple[list[Message], list[str], int]] = OrderedDict()
        self._recent_size = 0
        self._recent_bytes = recent_bytes
        self._clock = clock
        self._on_append = on_append
        self._states: OrderedDict[SessionKey, ConversationState] = OrderedDict()
        self._pending: OrderedDict[SessionKey, dict[str, Message]] = OrderedDict()
        self._max_sessions = max_sessions
        self._max_pending = max_pending

    async def state(self, key: SessionKey, *, refresh: bool = False) -> ConversationState:
        """The session's state, caught up with the log when ``refresh`` or not yet cached."""
        state = self._states.get(key)
        if state is None:
            state = ConversationState()
            refresh = True
        if refresh:
            await self._catch_up(key, state)
        self._remember(key, state)
        return state

    def cached(self, key: SessionKey) -> ConversationState | None:
        return self._states.get(key)

    def hashes_for(self, key: SessionKey, messages: list[Message], size: int) -> list[str]:
        """Message hashes, computed only for what differs from the session's previous request.

        An agent resends its whole history each step; comparing the parsed
        messages with the previous request's (a deep equality, mostly memcmp)
        costs a fraction of hashing them again. The previous requests are kept
        in an LRU bounded by their body sizes (``recent_bytes``).
        """
        previous = self._recent.get(key)
        reused = 0
        if previous is not None:
            old_messages, old_hashes, _ = previous
            limit = min(len(old_messages), len(messages))
            while reused < limit and messages[reused] == old_messages[reused]:
                reused += 1
            hashes = old_hashes[:reused]
        else:
            hashes = []
        hashes.extend(message_hash(m) for m in messages[reused:])
        # Parsed messages cost more than their JSON: about 400 bytes of objects each, on top of the text.
        self._remember_recent(key, (messages, hashes, size + 400 * len(messages)))
        return hashes

    def _remember_recent(self, key: SessionKey, entry: tuple[list[Message], list[str], int]) -> None:
        old = self._recent.pop(key, None)
        if old is not None:
            self._recent_size -= old[2]
        self._recent[key] = entry
        self._recent_size += entry[2]
        while self._recent_size > self._recent_bytes and self._recent:
            _, dropped = self._recent.popitem(last=False)
            self._recent_size -= dropped[2]

    async def _catch_up(self, key: SessionKey, state: ConversationState) -> None:
        while True:
            facts = await self.log.read(key, after=state.next_seq - 1, limit=1000)
            for fact in facts:
                state.apply(fact)
            if len(facts) < 1000:
                return

    def _remember(self, key: SessionKey, state: ConversationState) -> None:
        self._states[key] = state
        self._states.move_to_end(key)
        while len(self._states) > self._max_sessions:
            self._states.popitem(last=False)

    async def sync(
        self,
        key: SessionKey,
        messages: Sequence[Message],
        hashes: Sequence[str] | None = None,
        *,
        upstream_from: int | None = None,
        extra_upstream: Mapping[str, Any] | None = None,
    ) -> ConversationState:
        """Make the log's lineage equal ``messages`` and return the state.

        Raises ``StoreError`` when the store fails; replies from the upstream in
        ``messages`` are then kept in memory for the next request to log.
        """
        digests = list(hashes) if hashes is not None else [message_hash(m) for m in messages]
        upstream_from = len(messages) if upstream_from is None else upstream_from
        pending = self._pending.get(key, {})
        try:
            state = await self._append(
                key, lambda state: plan_sync(state, messages, digests, upstream_from, pending, extra_upstream or {})
            )
        except StoreError:
            self._keep_pending(key, messages[upstream_from:], digests[upstream_from:])
            raise
        self._settle_pending(key, digests)
        return state

    async def append_proxy_facts(self, key: SessionKey, facts: Sequence[NewFact]) -> ConversationState:
        """Append proxy-made facts (summary, checkpoint) at the end of the log, whatever came before."""
        return await self._append(key, lambda state: list(facts))

    async def _append(self, key: SessionKey, plan: Callable[[ConversationState], list[NewFact]]) -> ConversationState:
        """Append what ``plan`` makes of the session's state; on a conflict, catch up and plan again."""
        state = await self.state(key)
        for _ in range(MAX_CONFLICT_RETRIES):
            facts = plan(state)
            if not facts:
                return state
            try:
                stored = await self.log.append(key, state.next_seq, facts, self._clock())
            except ConflictError:
                await self._catch_up(key, state)
                continue
            self._applied(state, stored)
            return state
        raise ConflictError("too many concurrent writers for one session", actual_seq=state.next_seq)

    def _applied(self, state: ConversationState, stored: Sequence[StoredFact]) -> None:
        for fact in stored:
            state.apply(fact)
        if self._on_append is not None:
            self._on_append(stored)

    def _keep_pending(self, key: SessionKey, replies: Sequence[Message], digests: Sequence[str]) -> None:
        if not replies:
            return
        bucket = self._pending.setdefault(key, {})
        bucket.update(zip(digests, replies, strict=True))
        self._pending.move_to_end(key)
        while len(self._pending) > self._max_pending:
            self._pending.popitem(last=False)
        logger.warning("store failed; keeping %d upstream repl(ies) in memory for the next request", len(replies))

    def _settle_pending(self, key: SessionKey, digests: Sequence[str]) -> None:
        bucket = self._pending.get(key)
        if not bucket:
            return
        logged = set(digests)
        for digest in [d for d in bucket if d in logged]:
            del bucket[digest]
        if not bucket:
            del self._pending[key]

    @property
    def pending_count(self) -> int:
        return sum(len(b) for b in self._pending.values())
