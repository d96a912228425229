"""One place where errors become OpenAI-shaped JSON.

Clients (and the openai SDK's retry logic) read ``error.message`` and the
status; an HTML error page or a bare 500 would surface as an opaque crash in
the agent. aiohttp's own HTTP errors (404, 405, 413 from ``client_max_size``)
are rendered the same way.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.errors import ProxyError

logger = logging.getLogger(__name__)

_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "invalid_request_error"}


def error_response(status: int, message: str, *, type: str, code: str | None = None,
                   param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return web.json_response(body, status=status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProxyError as exc:
        return error_response(exc.status, exc.message, type=exc.type, code=exc.code, param=exc.param)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = "request_too_large" if exc.status == 413 else None
        message = exc.text if exc.status != 413 else "Request body is larger than this proxy accepts."
        return error_response(exc.status, message or exc.reason, type=_TYPES.get(exc.status, "invalid_request_error"),
                              code=code)
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "Internal proxy error.", type="proxy_error", code="internal_error")
