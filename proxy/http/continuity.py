"""Sessions that outlive a credential: which tenant's session a request is, when its credential changed mid-run.

A request's own key is its credential's tenant and its session id (``proxy.sessions``). Claude Code and Codex on
a subscription refresh their OAuth access token during a run, and the run must not land in an empty session of
a new tenant. So a request whose own session does not already hold its conversation is checked against the
sessions of that id under other tenants (``FactLog.tenants_of``: the newest ``TENANTS_KEPT``, noted when a
process first sees a session), and continues one that it proves (``proxy.context.continuity``: its items are
that session's conversation as far as the log goes), or that a reference the proxy handed out names
(``proxy.secret``). Its tenant is then linked to that session (``FactLog.link``, set once), so later requests,
on any replica, resolve at once. A request that proves nothing gets its own session, as before: knowing a
session id gives nothing of the session.

Links found are kept in memory (``Links``); a store failure here only costs the continuation (the request
goes on under its own key, as with the store down), never the request.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from functools import partial

import orjson
from aiohttp import web

from proxy.context.continuity import holds, proof
from proxy.context.items import Item
from proxy.dialects.base import Dialect, ParsedRequest
from proxy.errors import StoreError
from proxy.http import clientcompaction
from proxy.keys import engine_key, history_key, links_key, metrics_key, store_key
from proxy.secret import Reference
from proxy.store.base import FirstLook, SessionKey

logger = logging.getLogger(__name__)


class Links:
    """The links this process has seen, own key → tenant continued; links never change, so they never go stale."""

    def __init__(self, maxsize: int = 10_000) -> None:
        self._links: OrderedDict[SessionKey, str] = OrderedDict()
        self._maxsize = maxsize

    def get(self, key: SessionKey) -> str | None:
        tenant = self._links.get(key)
        if tenant is not None:
            self._links.move_to_end(key)
        return tenant

    def put(self, key: SessionKey, tenant: str) -> None:
        self._links[key] = tenant
        self._links.move_to_end(key)
        while len(self._links) > self._maxsize:
            self._links.popitem(last=False)


class Candidates:
    """The other tenants holding the session id, read from the store once, when first needed."""

    def __init__(self, request: web.Request, own: SessionKey) -> None:
        self._request, self._own = request, own
        self._tenants: list[str] | None = None
        #: Whether reading them noted the own tenant too (``FactLog.first_look``: there were none).
        self.noted = False

    def read_with(self, looked: FirstLook) -> None:
        """The others as ``FactLog.first_look`` read them with the session's log."""
        self._tenants, self.noted = looked.others, not looked.others

    async def get(self) -> list[str]:
        if self._tenants is None:
            own = self._own
            self._tenants = [t for t in await self._request.app[store_key].tenants_of(own.session) if t != own.tenant]
        return self._tenants


async def resolve(request: web.Request, dialect: Dialect, parsed: ParsedRequest,
                  own: SessionKey) -> tuple[SessionKey, ParsedRequest, list[str]]:
    """The session the request is (its own key, or the one it continues), the request with its references
    expanded (``clientcompaction.expand``), and its items' hashes."""
    app = request.app
    target = app[links_key].get(own)
    candidates = Candidates(request, own)
    references: list[Reference] = []
    if dialect.carries_compaction_items:
        key = own if target is None else SessionKey(target, own.session)
        expanded, references = await clientcompaction.expand(request, key, parsed.items,
                                                             candidates if target is None else None)
        if expanded is not parsed.items:  # Codex carried back a compaction item: its summary goes upstream instead
            payload = {**parsed.payload, dialect.items_field: expanded}
            parsed = ParsedRequest(orjson.dumps(payload), payload, expanded)
    hashes = await app[history_key].hashes_for(own, parsed.items, len(parsed.raw), dialect.checked_hash)
    if target is None:
        try:
            target = await _continued(request, dialect, own, parsed, hashes, references, candidates)
        except StoreError as exc:
            app[metrics_key].store_errors.inc()
            logger.warning("store error while looking for the session %s under other credentials: %s",
                           own.session, exc)
    return (own if target is None else SessionKey(target, own.session)), parsed, hashes


async def _continued(request: web.Request, dialect: Dialect, own: SessionKey, parsed: ParsedRequest,
                     hashes: list[str], references: Sequence[Reference], candidates: Candidates) -> str | None:
    """The tenant whose session the request continues (now linked), or None: the request is its own key's."""
    app = request.app
    proven = next((r.tenant for r in references if r.session == own.session and r.tenant != own.tenant), None)
    if proven is None:
        if "previous_response_id" in parsed.payload:
            return None  # the history lives upstream: the items are only what is new, and prove nothing
        proven, new = await _found(request, dialect, own, parsed.items, hashes, candidates)
        if proven is None or not new:
            return proven
    linked = await app[store_key].link(own, proven, time.time())
    app[links_key].put(own, linked)
    logger.info("session %s continues under a new credential: tenant %s now resolves to tenant %s",
                own.session, own.tenant, linked)
    return linked


async def _found(request: web.Request, dialect: Dialect, own: SessionKey, items: Sequence[Item],
                 hashes: list[str], candidates: Candidates) -> tuple[str | None, bool]:
    """The tenant whose session the request's history proves (and True: to be linked), the tenant the store
    already links its key to (and False), or None: the request is its own key's (noted as holding it)."""
    app = request.app
    history, store = app[history_key], app[store_key]
    first_seen = history.cached(own) is None
    if first_seen:
        # A session new here: its log, its link (needed when the log proves nothing) and who else holds the
        # session id, noting the own tenant if nobody does, in one store call. (Noted when it turns out linked:
        # only if no other tenant is noted, which a link leaves only if they were all pushed out of the
        # TENANTS_KEPT newest; a tenant noted with nothing logged proves nothing.)
        state, looked = await history.first_look(own)
        candidates.read_with(looked)
        linked = looked.link
    else:
        state, linked = await history.state(own), None
    if not holds(state, dialect, items, hashes):
        if not first_seen:
            linked = await store.link_of(own)  # linked by another process, or before a restart
        if linked is not None:
            app[links_key].put(own, linked)
            return linked, False
        proven, best = None, 0
        # The one the request matches furthest, should several match; with none, a first sight is noted at once.
        for tenant in await candidates.get():
            matched = await _proves(request, dialect, SessionKey(tenant, own.session), items, hashes)
            if matched > best:
                proven, best = tenant, matched
        if proven is not None:
            return proven, True
    if first_seen and not candidates.noted:
        await store.note_tenant(own.session, own.tenant, time.time())
    return None, False


async def _proves(request: web.Request, dialect: Dialect, key: SessionKey, items: Sequence[Item],
                  hashes: list[str]) -> int:
    """How many of the request's items prove the session ``key`` (``proxy.context.continuity.proof``); 0: none."""
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
