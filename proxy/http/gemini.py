"""The Gemini API's front door: ``/{version}/models/{model}:{method}``, and its errors in Gemini's shape.

``:generateContent`` and ``:streamGenerateContent`` (with ``alt=sse`` or as a JSON array) go through the front
door every API shares (``proxy.http.frontdoor``) with the Gemini dialect; ``:countTokens`` is answered here over
the view (``{"totalTokens": N}``), as ``/v1/responses/input_tokens`` is (in its other form, a
``generateContentRequest``, it passes through); every other method, and every other path
under ``/v1beta`` or ``/v1alpha``, passes through to ``--gemini-upstream`` with the client's query and headers
(``--gemini-upstream-key`` in place of the client's key).

Gemini clients read errors as ``{"error": {"code": int, "message": str, "status": str}}``: every error the
proxy raises on these paths (a malformed body, a wrong client key, an unknown route, an unreachable upstream)
takes that shape, through ``gemini_errors``, a middleware inside ``error_middleware`` that leaves every other
path, and any response that has started, to it.
"""

from __future__ import annotations

import logging
import re
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.dialects.base import parse_json
from proxy.dialects.gemini import DIALECT as GEMINI
from proxy.dialects.gemini import METHODS
from proxy.errors import ProxyError
from proxy.http.body import read_body
from proxy.http.counts import counted, view_of
from proxy.http.frontdoor import front_door, open_turn
from proxy.http.middleware import started
from proxy.http.passthrough import forward, upstream_url
from proxy.keys import settings_key
from proxy.upstream import request_headers

logger = logging.getLogger(__name__)

#: The API versions the door answers (``GOOGLE_GENAI_API_VERSION``): ``v1`` is the OpenAI door's.
VERSIONS = "v1beta|v1alpha"
_PATH = re.compile(rf"^(?:/s/[^/]+)?/(?:{VERSIONS})(?:/|$)")
#: Google's canonical status names, by HTTP status (google.rpc.Code).
STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                405: "UNIMPLEMENTED", 408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT",
                426: "FAILED_PRECONDITION", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
                501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def add_routes(router: web.UrlDispatcher) -> None:
    for prefix in ("", "/s/{session}"):
        router.add_post(prefix + "/{version:" + VERSIONS + "}/models/{model:[^/:]+}:{method:[A-Za-z]+}", door)
        router.add_route("*", prefix + "/{version:" + VERSIONS + "}/{tail:.*}", passthrough)


_turns = front_door(GEMINI)


async def door(request: web.Request) -> web.StreamResponse:
    method = request.match_info["method"]
    if method == "countTokens":
        payload = parse_json(await read_body(request, request.app[settings_key]))
        if isinstance(payload, dict) and "contents" not in payload and "generateContentRequest" in payload:
            return await passthrough(request)  # the other form of the request: the upstream counts it
        return await count_tokens(request)
    if method not in METHODS:
        return await passthrough(request)
    return await _turns(request)


@counted(GEMINI.name)
async def count_tokens(request: web.Request) -> web.StreamResponse:
    """``:countTokens`` over the view the model would get: the upstream would count the uncompacted history."""
    begun = time.perf_counter()
    turn = await open_turn(request, GEMINI)
    view = view_of(turn)
    return web.json_response({"totalTokens": view.estimate.tokens}, headers=turn.headers(view, begun))


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Any other Gemini path, to ``--gemini-upstream`` under the same version."""
    settings = request.app[settings_key]
    url = upstream_url(request, f"{settings.gemini_base}/{request.match_info['version']}")
    headers = request_headers(request.headers, settings, identity=False, gemini=True)
    return await forward(request, url, headers, GEMINI.upstream_query(settings, request.rel_url.query))


def error_body(status: int, message: str) -> dict[str, object]:
    return {"error": {"code": status, "message": message, "status": STATUS_NAMES.get(status, "UNKNOWN")}}


@web.middleware
async def gemini_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Errors on the Gemini paths in Gemini's shape; everything else is ``error_middleware``'s."""
    if not _PATH.match(request.path):
        return await handler(request)
    try:
        return await handler(request)
    except ProxyError as exc:
        if started(request):
            raise
        response = web.json_response(error_body(exc.status, exc.message), status=exc.status)
        if exc.status == 408:  # the body was not read to its end: the connection cannot be reused
            response.force_close()
        return response
    except web.HTTPException as exc:
        if exc.status < 400 or started(request):
            raise
        message = "Request body is larger than this proxy accepts." if exc.status == 413 else exc.text or exc.reason
        return web.json_response(error_body(exc.status, message), status=exc.status)
    except Exception:
        if started(request):
            raise
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return web.json_response(error_body(500, "Internal proxy error."), status=500)
