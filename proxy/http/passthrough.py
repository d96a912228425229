"""Every other ``/v1/*`` path: forwarded unchanged, method, query, headers, body and streaming response.

Compressed responses stay compressed (``auto_decompress=False``) and are
relayed with their Content-Encoding, byte for byte, chunk by chunk.
"""

from __future__ import annotations

import time

import aiohttp
from aiohttp import web

from proxy.constants import HEADER_SESSION
from proxy.errors import ProxyError
from proxy.http.body import read_body
from proxy.keys import client_key, metrics_key, settings_key
from proxy.sessions import check_client_key, credential, explicit_session
from proxy.upstream import client_timeout, map_upstream_errors, request_headers, response_headers


async def passthrough(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    settings = request.app[settings_key]
    metrics = request.app[metrics_key]
    check_client_key(credential(request.headers), settings.client_keys)
    session = explicit_session(request.match_info.get("session"), request.headers)
    body = await read_body(request, settings.max_body_bytes) if request.body_exists else None
    url = settings.upstream_base + "/" + request.match_info["tail"]
    headers = request_headers(request.headers, settings, identity=False)
    status = 502
    upstream_seconds = 0.0
    try:
        async with map_upstream_errors():
            mark = time.perf_counter()
            async with request.app[client_key].request(
                request.method, url, params=request.rel_url.query, data=body, headers=headers,
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
        metrics.requests.labels(route="passthrough", status=str(status)).inc()
        metrics.upstream_seconds.observe(upstream_seconds)
        metrics.overhead_seconds.observe(max(time.perf_counter() - started - upstream_seconds, 0.0))
