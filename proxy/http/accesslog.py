"""Access lines for the operator's routes: every ``/admin`` and ``/ui`` request, so reading a tenant's log leaves
a trace.

A proxied request gets its line from its door (``proxy.http.frontdoor``: session, tenant, status, timings);
aiohttp's own access log is off (``proxy.server``: it would log every request a second time). The admin API and
the inspector read and change any tenant's sessions, so their requests are logged here, on the same logger
(``proxy.access``): the route, the method and path (never the query, which may carry a sign-in token), the tenant
and session the path names, the status, the milliseconds and the caller's address. A status of 401 or 404 is a
caller without the token. The inspector's static files and the polls of an open session page (``/live``, every
few seconds) are logged at DEBUG: the page they belong to has its line already.

The middleware is the outermost, so it sees the status the client got, errors rendered included.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.logs import ACCESS_LOGGER

access_logger = logging.getLogger(ACCESS_LOGGER)

#: The operator's route families, by the first segment of the path.
OPERATOR_ROUTES = ("admin", "ui")


def operator_route(path: str) -> str | None:
    """``admin`` or ``ui`` for a path at or under ``/admin`` or ``/ui``, else None."""
    first = path[1:].split("/", 1)[0]
    return first if first in OPERATOR_ROUTES else None


@web.middleware
async def operator_access_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    route = operator_route(request.path)
    if route is None:
        return await handler(request)
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except asyncio.CancelledError:
        status = 499  # the caller went away (nginx's convention)
        raise
    except web.HTTPException as exc:  # a redirect, raised past the error middleware
        status = exc.status
        raise
    finally:
        _log(request, route, status, time.perf_counter() - started)


def _log(request: web.Request, route: str, status: int, seconds: float) -> None:
    template = request.match_info.route.resource.canonical if request.match_info.route.resource else ""
    level = logging.DEBUG if template.endswith("/live") or template.startswith("/ui/static/") else logging.INFO
    if not access_logger.isEnabledFor(level):
        return
    tenant, session = request.match_info.get("tenant"), request.match_info.get("session")
    access_logger.log(
        level, "%s %s %s tenant=%s session=%s status=%d ms=%.1f from=%s", route, request.method, request.path,
        tenant, session, status, seconds * 1000, request.remote,
        extra={"fields": {"event": route, "method": request.method, "path": request.path, "tenant": tenant,
                          "session": session, "status": status, "ms": round(seconds * 1000, 1),
                          "remote": request.remote}},
    )
