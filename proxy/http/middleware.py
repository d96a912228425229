"""One place where errors become OpenAI-shaped JSON.

Clients (and the openai SDK's retry logic) read ``error.message`` and the
status; an HTML error page or a bare 500 would surface as an opaque crash in
the agent. aiohttp's own HTTP errors (404, 405, 413 from ``client_max_size``)
are rendered the same way.

An error raised after the handler's own response has started (a stream whose
status line went out) cannot become an error response: a second response
written into a started body is garbage the client waits on until its own
timeout. The connection is closed instead, so the client sees a truncated body
at once. ``on_response_prepare`` records which requests have started.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.errors import ProxyError

logger = logging.getLogger(__name__)

_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "invalid_request_error"}
#: Statuses after which the connection closes: the request's body was not read to its end (RFC 9110 §15.5.9).
_CLOSING = frozenset({408})

#: The response a handler prepared, once it has (set by ``remember_prepared``).
_started: web.RequestKey[web.StreamResponse] = web.RequestKey("started", web.StreamResponse)


def error_response(status: int, message: str, *, type: str, code: str | None = None,
                   param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return web.json_response(body, status=status)


async def remember_prepared(request: web.Request, response: web.StreamResponse) -> None:
    """An ``on_response_prepare`` hook: from here on, an error can only cut the connection."""
    request[_started] = response


def started(request: web.Request) -> bool:
    """Whether the handler's own response has started: an error past that point is ``error_middleware``'s to
    handle (by closing the connection), not a door's to render."""
    return request.get(_started) is not None


def _respond(request: web.Request, error: web.Response) -> web.StreamResponse:
    """``error``, unless the handler's response already started: then that response, its connection closed.

    aiohttp finishes the returned response; on a closed transport that fails
    quietly, so nothing more reaches the client (no final chunk: the body reads
    as truncated).
    """
    started: web.StreamResponse | None = request.get(_started)
    if started is None:
        if error.status in _CLOSING:
            error.force_close()
        return error
    logger.warning("%s %s failed after its response started (status %d); closing the connection",
                   request.method, request.path, started.status)
    if request.transport is not None:
        request.transport.close()
    return started


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProxyError as exc:
        return _respond(request, error_response(exc.status, exc.message, type=exc.type, code=exc.code,
                                                param=exc.param))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = "request_too_large" if exc.status == 413 else None
        message = exc.text if exc.status != 413 else "Request body is larger than this proxy accepts."
        return _respond(request, error_response(exc.status, message or exc.reason,
                                                type=_TYPES.get(exc.status, "invalid_request_error"), code=code))
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return _respond(request, error_response(500, "Internal proxy error.", type="proxy_error",
                                                code="internal_error"))
