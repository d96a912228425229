"""HistoryManager: keeps the fact log in step with the conversations the client resends.

Chat Completions is stateless, so every request carries the whole history as
the client sees it. ``sync`` locates it in the session's tree of lineages
(``ConversationState``, a fold over the log's facts): what the log holds is
recognised, a move to another branch becomes one ``rewind`` fact, and only
what is new is appended. Work per request therefore grows with what is new,
plus one hash per message the client sent.

Writers. Within this process a session has one writer at a time (a lock per
session), so concurrent requests of one session (an agent fanning out
sub-tasks under one id) append one after the other, each planning on the state
the previous one left, and never conflict with each other. Between processes
and replicas the store arbitrates: an append is conditional on the log's
length, and the loser gets a ``ConflictError``, catches up
(``read(after=...)``), plans again and retries, with jittered backoff, until
``CONFLICT_DEADLINE``. That is the whole multi-replica protocol.

The store is the truth. A store that lost its last writes (a Redis failover, a
truncated AOF, a restored backup) is behind the cached state, or was written
again past the point it lost: an append names the last fact the state holds
(``tail``, its digest), catching up starts at that fact, and when the log no
longer holds it the state is reloaded from the log and the append planned
again at once, without backoff. The client resends its whole history, so what
was lost is logged again by that very append (the log heals itself).

Idempotence. A client's messages are recognised by their hash chain: an append
retried after a lost acknowledgement conflicts, catches up with its own facts
and plans nothing new. The proxy's own summaries and checkpoints get a key
(``codec.fact_key``: their content and the seq they were first planned at,
kept across the retries of one append), and the store skips a keyed fact it
already holds, so they too are written once.

When the store fails, the upstream's reply is the only message that exists
nowhere else: it is kept in memory (``proxy.context.log.pending``, bounded) and a
background task per session retries logging it, with backoff, for
``RETRY_FOR`` seconds; the client echoing it first settles it too. Each failed
retry is reported to ``on_error`` (the store-error counter). ``aclose`` cancels
the retries at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import compress, count
from operator import ne
from typing import Any

from proxy import offload
from proxy.context.log.lineage import ConversationState
from proxy.context.log.pending import PendingReplies, PendingReply, pending_replies
from proxy.context.log.planning import plan_pending, plan_sync
from proxy.errors import ConflictError, StoreError
from proxy.store.base import FactLog, FirstLook, NewFact, SessionKey, StoredFact
from proxy.store.codec import fact_key
from proxy.types import Message

logger = logging.getLogger(__name__)

#: How long an append keeps retrying when other processes keep writing the same session first.
CONFLICT_DEADLINE = 5.0
#: Cap of the jittered backoff between conflict retries.
CONFLICT_BACKOFF = 0.1
#: Background retry of pending replies: first delay, cap of the doubling delay, and how long to keep trying.
RETRY_FIRST = 0.25
RETRY_CAP = 5.0
RETRY_FOR = 600.0
#: Seconds a cached state serves a request's view without reading the log. Past that, the request first reads
#: what other processes appended meanwhile (an undo from the CLI, a checkpoint another replica made): one read of
#: the log's tail, only for a session this process has not read or written for a while, so an agent's
#: back-to-back steps pay nothing and a step after a model call (seconds) pays one round trip.
FRESH_FOR = 1.0
#: Facts per read while catching up with the log.
CATCH_UP_PAGE = 1000
#: Kinds of the proxy's own facts that are keyed, so that an append retried after a lost acknowledgement skips them.
KEYED_KINDS = frozenset({"summary", "checkpoint", "retire"})


@dataclass
class _Writer:
    """The lock that makes one request at a time append to a session in this process, and how many want it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class _Writing:
    """``async with``: the session's writer lock held (``HistoryManager._writer``). A class, not an async generator:
    every append enters it."""

    __slots__ = ("_key", "_writer", "_writers")

    _writer: _Writer

    def __init__(self, writers: dict[SessionKey, _Writer], key: SessionKey) -> None:
        self._writers, self._key = writers, key

    async def __aenter__(self) -> None:
        writer = self._writers.get(self._key)
        if writer is None:
            writer = self._writers[self._key] = _Writer()
        self._writer = writer
        writer.users += 1
        try:
            await self._writer.lock.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._writer.lock.release()
        self._leave()

    def _leave(self) -> None:
        self._writer.users -= 1
        if self._writer.users == 0:
            del self._writers[self._key]


#: A request under this many bytes is hashed whole every time rather than kept to compare the next one with: about
#: 20 µs more for it, against some 7 KB of parsed objects kept for each of thousands of short sessions (the memory
#: of a proxy serving them grew by a fifth over 2,000 sessions; ``bench/hotpath.py``, issue 21).
REUSE_FROM_BYTES = 16 * 1024


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
        on_error: Callable[[], None] | None = None,
        recent_bytes: int = 64 * 1024 * 1024,
        state_bytes: int = 256 * 1024 * 1024,
        pending_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.log = log
        #: The previous request of each conversation of a session, and its first message's hash (``hashes_for``).
        self._recent: OrderedDict[tuple[SessionKey, str, str], tuple[list[Message], list[str], int]] = OrderedDict()
        self._recent_size = 0
        self._recent_bytes = recent_bytes
        self._clock = clock
        self._on_append = on_append
        self._on_error = on_error
        self._states: OrderedDict[SessionKey, ConversationState] = OrderedDict()
        #: Each cached state's ``bytes`` when last remembered, and their sum.
        self._state_sizes: dict[SessionKey, int] = {}
        self._states_size = 0
        self._state_bytes = state_bytes
        self._max_sessions = max_sessions
        self._pending = PendingReplies(max_pending, pending_bytes)
        self._writers: dict[SessionKey, _Writer] = {}
        self._retries: dict[SessionKey, asyncio.Task[None]] = {}
        self._closed = False
        #: When (monotonic) this process last read or wrote each cached session's log; see ``current``.
        self._synced: dict[SessionKey, float] = {}
        self.fresh_for = FRESH_FOR

    async def state(self, key: SessionKey, *, refresh: bool = False) -> ConversationState:
        """The session's state, caught up with the log when ``refresh`` or not yet cached."""
        state = self._states.get(key)
        if state is None:
            state = self._furthest(key, await self._catch_up(key, ConversationState()))
            self._synced[key] = time.monotonic()
        elif refresh:
            state = await self._catch_up(key, state)
            self._synced[key] = time.monotonic()
        self._remember(key, state)
        return state

    async def current(self, key: SessionKey) -> ConversationState:
        """The session's state for a request's view: the cached one, caught up with the log first when this
        process has not read or written the session for ``fresh_for`` seconds (``FRESH_FOR``)."""
        synced = self._synced.get(key)
        stale = synced is None or time.monotonic() - synced >= self.fresh_for
        return await self.state(key, refresh=stale)

    async def first_look(self, key: SessionKey, opening: str = "") -> tuple[ConversationState, FirstLook]:
        """The state of a session not cached here, and what else ``FactLog.first_look`` read with its log (its link,
        the other tenants of its id; the own one noted with the conversation opening ``opening``): one store call
        unless the log is longer than a page. A session cached meanwhile (a concurrent first request) keeps
        whichever state is furthest along, as in ``state``."""
        looked = await self.log.first_look(key, CATCH_UP_PAGE, time.time(), opening)
        facts = looked.facts
        fresh = ConversationState()
        for fact in facts:
            fresh.apply(fact)
        if len(facts) == CATCH_UP_PAGE:
            fresh = await self._catch_up(key, fresh)
        state = self._furthest(key, fresh)
        self._synced[key] = time.monotonic()
        self._remember(key, state)
        return state, looked

    def _furthest(self, key: SessionKey, loaded: ConversationState) -> ConversationState:
        """Concurrent first requests of a session each load it: whichever state is furthest along."""
        state = self._states.get(key)
        return loaded if state is None or state.next_seq < loaded.next_seq else state

    def cached(self, key: SessionKey) -> ConversationState | None:
        return self._states.get(key)

    async def hashes_for(self, key: SessionKey, messages: list[Message], size: int,
                         hash_item: Callable[[Message], str], conversation: str = "") -> list[str]:
        """Message hashes, computed only for what differs from the session's previous request.

        An agent resends its whole history each step; comparing the parsed
        messages with the previous request's (a deep equality, mostly memcmp)
        costs a fraction of hashing them again. The previous requests are kept
        in an LRU bounded by their body sizes (``recent_bytes``); one under
        ``REUSE_FROM_BYTES`` is hashed whole instead, and not kept. A request of
        ``size`` bytes from ``offload.LARGE_BYTES`` compares and hashes in the
        worker pool; the LRU is only touched here, on the loop.

        Kept per conversation of the session (``conversation``: its system
        prompt and whether it offers tools, ``proxy.http.subagents``) and its
        first message: a side call between two steps of the run (a title
        call, a quota probe, a sub-agent under the run's session id) keeps the
        run's previous request, and the run's next request hashes only what
        is new (one after a side call hashed its whole history again, and
        every count that knows a message by its hash counted it again).
        """
        if size < REUSE_FROM_BYTES:
            hashes = [hash_item(m) for m in messages]
            self._remember_recent((key, conversation, hashes[0] if hashes else ""), None)
            return hashes
        slot = (key, conversation, hash_item(messages[0]) if messages else "")
        hashes = await offload.run(offload.is_large(size), reused_hashes, self._recent.get(slot), messages, hash_item)
        # Parsed messages cost more than their JSON: about 400 bytes of objects each, on top of the text.
        self._remember_recent(slot, (messages, hashes, size + 400 * len(messages)))
        return hashes

    def _remember_recent(self, slot: tuple[SessionKey, str, str],
                         entry: tuple[list[Message], list[str], int] | None) -> None:
        """Keep ``entry`` as the conversation's previous request (None: keep none), within ``recent_bytes``."""
        old = self._recent.pop(slot, None)
        dropped: list[tuple[list[Message], list[str], int]] = []
        if old is not None:
            self._recent_size -= old[2]
            dropped.append(old)
        if entry is not None:
            self._recent[slot] = entry
            self._recent_size += entry[2]
        while self._recent_size > self._recent_bytes and self._recent:
            dropped.append(self._recent.popitem(last=False)[1])
            self._recent_size -= dropped[-1][2]
        if dropped:  # freeing a long history's objects takes a while: not before this request goes upstream
            asyncio.get_running_loop().call_soon(dropped.clear)

    async def _catch_up(self, key: SessionKey, state: ConversationState) -> ConversationState:
        """``state`` with what the log holds beyond it folded in, or a new state when the log no longer continues it.

        The first read starts at the state's last fact, which the log must
        still hold, the same (same digest): otherwise the store lost its last
        writes, and the state is reloaded from the whole log. That fact is
        named before the read: an append of this process may fold more into
        ``state`` while the read is on its way (a request's view catching up,
        ``current``, beside another's append), which is no loss.
        """
        overlap = 1 if state.next_seq else 0
        while True:
            seen, tail = state.next_seq - 1, state.tail
            facts = await self.log.read(key, after=seen - overlap, limit=CATCH_UP_PAGE)
            if overlap:
                last = facts[0] if facts else None
                if last is None or last.seq != seen or (tail is not None and last.digest != tail):
                    return await self._reload(key, state)
                overlap = 0
            for fact in facts:
                state.apply(fact)
            if len(facts) < CATCH_UP_PAGE:
                return state

    async def _reload(self, key: SessionKey, stale: ConversationState) -> ConversationState:
        """The session's state read again from the log, which lost (or replaced) what ``stale`` holds."""
        logger.warning("the log of session %s no longer holds entry %d as this process saw it (the store lost its "
                       "last writes: a failover, a restored backup?): reading the session again from the log",
                       key.session, stale.next_seq - 1)
        fresh = await self._catch_up(key, ConversationState())
        if self._states.get(key) is stale:
            self._remember(key, fresh)
        return fresh

    @property
    def bytes(self) -> dict[str, int]:
        """What the per-session caches hold, estimated, by cache: the states (as of their last use), the
        previous requests kept for hash reuse, the replies waiting to be logged."""
        return {"states": self._states_size, "recent": self._recent_size, "pending": self._pending.bytes}

    def _remember(self, key: SessionKey, state: ConversationState) -> None:
        """Cache ``state`` as the newest; the oldest go past ``max_sessions`` or ``state_bytes`` (the newest stays,
        however large: reading a long log again on the session's next request costs more than holding it)."""
        self._states[key] = state
        self._states.move_to_end(key)
        size = state.bytes
        self._states_size += size - self._state_sizes.get(key, 0)
        self._state_sizes[key] = size
        while len(self._states) > 1 and (len(self._states) > self._max_sessions
                                         or self._states_size > self._state_bytes):
            dropped, _ = self._states.popitem(last=False)
            self._states_size -= self._state_sizes.pop(dropped)
            self._synced.pop(dropped, None)

    async def sync(
        self,
        key: SessionKey,
        messages: Sequence[Message],
        hashes: Sequence[str],
        *,
        upstream_from: int | None = None,
        extra_upstream: Mapping[str, Any] | None = None,
        extra_client: Mapping[str, Any] | None = None,
        extra_rewind: Mapping[str, Any] | None = None,
        after_response: str | None = None,
        extra_opening: Callable[[], Mapping[str, Any]] | None = None,
    ) -> ConversationState:
        """Make the log's head ``messages`` and return the state. With ``after_response``, ``messages`` follow that
        upstream reply (``previous_response_id``) and continue its lineage, when the log has it (else they are
        taken as a whole conversation). ``extra_opening()`` goes with a conversation's first message.

        Raises ``StoreError`` when the store fails; replies from the upstream in
        ``messages`` are then kept in memory and retried in the background.
        """
        digests = list(hashes)
        upstream_from = len(messages) if upstream_from is None else upstream_from
        extra = extra_upstream or {}
        client = extra_client or {}
        try:
            state, _ = await self._append(
                key, lambda state: plan_sync(state, messages, digests, upstream_from, self._pending.of(key), extra,
                                             client, extra_rewind,
                                             state.after_response(after_response) if after_response else None,
                                             extra_opening),
                new=lambda state: len(messages) - len(state.hashes), chunked=True)
        except StoreError:
            self._keep_pending(key, pending_replies(self._states.get(key), messages, digests, upstream_from, extra))
            raise
        if self._pending.of(key):
            self._pending.settle(key, digests)
        return state

    async def append_proxy_facts(self, key: SessionKey, facts: Sequence[NewFact]) -> ConversationState:
        """Append proxy-made facts (summary, checkpoint) at the end of the log, whatever came before."""
        state, _ = await self._append(key, lambda state: list(facts))
        return state

    async def append_proxy_fact(self, key: SessionKey, fact: NewFact) -> int:
        """Append one proxy-made fact at the end of the log; its seq (an earlier one if a lost reply hid it landing)."""
        _, stored = await self._append(key, lambda state: [fact])
        return stored[0].seq

    async def append_planned(self, key: SessionKey,
                             plan: Callable[[ConversationState], list[NewFact]]) -> ConversationState:
        """Append what ``plan`` makes of the session's state caught up with the log (nothing, if it plans nothing).

        For a fact that is only right against the log as it is: the append is
        conditional on the log's length, so ``plan`` always sees every fact
        before it, and runs again after another process wrote first.
        """
        state, _ = await self._append(key, plan)
        return state

    def _writer(self, key: SessionKey) -> _Writing:
        """The session's one writer in this process; the lock is dropped when nobody holds or awaits it."""
        return _Writing(self._writers, key)

    async def _append(self, key: SessionKey, plan: Callable[[ConversationState], list[NewFact]],
                      new: Callable[[ConversationState], int] | None = None, chunked: bool = False,
                      ) -> tuple[ConversationState, list[StoredFact]]:
        """Append what ``plan`` makes of the session's state, as the session's one writer in this process.

        A conflict means another process wrote first: catch up, plan again and
        retry, backing off with jitter from the second retry on, until
        ``CONFLICT_DEADLINE``; then the ``ConflictError`` goes to the caller. A
        log that no longer continues the state (it lost its last writes) makes
        catching up reload the state, and the plan is made again on it at once.
        Returns the state and the stored facts, one per planned fact (``FactLog.append``).

        A plan of ``offload.LARGE_ITEMS`` messages or more (``new`` tells how
        many the request holds beyond the state's lineage) is made in the worker
        pool; should a catch-up outside this lock fold facts meanwhile, the plan
        is made again, so a plan always matches the ``expected`` seq it is
        appended at. With ``chunked`` (a plan that, made again, plans only
        what the log still lacks) the facts go ``offload.APPEND_CHUNK`` at a
        time, each append its own transaction: the store, which all sessions
        share, is never held for a 300,000-message one, and the log holds a
        prefix of the conversation until the last chunk lands (a conflict
        between two chunks plans the rest again). Then only the last chunk's
        stored facts are returned.
        """
        async with self._writer(key):
            state = await self.state(key)
            anchor = state.next_seq  # where the facts were first planned: their keys stay the same across retries
            deadline = time.monotonic() + CONFLICT_DEADLINE
            retries = 0
            rest: list[NewFact] | None = None  # what a chunked plan has left to append, as it was planned
            while True:
                expected = state.next_seq
                if rest is None:
                    large = new is not None and new(state) >= offload.LARGE_ITEMS
                    planned = _keyed(await offload.run(large, plan, state), anchor)
                    if state.next_seq != expected:
                        continue  # folded into while planning off the loop: plan again on what the log holds now
                else:
                    planned, rest = rest, None
                if not planned:
                    return state, []
                facts = planned
                if chunked and len(planned) > offload.APPEND_CHUNK:
                    facts, rest = planned[:offload.APPEND_CHUNK], planned[offload.APPEND_CHUNK:]
                try:
                    stored = await self.log.append(key, expected, facts, self._clock(), tail=state.tail)
                except ConflictError:
                    rest = None  # another writer came between two chunks: the rest is planned again
                    if time.monotonic() >= deadline:
                        raise
                    caught_up = await self._catch_up(key, state)
                    if caught_up is not state:  # reloaded: nobody else won, the log lost what the state held
                        state = caught_up
                        continue
                    if retries:
                        await asyncio.sleep(random.uniform(0, min(CONFLICT_BACKOFF, 0.002 * 2**retries)))
                    retries += 1
                    continue
                await self._applied(state, stored, expected)
                self._synced[key] = time.monotonic()
                if rest is None:
                    if self._states.get(key) is state:
                        self._remember(key, state)  # its size grew by what was appended
                    return state, stored

    async def _applied(self, state: ConversationState, stored: Sequence[StoredFact], expected: int) -> None:
        """Fold what was appended, ``offload.FOLD_STEP`` facts per turn of the loop: a state is whole at every
        fact (one behind the log is what any reader may get), and 300,000 facts freeze no other session."""
        for i, fact in enumerate(stored, 1):
            state.apply(fact)  # a fact the log already held (seq below ``expected``) is already folded
            if i % offload.FOLD_STEP == 0:
                await asyncio.sleep(0)
        written = [fact for fact in stored if fact.seq >= expected]
        if self._on_append is not None and written:
            self._on_append(written)

    def _keep_pending(self, key: SessionKey, records: Sequence[PendingReply]) -> None:
        if not records:
            return
        self._pending.keep(key, records)
        logger.warning("store failed; keeping %d upstream repl(ies) of session %s in memory and retrying",
                       len(records), key.session)
        if key not in self._retries and not self._closed:
            self._retries[key] = asyncio.get_running_loop().create_task(self._retry_pending(key))

    async def _retry_pending(self, key: SessionKey) -> None:
        """Log the session's pending replies in the background, with doubling delays, for ``RETRY_FOR`` seconds."""
        delay, deadline = RETRY_FIRST, time.monotonic() + RETRY_FOR
        try:
            while self._pending.of(key):
                await asyncio.sleep(delay)
                try:
                    for record in list(self._pending.of(key).values()):
                        await self._append(key, partial(plan_pending, record=record))
                        self._pending.settle(key, [record.digest])
                except StoreError as exc:
                    if self._on_error is not None:
                        self._on_error()
                    if time.monotonic() >= deadline:
                        logger.warning("gave up retrying %d pending repl(ies) of session %s (%s); they stay in "
                                       "memory until the client resends them", len(self._pending.of(key)),
                                       key.session, exc)
                        return
                    delay = min(delay * 2, RETRY_CAP)
        finally:
            self._retries.pop(key, None)

    def retry_of(self, key: SessionKey) -> asyncio.Task[None] | None:
        """The background retry of the session's pending replies, while one runs."""
        return self._retries.get(key)

    async def aclose(self) -> None:
        """Cancel the background retries (at shutdown); replies still pending are reported and dropped."""
        self._closed = True
        tasks = list(self._retries.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._retries.clear()  # a task cancelled before it first ran never reached its own cleanup
        if len(self._pending):
            logger.warning("shutting down with %d upstream repl(ies) not logged", len(self._pending))


def reused_hashes(previous: tuple[list[Message], list[str], int] | None, messages: list[Message],
                  hash_item: Callable[[Message], str]) -> list[str]:
    """The hashes of ``messages``: ``previous``'s (a request's messages, hashes and size) for as long as its
    messages are equal, ``hash_item`` from the first that differs."""
    reused = 0
    hashes: list[str] = []
    if previous is not None:
        old_messages, old_hashes, _ = previous
        # The first unequal pair, found in C: the comparison itself is most of the cost, not a loop around it.
        reused = next(compress(count(), map(ne, messages, old_messages)), min(len(old_messages), len(messages)))
        hashes = old_hashes[:reused]
    hashes.extend(hash_item(m) for m in messages[reused:])
    return hashes


def _keyed(facts: list[NewFact], anchor: int) -> list[NewFact]:
    """``facts`` with a key on each of the proxy's summaries, checkpoints and retires: its content and planned seq."""
    return [replace(fact, key=fact_key(fact, anchor + i))
            if fact.source == "proxy" and fact.kind in KEYED_KINDS and fact.key is None else fact
            for i, fact in enumerate(facts)]
