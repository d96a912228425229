"""One place where errors become JSON, in the shape of the door the request came to.

Clients (and their SDKs' retry logic) read the error's message and the status;
an HTML error page or a bare 500 would surface as an opaque crash in the agent.
A request at or under a door's path (``Dialect.door``, also below
``/s/{session}``) gets that API's shape (``Dialect.error_body``: Anthropic's on
``/v1/messages``); every other path OpenAI's. aiohttp's own HTTP errors (404,
405, 413 from ``client_max_size``) are rendered the same way.

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

from proxy.dialects import DIALECTS, Dialect
from proxy.errors import ProxyError, openai_error

logger = logging.getLogger(__name__)

_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "invalid_request_error"}
#: Statuses after which the connection closes: the request's body was not read to its end (RFC 9110 §15.5.9).
_CLOSING = frozenset({408})

#: The response a handler prepared, once it has (set by ``remember_prepared``).
_started: web.RequestKey[web.StreamResponse] = web.RequestKey("started", web.StreamResponse)


def door_of(path: str) -> Dialect | None:
    """The API whose door ``path`` is at or under, if any."""
    if path.startswith("/s/"):
        path = "/" + path.split("/", 3)[-1] if path.count("/") >= 3 else ""
    return next((d for d in DIALECTS.values() if d.at_door(path)), None)


def error_response(status: int, message: str, *, type: str, code: str | None = None, param: str | None = None,
                   path: str = "") -> web.Response:
    """An error the proxy raises itself, in the shape of the door ``path`` belongs to (OpenAI's elsewhere)."""
    door = door_of(path)
    body = (door.error_body(status, message, type=type, code=code, param=param) if door is not None
            else openai_error(message, type=type, code=code, param=param))
    return web.json_response(body, status=status)


async def remember_prepared(request: web.Request, response: web.StreamResponse) -> None:
    """An ``on_response_prepare`` hook: from here on, an error can only cut the connection."""
    request[_started] = response


def started(request: web.Request) -> bool:
    """Whether the handler's own response has started: an error past that point is ``error_middleware``'s to
    handle (by closing the connection), not a door's to render."""
    return request.get(_started) is not None


async def _respond(request: web.Request, error: web.Response) -> web.StreamResponse:
    """``error``, unless the handler's response already started: then that response, its connection closed.

    aiohttp finishes the returned response; on a closed transport that fails
    quietly, so nothing more reaches the client (no final chunk: the body reads
    as truncated). A closing status (``_CLOSING``) is written whole here and the
    connection closed at once: aiohttp would otherwise keep it open reading
    (and dropping) the rest of the body, up to 10 s (its lingering close).
    """
    begun: web.StreamResponse | None = request.get(_started)
    if begun is None:
        if error.status in _CLOSING:
            error.force_close()
            await error.prepare(request)
            await error.write_eof()
            request.protocol.force_close()
        return error
    logger.warning("%s %s failed after its response started (status %d); closing the connection",
                   request.method, request.path, begun.status)
    if request.transport is not None:
        request.transport.close()
    return begun


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Exception as exc:
        return await error_for(request, exc)


async def error_for(request: web.Request, exc: Exception) -> web.StreamResponse:
    """What the client gets for ``exc``, raised while answering ``request`` (a redirect is raised on)."""
    if isinstance(exc, ProxyError):
        error = error_response(exc.status, exc.message, type=exc.type, code=exc.code, param=exc.param,
                               path=request.path)
        error.headers.update(exc.headers)
        return await _respond(request, error)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        code = "request_too_large" if exc.status == 413 else None
        message = exc.text if exc.status != 413 else "Request body is larger than this proxy accepts."
        return await _respond(request, error_response(exc.status, message or exc.reason, path=request.path,
                                                      type=_TYPES.get(exc.status, "invalid_request_error"),
                                                      code=code))
    logger.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return await _respond(request, error_response(500, "Internal proxy error.", type="proxy_error",
                                                  code="internal_error", path=request.path))
