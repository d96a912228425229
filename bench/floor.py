"""The floor: a bare aiohttp forwarder, the physical limit of a proxy built on this stack.

Run: ``python3 -m bench.floor --port N --upstream http://127.0.0.1:M [--workers K]`` (the upstream's root, no
path).

Every request is forwarded to the same path on the upstream: the body read whole
(a proxy that looks at messages must), the headers copied (hop-by-hop ones
dropped), and the answer streamed back chunk by chunk as it arrives, status,
headers and bytes unchanged (no decompression). No parsing, no logging, no
store. Same server, client and event loop as ctxproxy (aiohttp, uvloop when
installed), one process, so ``ctxproxy ÷ floor`` is the cost of what ctxproxy
does beyond forwarding. ``--workers K`` forks K such processes on one port
(``SO_REUSEPORT``, as ``ctxproxy serve --workers K`` does), the floor for a
K-worker ctxproxy. Stops on SIGTERM/SIGINT and when its parent dies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from bench.fakeserver import serve

#: Per-connection headers (RFC 9110 7.6.1) and the ones aiohttp sets itself for the new message.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "host", "content-length"})

client_key: web.AppKey[aiohttp.ClientSession] = web.AppKey("client", aiohttp.ClientSession)
upstream_key: web.AppKey[str] = web.AppKey("upstream", str)


async def forward(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    url = request.app[upstream_key] + request.path_qs
    async with request.app[client_key].request(request.method, url, data=body, headers=headers) as up:
        resp = web.StreamResponse(status=up.status, reason=up.reason,
                                  headers={k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP})
        if up.content_length is not None:
            resp.content_length = up.content_length
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp


async def _client(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                     skip_auto_headers=("User-Agent",),
                                     timeout=aiohttp.ClientTimeout(total=None)) as client:
        app[client_key] = client
        yield


def make_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[upstream_key] = upstream.rstrip("/")
    app.cleanup_ctx.append(_client)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def _run(host: str, port: int, upstream: str, reuse_port: bool) -> None:
    app = make_app(upstream)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(host, port, app, reuse_port=reuse_port))
    else:
        uvloop.run(serve(host, port, app, reuse_port=reuse_port))


def _supervise(workers: list[int]) -> None:
    """The parent of ``--workers``: passes SIGTERM/SIGINT on and exits when every worker has."""

    def forward(signum: int, frame: object) -> None:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for pid in workers:
        os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's root URL, e.g. http://127.0.0.1:9000")
    parser.add_argument("--workers", type=int, default=1, help="processes serving the port (SO_REUSEPORT)")
    args = parser.parse_args(argv)
    if args.workers <= 1:
        _run(args.host, args.port, args.upstream, reuse_port=False)
        sys.exit(0)
    workers = []
    for _ in range(args.workers):
        pid = os.fork()
        if pid == 0:  # a worker: serves until SIGTERM or until the parent (its supervisor) dies
            _run(args.host, args.port, args.upstream, reuse_port=True)
            os._exit(0)
        workers.append(pid)
    _supervise(workers)
    sys.exit(0)


if __name__ == "__main__":
    main()
