"""The Gemini API's front door: ``/{version}/models/{model}:{method}``, and its errors in Gemini's shape.

``:generateContent`` and ``:streamGenerateContent`` (with ``alt=sse`` or as a JSON array) go through the front
door every API shares (``proxy.http.frontdoor``) with the Gemini dialect; ``:countTokens`` is answered here over
the view (``{"totalTokens": N}``), as ``/v1/responses/input_tokens`` is (in its other form, a
``generateContentRequest``, it passes through); every other method, and every other path
under ``/v1beta`` or ``/v1alpha``, passes through to ``--gemini-upstream`` with the client's query and headers
(``--gemini-upstream-key`` in place of the client's key).

Gemini clients read errors as ``{"error": {"code": int, "message": str, "status": str}}``: every error the
proxy raises on these paths (a malformed body, a wrong client key, an unknown route, an unreachable upstream)
takes that shape, as every door's errors take its own (``GeminiDialect.error_body``, ``proxy.http.middleware``).
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from proxy.dialects.base import parse_json
from proxy.dialects.gemini import DIALECT as GEMINI
from proxy.dialects.gemini import METHODS, VERSIONS
from proxy.http.body import read_body
from proxy.http.counts import counted, view_of
from proxy.http.frontdoor import front_door, open_turn
from proxy.http.passthrough import forward, upstream_url
from proxy.keys import settings_key
from proxy.upstream import request_headers

logger = logging.getLogger(__name__)

#: The API versions the door answers, as a route pattern.
VERSION_PATTERN = "|".join(VERSIONS)


def add_routes(router: web.UrlDispatcher) -> None:
    for prefix in ("", "/s/{session}"):
        router.add_post(prefix + "/{version:" + VERSION_PATTERN + "}/models/{model:[^/:]+}:{method:[A-Za-z]+}", door)
        router.add_route("*", prefix + "/{version:" + VERSION_PATTERN + "}/{tail:.*}", passthrough)


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

