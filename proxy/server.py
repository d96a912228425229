"""Serving the app: what ``web.run_app`` does, with aiohttp's own protocol errors in OpenAI's shape.

aiohttp answers a request it cannot parse (a control character or an
oversized line in the head, a malformed chunked body…) itself, before any
middleware runs: in text/plain that quotes the offending bytes, with an error
log line that quotes them too, and those bytes may hold a key. ``run_app`` has
no hook for that answer, so ``run`` does what it does (an ``AppRunner``, one
``TCPSite``, SIGINT and SIGTERM for a graceful stop, then every task
cancelled and the loop closed) with a runner whose connections are handled by
``_RequestHandler``: its ``handle_error`` answers in OpenAI's error shape,
quotes nothing, and logs the error's class and status only.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError
from aiohttp.web_request import BaseRequest

from proxy.preflight import cannot_listen
from proxy.settings import Settings

#: Allocations (net of frees) between two collections of the youngest generation; CPython's default is 700.
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Collect cyclic garbage less often than CPython does by default, for a process that builds large JSON trees.

    Reading a long log or a large request allocates millions of objects that
    live on; at the default threshold (700) the collector ran so often over
    them that it took about 60 % of decoding 40,000 log entries, and the
    inspector's first look at such a session took 1.37-1.49 s against
    0.90-1.53 s (about 1.1 s typical) at 10,000 (docs/BENCHMARKS.md). The
    older generations keep their defaults, so garbage in cycles is still
    collected within a few requests.
    """
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (Linux, macOS): about 10 % less CPU per proxied request."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _RequestHandler(web.RequestHandler):
    """aiohttp's connection handler, but errors it answers itself are OpenAI-shaped and quote no request bytes."""

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0 or (status >= 500 and not isinstance(exc, HttpProcessingError)):
            # A response under way (aiohttp cuts the connection), or a failure of ours: aiohttp's own handling,
            # whose log line then holds a traceback of our code, not the client's bytes.
            return super().handle_error(request, status, exc, message)
        name = type(exc).__name__ if exc is not None else HTTPStatus(status).phrase
        # A bad method on a connection's first request is mostly TLS or a scanner on the HTTP port (aiohttp's view).
        log = self.logger.debug if isinstance(exc, BadHttpMethod) and self._request_count == 1 else self.logger.info
        log("refused a request from %s that is not valid HTTP: %s (%d)", request.remote, name, status)
        body = {"error": {"message": f"The request is not valid HTTP ({name}).",
                          "type": "invalid_request_error" if status < 500 else "proxy_error",
                          "param": None, "code": "invalid_http_request"}}
        response = web.json_response(body, status=status)
        response.force_close()
        return response


class _Server(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _RequestHandler(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    """``AppRunner`` serving through ``_Server``; the keyword arguments are the ones ``run`` passes."""

    def __init__(self, app: web.Application, settings: Settings, *, handle_signals: bool = True) -> None:
        self._handler_args: dict[str, Any] = {"keepalive_timeout": settings.client_timeout, "access_log": None}
        super().__init__(app, handle_signals=handle_signals, handler_cancellation=True, **self._handler_args)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # starts the app
        return _Server(server.request_handler, request_factory=server.request_factory,
                       handler_cancellation=server.handler_cancellation, loop=asyncio.get_running_loop(),
                       **self._handler_args)


async def _serve(app: web.Application, settings: Settings, reuse_port: bool,
                 on_listening: Callable[[], None] | None) -> None:
    runner = _Runner(app, settings)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, settings.host, settings.port, reuse_port=reuse_port).start()
        except OSError as exc:
            raise cannot_listen(settings, exc) from None
        if on_listening is not None:
            on_listening()
        await asyncio.Event().wait()  # until SIGINT or SIGTERM raises GracefulExit out of the loop
    finally:
        await runner.cleanup()  # in-flight requests get aiohttp's graceful shutdown (60 s)


@contextlib.asynccontextmanager
async def serving(app: web.Application, settings: Settings) -> AsyncIterator[str]:
    """``app`` served on a free loopback port while the block runs, its root URL yielded; signals are left to
    the caller (``ctxproxy run`` passes them to the agent)."""
    tune_gc()
    runner = _Runner(app, settings, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def run(app: web.Application, settings: Settings, *, reuse_port: bool = False,
        on_listening: Callable[[], None] | None = None) -> None:
    """Serve ``app`` on ``settings.host:settings.port`` until SIGINT or SIGTERM, as ``web.run_app`` would;
    ``on_listening`` is called once the socket is bound (a port in use raises ``StartupError`` instead)."""
    tune_gc()
    loop = event_loop()
    main = loop.create_task(_serve(app, settings, reuse_port, on_listening))
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        if not main.done():
            main.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(main)
        rest = asyncio.all_tasks(loop)
        for task in rest:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
