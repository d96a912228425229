"""The fact log interface: one append-only log per (tenant, session), plus the compaction lock and the links
that let a session outlive a credential.

A fact is immutable once appended. ``seq`` counts from 0 per session with no
gaps; appends are atomic and conditional on the writer's view of the log
(``expected_seq``, and optionally the digest of the fact the writer saw last,
``tail``), which is how two requests of one session on two replicas agree on
one lineage: the loser gets ``ConflictError``, catches up with ``read`` and
plans again. ``tail`` also catches a log that lost its last writes (a Redis
failover, a restored backup) and was written again to the length the writer
expected. Facts with a ``key`` are written once: an append skips a keyed fact
the log already holds, which makes a retry after a lost acknowledgement
harmless. Nothing here deletes or rewrites an entry.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

Kind = Literal["message", "rewind", "summary", "checkpoint", "retire"]
Source = Literal["client", "upstream", "proxy"]
#: Tenants ``FactLog.tenants_of`` keeps per session id, owners before probers, newest first: the candidates a new
#: credential may continue.
TENANTS_KEPT = 16
#: Openings ``Tenant.openings`` keeps per tenant of a session id: a side call's (a title, a quota probe), the run's,
#: the run's after the client compacted it itself, with room.
OPENINGS_KEPT = 4
#: The largest seq a log can hold: both stores keep it as a signed 64-bit integer (SQLite's INTEGER).
MAX_SEQ = 2**63 - 1
_MAX_SEQ_DIGITS = len(str(MAX_SEQ))


def as_seq(value: object) -> int | None:
    """``value`` as a seq a log can hold (an ``int``, not a bool, 0 to ``MAX_SEQ``), or None. Every number from
    outside (a URL, a tool call, a reference) goes through it where it is parsed, so none out of range reaches a
    store."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return value if 0 <= value <= MAX_SEQ else None


def parse_seq(text: str) -> int | None:
    """``as_seq`` of a decimal string of ASCII digits only: ``int()`` would take a sign, spaces, ``_`` and other
    scripts' digits, and refuse ``'²'`` or 4,301 digits with a ``ValueError``."""
    if not (text.isascii() and text.isdigit()) or len(text) > _MAX_SEQ_DIGITS:
        return None
    return as_seq(int(text))


class SessionKey(NamedTuple):
    tenant: str
    session: str


@dataclass(frozen=True, slots=True)
class NewFact:
    """A fact about to be appended; the store assigns ``id``, ``seq`` and ``ts``."""

    kind: Kind
    index: int | None
    source: Source
    message: Mapping[str, Any] | None = None
    hash: str | None = None
    #: Kind-specific fields (``partial``, ``usage``, ``checkpoint``…), stored beside the core ones.
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: Names the fact for idempotence: an append skips a fact whose key the log already holds (proxy-made facts,
    #: keyed by ``HistoryManager``; a client's messages are recognised by their hash chain instead).
    key: str | None = None


@dataclass(frozen=True, slots=True)
class StoredFact:
    id: str
    seq: int
    kind: Kind
    index: int | None
    source: Source
    message: Mapping[str, Any] | None
    ts: float
    hash: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    key: str | None = None
    #: SHA-1 of the stored bytes (``codec.digest``): names this very entry, so a writer can tell the log it
    #: planned on from one that lost its tail and was written again (``FactLog.append``'s ``tail``).
    digest: str | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The entry as the contract prints it (log endpoint, ``ctxproxy sessions log --json``)."""
        out: dict[str, Any] = dict(self.extra)
        out.update(
            id=self.id, seq=self.seq, kind=self.kind, index=self.index, source=self.source,
            message=self.message, ts=self.ts, hash=self.hash,
        )
        if self.key is not None:
            out["key"] = self.key
        return out


@dataclass(frozen=True, slots=True)
class SessionInfo:
    tenant: str
    session: str
    messages: int
    checkpoints: int
    updated_at: float
    #: Entries in the log (its next seq): lets a reader fetch the tail without reading the whole log.
    entries: int = 0


class Link(NamedTuple):
    """A credential's link to the session of another tenant it continues, scoped to what proved it: the link
    serves only a conversation whose first ``proved`` items chain to ``prefix`` (``proxy.http.continuity``). A
    link stored before links had a scope reads as ``proved`` 0 and ``prefix`` '': it serves nothing."""

    tenant: str
    proved: int
    prefix: str


class Tenant(NamedTuple):
    """A tenant noted for a session id (``FactLog.note_tenant``)."""

    name: str
    #: Chain hashes of the openings of the tenant's conversations under the id, newest first, at most
    #: ``OPENINGS_KEPT``: what a request must start with before its proof of that tenant's session is worth
    #: reading the session for.
    openings: tuple[str, ...]


class FirstLook(NamedTuple):
    """What a request needs of a session this process has not seen yet to tell whose it is (``FactLog.first_look``)."""

    #: The log's first entries (``read(key, limit=limit)``).
    facts: list[StoredFact]
    #: The key's link (``link_of``), or None.
    link: Link | None
    #: The tenants other than the key's own noted for its session id (``tenants_of``). The own one was noted in
    #: the same step (``note_tenant``): as an owner when there were none, else as a prober.
    others: list[Tenant]


class FactLog(abc.ABC):
    """Per-session append-only log. Implementations: ``SqliteFactLog``, ``RedisFactLog``."""

    @abc.abstractmethod
    async def append(
        self, key: SessionKey, expected_seq: int, facts: Sequence[NewFact], ts: float, *, tail: str | None = None
    ) -> list[StoredFact]:
        """Append ``facts`` as seq ``expected_seq``, ``expected_seq + 1``… all or nothing.

        A fact whose ``key`` the log already holds is not written again: its
        place in the result is the entry already logged (seq below
        ``expected_seq``), and the facts written take the seqs from
        ``expected_seq`` on. So the result holds one fact per fact given, in order.

        Raises ``ConflictError`` (with the log's real next seq) when the log does
        not end at ``expected_seq - 1``, or, when ``tail`` is given, when its
        last entry's ``digest`` is not ``tail``; ``StoreUnavailable`` when the
        backend fails, in which case the append may or may not have happened (a
        later conflict tells).
        """

    @abc.abstractmethod
    async def read(self, key: SessionKey, after: int = -1, limit: int | None = None) -> list[StoredFact]:
        """Facts with ``seq > after``, oldest first, at most ``limit``. An unknown session reads as empty."""

    @abc.abstractmethod
    async def first_look(self, key: SessionKey, limit: int, ts: float, opening: str = "") -> FirstLook:
        """The session's first ``limit`` facts, its link and the other tenants of its session id, noting the own
        one (seen at ``ts``, its conversation opening ``opening``): as an owner when there are no others, else as a
        prober. One store call where a request on a session new here would otherwise make four (read, ask for the
        link, ask who else holds the id, note itself), whether or not the id is held elsewhere."""

    @abc.abstractmethod
    def sessions(self) -> AsyncIterator[SessionInfo]:
        """Every session in the store, in no particular order."""

    @abc.abstractmethod
    async def try_lock(self, key: SessionKey, name: str, token: str, ttl: float) -> bool:
        """Take the named lock of a session for ``ttl`` seconds unless someone else holds it."""

    @abc.abstractmethod
    async def unlock(self, key: SessionKey, name: str, token: str) -> None:
        """Release the lock if ``token`` still holds it; a lock that expired and was retaken is left alone."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Return when the backend answers; raise ``StoreUnavailable`` otherwise."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release connections and threads."""

    @abc.abstractmethod
    async def secret(self) -> bytes:
        """The server secret that signs references (``proxy.secret``): random, made by the first call on a new
        store, the same for every later call, process and replica. Concurrent first calls agree: creating it is
        one atomic get-or-create. ``StoreUnavailable`` when the backend fails."""

    @abc.abstractmethod
    async def signin_epoch(self) -> int:
        """The inspector's sign-in epoch (``proxy.ui.cookie``): 0 on a new store; only ``end_signins`` moves it."""

    @abc.abstractmethod
    async def end_signins(self) -> int:
        """Move the sign-in epoch on by one, atomically (revoking every cookie issued before), and return it."""

    @abc.abstractmethod
    async def note_tenant(self, session: str, tenant: str, ts: float, opening: str = "", *,
                          owner: bool = True) -> None:
        """Record that ``tenant`` holds a session ``session`` (seen at ``ts``; a later call moves it up), and that
        one of its conversations opens with ``opening`` (the newest ``OPENINGS_KEPT`` are kept). An owner (the
        first tenant of the id) ranks above every prober (a tenant that came when others held the id), and a later
        call never demotes it: so probes under fresh keys never push an owner out of the ``TENANTS_KEPT`` kept."""

    @abc.abstractmethod
    async def tenants_of(self, session: str) -> list[Tenant]:
        """The tenants noted for ``session``, owners first, each rank newest first, at most ``TENANTS_KEPT``."""

    @abc.abstractmethod
    async def link(self, key: SessionKey, link: Link, ts: float) -> Link:
        """Link ``key`` (a credential's tenant and a session id) to ``link.tenant``'s session of that id, unless it
        is linked already: a link is made once and never changed (but a void one, from before links had a scope,
        is replaced). Returns the link ``key`` has."""

    @abc.abstractmethod
    async def link_of(self, key: SessionKey) -> Link | None:
        """The link of ``key``, or None."""
