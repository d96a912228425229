"""The admin API under ``/admin/``: list sessions and what they saved, stream a log, show the next view, compact now,
undo a compaction.

Access: ``Authorization: Bearer <--admin-token>``, compared in constant time;
after a few wrong ones, the caller's address waits a growing delay before its
next token is checked, and wrong ones from many addresses spend a budget shared
by all but the addresses the token came from lately (``proxy.throttle``; 429
until then), the inspector's sign-in sharing the record.
Without a configured token every admin path answers 404, as if the API did not
exist, so a deployment that never turned it on exposes nothing to probe. The
routes are registered always and the check is per request, and a catch-all
keeps unknown admin paths behind the same check, so a caller without the token
cannot tell which admin paths exist.

The operator sees every tenant: tenants are namespaces of the proxy's users,
not of its operator. A tenant's own key is not the admin token and gets 401.

The model a session uses is not in its log, yet the window (and the summary
model) depend on it: ``?model=`` names it; without it the window is
``--context-window`` or 128,000 and the summary model ``--summary-model``.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.context.log.undo import uncompact
from proxy.dialects.base import Dialect, parse_json
from proxy.errors import BadRequest, ProxyError, StoreError, TooManyAttempts, Unauthorized
from proxy.http.body import read_body
from proxy.http.clients import open_route
from proxy.keys import (
    client_key,
    engine_key,
    history_key,
    metrics_key,
    savings_key,
    settings_key,
    store_key,
    throttle_key,
)
from proxy.render import build_view, fact_line, info_json, pages, replay, session_infos
from proxy.savings import UsageTotals
from proxy.sessions import logged_session_key
from proxy.store.base import SessionKey, as_seq
from proxy.summarycall import summary_completer

logger = logging.getLogger(__name__)

#: Carries the tenant's upstream credential for a summary when ``--upstream-key`` is unset; never logged.
HEADER_UPSTREAM_AUTH = "X-Upstream-Authorization"
NDJSON = "application/x-ndjson"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/admin/sessions", admin_only(list_sessions))
    router.add_get("/admin/savings", admin_only(savings))
    # A sub-agent's session id holds one '/': as %2F, or as it is, since each route ends in a fixed word.
    base = "/admin/sessions/{tenant}/{session:.+}"
    router.add_get(base + "/log", admin_only(session_log))
    router.add_get(base + "/view", admin_only(session_view))
    router.add_post(base + "/compact", admin_only(compact_session))
    router.add_post(base + "/uncompact", admin_only(uncompact_session))
    router.add_route("*", "/admin{tail:(/.*)?}", admin_only(unknown))


def admin_token_matches(request: web.Request, presented: str) -> bool:
    """Whether ``presented`` is the admin token, compared in constant time, unless the caller's address is still
    waiting out a delay (``proxy.throttle``: for its own failures, or for many addresses' while it is not one the
    token came from lately; ``TooManyAttempts``, nothing compared); a failure counts towards both. No token at all
    is no guess: False, and no delay."""
    if not presented:
        return False
    throttle, address = request.app[throttle_key], request.remote or ""
    own = throttle.address_wait(address)
    if wait := throttle.wait(address):
        source = "from this address" if own > 0 else "from many addresses"
        raise TooManyAttempts(f"Too many wrong admin tokens {source}: try again in {wait:.1f} s.",
                              retry_after=wait)
    token = request.app[settings_key].admin_token or ""
    if hmac.compare_digest(presented.encode(errors="surrogatepass"), token.encode()):
        throttle.succeeded(address)
        return True
    throttle.failed(address)
    return False


def authorize(request: web.Request) -> None:
    """404 when the admin API is off, 401 unless the request carries the admin token as a bearer token."""
    if not request.app[settings_key].admin_token:
        raise web.HTTPNotFound()
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if not admin_token_matches(request, presented.strip() if scheme.lower() == "bearer" else ""):
        raise Unauthorized("Invalid or missing admin token.")


def admin_only(handler: Handler) -> Handler:
    """Guard ``handler`` with ``authorize`` (instead of a client key) and count it as ``route="admin"``."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        status = 500
        try:
            authorize(request)
            response = await handler(request)
            status = response.status
            return response
        except (ProxyError, web.HTTPException) as exc:
            status = exc.status
            raise
        finally:
            request.app[metrics_key].request_served("admin", status)

    return open_route(guarded)


def _json(body: Any) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def _key(request: web.Request) -> SessionKey:
    return logged_session_key(request.match_info["tenant"], request.match_info["session"])


def _not_found(key: SessionKey) -> web.HTTPNotFound:
    return web.HTTPNotFound(text=f"No session {key.session!r} under tenant {key.tenant!r}.")


def _model(request: web.Request) -> str:
    return request.query.get("model") or request.app[settings_key].summary_model or ""


async def unknown(request: web.Request) -> web.StreamResponse:
    raise web.HTTPNotFound()


async def list_sessions(request: web.Request) -> web.Response:
    return _json([info_json(info) for info in await session_infos(request.app[store_key])])


async def savings(request: web.Request) -> web.Response:
    """What each session saved (``proxy.savings``) and the total over them, most recently updated first."""
    store, cache = request.app[store_key], request.app[savings_key]
    rows, total = [], UsageTotals()
    for info in await session_infos(store):
        totals = await cache.of(store, info)
        total.merge(totals)
        rows.append({"tenant": info.tenant, "session": info.session, **totals.to_json()})
    return _json({"sessions": rows, "total": total.to_json()})


async def session_log(request: web.Request) -> web.StreamResponse:
    """The whole log as NDJSON, written page by page as it is read: never held in memory whole.

    A store failure after the first byte cannot become an error status; the
    connection is cut instead, so the client sees a truncated body, not a clean end.
    """
    key = _key(request)
    async with contextlib.aclosing(pages(request.app[store_key], key)) as log:
        first = await anext(log, None)
        if first is None:
            raise _not_found(key)
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)
        try:
            await response.write(b"".join(fact_line(f) for f in first))
            async for page in log:
                await response.write(b"".join(fact_line(f) for f in page))
        except StoreError as exc:
            logger.warning("store failed while streaming the log of session %s: %s", key.session, exc)
            if request.transport is not None:
                request.transport.close()
            return response
    await response.write_eof()
    return response


async def session_view(request: web.Request) -> web.Response:
    """The run's view (``proxy.render.run_end``): a title call sent since does not change what it shows."""
    key = _key(request)
    lineage = await replay(request.app[store_key], key, run=True)
    if not lineage.facts:
        raise _not_found(key)
    return _json(build_view(request.app[engine_key], lineage, _model(request)).to_json())


def _upstream_headers(request: web.Request, dialect: Dialect) -> CIMultiDict[str]:
    """Headers for the summary call: only the upstream credential, never the admin's own headers or token.

    A bare key goes as the API expects one: ``x-api-key`` to Anthropic, ``x-goog-api-key`` to Gemini, else
    ``Authorization: Bearer``;
    a value with a scheme (``Bearer …``) goes as ``Authorization`` unchanged.
    """
    headers: CIMultiDict[str] = CIMultiDict()
    credential = request.headers.get(HEADER_UPSTREAM_AUTH, "").strip()
    if " " in credential:
        headers["Authorization"] = credential
    elif credential and (dialect.anthropic or dialect.gemini):
        headers["x-api-key" if dialect.anthropic else "x-goog-api-key"] = credential
    elif credential:
        headers["Authorization"] = "Bearer " + credential
    return headers


async def _body(request: web.Request) -> dict[str, Any]:
    """The optional JSON object an admin POST carries ({} for none)."""
    raw = await read_body(request, request.app[settings_key]) if request.body_exists else b""
    if not raw.strip():
        return {}
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.", code="invalid_json")
    return body


async def _instructions(request: web.Request) -> str | None:
    instructions = (await _body(request)).get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("'instructions' must be a string.", param="instructions")
    return instructions or None


async def compact_session(request: web.Request) -> web.Response:
    """Compact the run's conversation now (``proxy.render.run_end``: not a side call's branch the log's head is on),
    as the proactive path would but regardless of the threshold (``trigger="manual"``)."""
    key = _key(request)
    instructions = await _instructions(request)
    app = request.app
    settings, engine = app[settings_key], app[engine_key]
    lineage = await replay(app[store_key], key, run=True)
    if not lineage.facts:
        raise _not_found(key)
    model = _model(request)
    complete = summary_completer(app[client_key], settings, _upstream_headers(request, lineage.dialect),
                                 settings.summary_model or model, lineage.dialect)
    result, _ = await engine.compact(key, lineage.messages, lineage.hashes, trigger="manual", dialect=lineage.dialect,
                                     model=model, complete=complete, window=engine.window_for(model),
                                     instructions=instructions)
    checkpoint = orjson.loads(result.checkpoint.to_json()) if result.checkpoint is not None else None
    return _json({"outcome": result.outcome, "checkpoint": checkpoint, "tokens_before": result.tokens_before,
                  "tokens_after": result.tokens_after, "detail": result.detail})


async def uncompact_session(request: web.Request) -> web.Response:
    """Undo a compaction: a ``retire`` entry takes back checkpoint ``{"checkpoint": seq}`` (default: the newest
    live one) and those made from it, so the next view is the one it replaced (``proxy.context.log.undo``). 409 when
    there is none to undo, or while a compaction of the session runs."""
    key = _key(request)
    raw = (await _body(request)).get("checkpoint")
    seq = as_seq(raw)
    if raw is not None and seq is None:
        raise BadRequest("'checkpoint' must be the seq of a checkpoint entry.", param="checkpoint")
    history = request.app[history_key]
    if (await history.state(key, refresh=True)).next_seq == 0:
        raise _not_found(key)
    undone = await uncompact(history, key, seq)
    return _json(undone.to_json())
