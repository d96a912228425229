"""Every other ``/v1/*`` path: forwarded unchanged, method, query, headers, body and streaming response.

Compressed responses stay compressed (``auto_decompress=False``) and are
relayed with their Content-Encoding, byte for byte, chunk by chunk.

The path goes upstream as the client encoded it, below the upstream URL's own
prefix and never outside it: a dot segment (``..``, also as ``%2e%2e`` or
behind ``%2F``) would let a client walk out of ``https://host/prefix/v1`` to
any path of that host, carrying ``--upstream-key``; it gets a 400.

A request carrying ``anthropic-version`` (Claude Code's, at ``ANTHROPIC_BASE_URL``)
goes to ``--anthropic-upstream`` instead.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from yarl import URL

from proxy.constants import HEADER_SESSION
from proxy.errors import BadRequest, ProxyError, UpgradeRequired
from proxy.http.body import read_body
from proxy.keys import client_key, metrics_key, settings_key
from proxy.sessions import explicit_session
from proxy.upstream import client_timeout, map_upstream_errors, request_headers, response_headers


def upstream_url(request: web.Request, base: str) -> URL:
    """``{base}/{tail}``, the tail still percent-encoded as the client sent it (``%3F`` stays in the path)."""
    # The route is /v1/… or /s/{session}/v1/…: the raw tail follows the first 2 or 4 raw segments.
    skip = 4 if "session" in request.match_info else 2
    raw_tail = "/".join(request.rel_url.raw_path.split("/")[skip:])
    if any(segment in (".", "..") for segment in unquote(raw_tail).split("/")):
        raise BadRequest("Dot segments ('.' and '..') are not allowed in a pass-through path.", param="path")
    return URL(base + "/" + raw_tail, encoded=True)


async def responses_socket(request: web.Request) -> web.StreamResponse:
    """``GET /v1/responses``: a websocket upgrade gets 426, so Codex falls back to HTTP streaming."""
    if request.headers.get("Upgrade", "").lower() == "websocket":
        request.app[metrics_key].request_served("responses", "426")
        raise UpgradeRequired("This proxy speaks the Responses API over HTTP only; use POST /v1/responses.",
                              code="websocket_not_supported")
    return await passthrough(request)


async def passthrough(request: web.Request) -> web.StreamResponse:
    settings = request.app[settings_key]
    # Anthropic clients (Claude Code at ANTHROPIC_BASE_URL) send anthropic-version on every request.
    anthropic = "anthropic-version" in request.headers
    url = upstream_url(request, settings.anthropic_base + "/v1" if anthropic else settings.upstream_base)
    headers = request_headers(request.headers, settings, identity=False, anthropic=anthropic)
    return await forward(request, url, headers, request.rel_url.query)


async def forward(request: web.Request, url: URL, headers: Mapping[str, str],
                  query: Mapping[str, str]) -> web.StreamResponse:
    """``request`` sent on to ``url`` with ``headers`` and ``query``, its answer relayed as it arrives."""
    started = time.perf_counter()
    settings = request.app[settings_key]
    metrics = request.app[metrics_key]
    session = explicit_session(request.match_info.get("session"), request.headers)
    body = await read_body(request, settings) if request.body_exists else None
    status = 502
    upstream_seconds = 0.0
    try:
        async with map_upstream_errors(url, settings):
            mark = time.perf_counter()
            async with request.app[client_key].request(
                request.method, url, params=query, data=body, headers=headers,
                timeout=client_timeout(settings), auto_decompress=False, allow_redirects=False,
            ) as resp:
                upstream_seconds += time.perf_counter() - mark
                status = resp.status
                out_headers = response_headers(resp.headers, decoded=False)
                if session is not None:
                    out_headers[HEADER_SESSION] = session
                out = web.StreamResponse(status=resp.status, reason=resp.reason, headers=out_headers)
                await out.prepare(request)
                mark = time.perf_counter()
                try:
                    async for chunk in resp.content.iter_any():
                        upstream_seconds += time.perf_counter() - mark
                        await out.write(chunk)
                        mark = time.perf_counter()
                except (TimeoutError, aiohttp.ClientError):
                    # Headers are sent: cut the connection so the client sees a truncated body, not a clean end.
                    if request.transport is not None:
                        request.transport.close()
                    return out
                upstream_seconds += time.perf_counter() - mark
                await out.write_eof()
                return out
    except ProxyError as exc:
        status = exc.status
        raise
    finally:
        metrics.request_served("passthrough", status)
        metrics.upstream_seconds.observe(upstream_seconds)
        metrics.overhead_seconds.observe(max(time.perf_counter() - started - upstream_seconds, 0.0))
