"""A recording tap between a real agent and the proxy: a real aiohttp server that forwards every request.

The proxy's own log cannot be the witness of what the client sent (that is what
is being tested), and the fake upstream only sees what the proxy forwards; the
tap sits in front of the proxy and keeps, per request, the bytes the agent sent
and the status, headers and bytes it got back. It changes nothing: bodies pass
through byte for byte (no decompression either way) and answers are streamed
back as they arrive, so a streaming agent behaves exactly as it would against
the proxy itself. Hop-by-hop headers are dropped, as any proxy does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

#: Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus those aiohttp sets itself.
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
                  "host", "content-length"})


@dataclass
class Exchange:
    """One request as the agent sent it and the answer it received."""

    method: str
    path_qs: str
    headers: CIMultiDict[str]
    body: bytes
    status: int = 0
    response_headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    response: bytes = b""

    def json(self) -> Any:
        return orjson.loads(self.body)


class Tap:
    """Forwards everything to ``target`` (a base URL without a trailing slash) and records it in ``exchanges``;
    the headers named in ``drop`` (lower case) are recorded but not forwarded, to show the proxy a client that
    does not send them."""

    def __init__(self, target: str, drop: frozenset[str] = frozenset()) -> None:
        self.target = target.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.drop = drop

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.cleanup_ctx.append(self._client)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app

    async def _client(self, app: web.Application) -> Any:
        async with aiohttp.ClientSession(auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                         skip_auto_headers=("User-Agent", "Accept-Encoding")) as client:
            self.client = client
            yield

    async def forward(self, request: web.Request) -> web.StreamResponse:
        exchange = Exchange(request.method, request.path_qs, CIMultiDict(request.headers), await request.read())
        self.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP | self.drop}
        async with self.client.request(request.method, self.target + request.path_qs, headers=headers,
                                       data=exchange.body, allow_redirects=False) as upstream:
            exchange.status = upstream.status
            exchange.response_headers = CIMultiDict(upstream.headers)
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP})
            await response.prepare(request)
            received = bytearray()
            async for chunk in upstream.content.iter_any():
                received += chunk
                await response.write(chunk)
            exchange.response = bytes(received)
            await response.write_eof()
            return response
