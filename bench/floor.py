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

``--log STORE_URL`` makes it **the floor with the log**: the least a proxy that
keeps the design's promises does on this stack, and so the bound of any such
proxy. Of a session new to the process it reads the log first
(``FactLog.first_look``, before the upstream is called: the log read before the
view); it reads the upstream's answer whole, appends the request's new messages
and the reply in one ``FactLog.append`` and only then answers (a reply the
client received is in the log; a stream is relayed as it comes, its last
chunk held until its text is logged). Same store code, Redis client and collector
setting as ctxproxy; no hashing, no token counts, no view, no metrics, no
access log. Chat Completions only; other requests are forwarded as by the plain
floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping

import aiohttp
import orjson
from aiohttp import web

from bench.fakeserver import serve
from proxy.server import tune_gc
from proxy.store import FactLog, NewFact, SessionKey, open_store

#: Per-connection headers (RFC 9110 7.6.1) and the ones aiohttp sets itself for the new message.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "host", "content-length"})

client_key: web.AppKey[aiohttp.ClientSession] = web.AppKey("client", aiohttp.ClientSession)
upstream_key: web.AppKey[str] = web.AppKey("upstream", str)
log_key: web.AppKey[FactLog] = web.AppKey("log", FactLog)
#: Per session known to this process: (the log's next seq, the messages of the conversation it holds).
known_key: web.AppKey[dict[str, tuple[int, int]]] = web.AppKey("known", dict)
#: Entries a first look reads, as ctxproxy's (``proxy.context.log.history.CATCH_UP_PAGE``).
FIRST_LOOK = 1000


def end_to_end(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` less the hop-by-hop ones."""
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


async def forward(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    headers = end_to_end(request.headers)
    url = request.app[upstream_key] + request.path_qs
    async with request.app[client_key].request(request.method, url, data=body, headers=headers) as up:
        resp = web.StreamResponse(status=up.status, reason=up.reason,
                                  headers=end_to_end(up.headers))
        if up.content_length is not None:
            resp.content_length = up.content_length
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp


async def forward_logged(request: web.Request) -> web.StreamResponse:
    """``forward``, with the log: see the module's docstring."""
    body = await request.read()
    log, known = request.app[log_key], request.app[known_key]
    session = request.headers.get("X-Session-Id", "")
    key = SessionKey("floor", session)
    at = known.get(session)
    if at is None:
        looked = await log.first_look(key, FIRST_LOOK, time.time())
        at = (len(looked.facts), sum(1 for f in looked.facts if f.kind == "message"))
    seq, held = at
    parsed = orjson.loads(body)
    messages = parsed["messages"]
    headers = end_to_end(request.headers)
    url = request.app[upstream_key] + request.path_qs
    async with request.app[client_key].request(request.method, url, data=body, headers=headers) as up:
        facts = [NewFact("message", i, "client", m) for i, m in enumerate(messages[held:], held)]
        resp = web.StreamResponse(status=up.status, reason=up.reason,
                                  headers=end_to_end(up.headers))
        if parsed.get("stream"):  # relayed as it comes but for its last chunk; the whole text is the reply
            await resp.prepare(request)
            chunks: list[bytes] = []
            async for chunk in up.content.iter_any():
                if chunks:
                    await resp.write(chunks[-1])
                chunks.append(chunk)
            last = chunks[-1] if chunks else b""
            reply = {"role": "assistant", "content": b"".join(chunks).decode()}
        else:
            last = await up.read()
            reply = orjson.loads(last)["choices"][0]["message"] if up.status == 200 else {}
            resp.content_length = len(last)
        if reply:
            facts.append(NewFact("message", len(messages), "upstream", reply))
        await log.append(key, seq, facts, time.time())  # before the client has the answer's last bytes
        known[session] = (seq + len(facts), held + len(facts))
        if not resp.prepared:
            await resp.prepare(request)
        await resp.write(last)
        await resp.write_eof()
        return resp


async def _client(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                     skip_auto_headers=("User-Agent",),
                                     timeout=aiohttp.ClientTimeout(total=None)) as client:
        app[client_key] = client
        yield


def _log(url: str) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        app[log_key] = await open_store(url)
        app[known_key] = {}
        yield
        await app[log_key].aclose()

    return ctx


def make_app(upstream: str, log: str = "") -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[upstream_key] = upstream.rstrip("/")
    app.cleanup_ctx.append(_client)
    if log:
        app.cleanup_ctx.append(_log(log))
        app.router.add_post("/v1/chat/completions", forward_logged)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def _run(host: str, port: int, upstream: str, reuse_port: bool, log: str = "") -> None:
    if log:  # ctxproxy's collector setting: the bound gets every advantage ctxproxy has
        tune_gc()
    app = make_app(upstream, log)
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
    parser.add_argument("--log", default="", help="a --store URL: the floor with the log (see above)")
    args = parser.parse_args(argv)
    if args.log and args.workers > 1:  # each worker would keep its own seqs of the sessions, and conflict
        parser.error("--log serves from one process only")
    if args.workers <= 1:
        _run(args.host, args.port, args.upstream, reuse_port=False, log=args.log)
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
