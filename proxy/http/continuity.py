"""Sessions that outlive a credential: which tenant's session a request is, when its credential changed mid-run.

A request's own key is its credential's tenant and its session id (``proxy.sessions``). Claude Code and Codex on
a subscription refresh their OAuth access token during a run, and the run must not land in an empty session of
a new tenant. So a request whose own session does not already hold its conversation is checked against the
sessions of that id under other tenants (``FactLog.tenants_of``: owners before probers, each noted with its
conversations' openings), and continues one that it proves (``proxy.context.log.continuity``: its items are that
session's conversation as far as the log goes). Its key is then linked to that session (``FactLog.link``, set
once) for conversations that extend what proved it: the link keeps the proved items' count and chain hash, and a
later request under the key goes to the linked session only while it holds them. A request that carries a
reference the proxy handed out (``proxy.secret``) continues the session it names, that one request, as far as
the reference: the summary it stands for is the request's own (a bearer token), and nothing after it. A request
that proves nothing gets its own session, as before: knowing a session id gives nothing of the session.

``Resolved.proved`` says how far a request that continues another tenant's session proved it: the view builder
may give it of entries made under another credential only what lies within its first ``proved`` items.

Before another tenant's session is read for a proof, the request's opening must be one noted for that tenant
(each tenant's conversations under the id note theirs: a side call's, the run's): a comparison in memory, after
the one store call (``FactLog.first_look``) that a request on an absent id makes too, so a new key's first
request costs the same whether or not the id is held elsewhere.

Links found are kept in memory (``Links``); a store failure here only costs the continuation (the request
goes on under its own key, as with the store down), never the request.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import orjson
from aiohttp import web

from proxy.context.items import Item
from proxy.context.log.continuity import holds, opening, proof, scope, serves
from proxy.dialects.base import Dialect, ParsedRequest
from proxy.errors import StoreError
from proxy.http import clientcompaction
from proxy.keys import engine_key, history_key, links_key, metrics_key, store_key
from proxy.secret import Reference
from proxy.store.base import FirstLook, Link, SessionKey, Tenant

logger = logging.getLogger(__name__)


class Resolved(NamedTuple):
    """The session a request is, the request with its references expanded, and its items' hashes."""

    key: SessionKey
    parsed: ParsedRequest
    hashes: list[str]
    #: None: the session is the request's own key's. Else it continues another tenant's session (``key.tenant``),
    #: and its first ``proved`` items are what proved it (a link's scope, or the items up to a reference).
    proved: int | None = None


class Links:
    """The links this process has seen, own key → link; links never change, so they never go stale."""

    def __init__(self, maxsize: int = 10_000) -> None:
        self._links: OrderedDict[SessionKey, Link] = OrderedDict()
        self._maxsize = maxsize

    def get(self, key: SessionKey) -> Link | None:
        tenant = self._links.get(key)
        if tenant is not None:
            self._links.move_to_end(key)
        return tenant

    def put(self, key: SessionKey, link: Link) -> None:
        self._links[key] = link
        self._links.move_to_end(key)
        while len(self._links) > self._maxsize:
            self._links.popitem(last=False)


class Candidates:
    """The other tenants holding the session id, read from the store once, when first needed."""

    def __init__(self, request: web.Request, own: SessionKey) -> None:
        self._request, self._own = request, own
        self._tenants: list[Tenant] | None = None

    def read_with(self, looked: FirstLook) -> None:
        """The others as ``FactLog.first_look`` read them with the session's log."""
        self._tenants = looked.others

    async def get(self) -> list[Tenant]:
        if self._tenants is None:
            own = self._own
            self._tenants = [t for t in await self._request.app[store_key].tenants_of(own.session)
                             if t.name != own.tenant]
        return self._tenants


async def resolve(request: web.Request, dialect: Dialect, parsed: ParsedRequest, own: SessionKey,
                  conversation: str) -> Resolved:
    """The session the request is (its own key's, or the one it continues) and how far it proved it, the request
    with its references expanded (``clientcompaction.expand``), and its items' hashes (``conversation``: which of
    the session's conversations it is, ``proxy.http.subagents.conversation``)."""
    app = request.app
    link = app[links_key].get(own)
    candidates = Candidates(request, own)
    references: list[tuple[int, Reference]] = []
    if dialect.carries_compaction_items:
        key = own if link is None else SessionKey(link.tenant, own.session)
        expanded, references = await clientcompaction.expand(request, key, parsed.items,
                                                             candidates if link is None else None)
        if expanded is not parsed.items:  # Codex carried back a compaction item: its summary goes upstream instead
            payload = {**parsed.payload, dialect.items_field: expanded}
            parsed = dataclasses.replace(parsed, raw=orjson.dumps(payload), payload=payload, items=expanded)
    # The items new to the conversation are checked as they are hashed: the others were, in an earlier request.
    hashes = await app[history_key].hashes_for(own, parsed.items, len(parsed.raw),
                                               partial(dialect.checked_hash, items=parsed.items), conversation)
    # The newest reference to another tenant's session of this id proves that session as far as it goes.
    carried = next(((index + 1, r.tenant) for index, r in reversed(references)
                    if r.session == own.session and r.tenant != own.tenant), None)
    if carried is not None:
        return Resolved(SessionKey(carried[1], own.session), parsed, hashes, carried[0])
    if link is None:
        try:
            link = await _found(request, dialect, own, parsed, hashes, candidates)
        except StoreError as exc:
            app[metrics_key].store_errors.inc()
            logger.warning("store error while looking for the session %s under other credentials: %s",
                           own.session, exc)
    if link is None or not serves(link.proved, link.prefix, hashes):
        return Resolved(own, parsed, hashes)
    return Resolved(SessionKey(link.tenant, own.session), parsed, hashes, link.proved)


async def _found(request: web.Request, dialect: Dialect, own: SessionKey, parsed: ParsedRequest,
                 hashes: list[str], candidates: Candidates) -> Link | None:
    """The key's link (kept here), one the request's history proves (made now), or None: the request is its own
    key's. The caller checks that the link serves the request."""
    app = request.app
    history, store, items = app[history_key], app[store_key], parsed.items
    start = opening(dialect, items, hashes)
    first_seen = history.cached(own) is None
    if first_seen:
        # A session new here: its log, its link (needed when the log proves nothing) and who else holds the
        # session id, noting the own tenant (an owner if nobody does, else a prober), in one store call whether
        # or not the id is held elsewhere.
        state, looked = await history.first_look(own, start)
        candidates.read_with(looked)
        linked = looked.link
    else:
        state, linked = await history.state(own), None
    if holds(state, dialect, items, hashes):
        return None
    if not first_seen:
        linked = await store.link_of(own)  # linked by another process, or before a restart
    if linked is not None and linked.prefix:
        app[links_key].put(own, linked)
        return linked  # set once: whether it serves this request is the caller's check
    if "previous_response_id" in parsed.payload:
        return None  # the history lives upstream: the items are only what is new, and prove nothing
    proven, best = None, 0
    # The one the request matches furthest, should several match. Only a tenant whose noted opening the request
    # starts with is worth reading: for the others (and for an absent id) nothing more is read.
    for tenant in await candidates.get():
        if not start or start not in tenant.openings:
            continue
        matched = await _proves(request, dialect, SessionKey(tenant.name, own.session), items, hashes)
        if matched > best:
            proven, best = tenant.name, matched
    if proven is None:
        if not first_seen and start:  # a conversation new to the own session: its opening, for a later refresh
            await store.note_tenant(own.session, own.tenant, time.time(), start, owner=False)
        return None
    linked = await store.link(own, Link(proven, best, scope(hashes, best)), time.time())
    app[links_key].put(own, linked)
    logger.info("session %s continues under a new credential: tenant %s now resolves to tenant %s for the %d items "
                "it proved", own.session, own.tenant, linked.tenant, linked.proved)
    return linked


async def _proves(request: web.Request, dialect: Dialect, key: SessionKey, items: Sequence[Item],
                  hashes: list[str]) -> int:
    """How many of the request's items prove the session ``key`` (``proxy.context.log.continuity.proof``); 0: none."""
    app = request.app
    found = proof(await app[history_key].state(key), dialect, items, hashes,
                  partial(app[engine_key].counter.message_tokens, dialect))
    if found is None:
        return 0
    for seq in found.unseen:  # the few entries past what the request holds: only replies it never got may be
        facts = await app[store_key].read(key, after=seq - 1, limit=1)
        if not facts or facts[0].source != "upstream":
            return 0
    return found.matched
