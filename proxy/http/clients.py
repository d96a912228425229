"""``--client-keys``: whether a caller may use the proxy, decided before a route does anything else.

One middleware guards every route, so an unauthenticated caller never makes
the proxy read or parse a body (it gets 401, not a 400 or 413 that would tell
it the body was looked at), and a route added later is guarded unless it is
registered with ``open_route``: the health and metrics endpoints, and the
admin API, which has its own token. A path no route matches gets the same
401, so a caller without a key learns nothing about which paths exist.
"""

from __future__ import annotations

from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.keys import settings_key
from proxy.sessions import check_client_key, credential

H = TypeVar("H")

_OPEN = "__ctxproxy_open_route__"


def open_route(handler: H) -> H:
    """Mark a route handler as needing no client key: public, or guarded by its own check."""
    setattr(handler, _OPEN, True)
    return handler


@web.middleware
async def client_key_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    keys = request.app[settings_key].client_keys
    if keys and not getattr(request.match_info.handler, _OPEN, False):
        check_client_key(credential(request.headers, request.query), keys)
    return await handler(request)
