"""Reading a request body: bounded in size and in time. Its parsing is the dialect's (``Dialect.parse``).

The body is read at most once, bounded by ``max_body_bytes`` (aiohttp's
``client_max_size`` refuses more with 413 before reading it whole; a
Content-Length over the limit is refused before reading anything) and by
``client_timeout``: a client that trickles its body gets a 408 once that many
seconds have passed, however steadily the bytes come. Parsing is
orjson: invalid UTF-8, bad JSON and nesting deeper than orjson's limit all
become 400s, never 500s.

orjson reads up to 1024 levels of nesting but writes only up to 254, and the
proxy writes what it read (message hashes, the session fingerprint, the log,
the body it forwards). So what could nest is written once here, and what cannot
be written is refused as the client's error, before any of that.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from proxy.errors import BadRequest, PayloadTooLarge, RequestTimeout
from proxy.settings import Settings


async def read_body(request: web.Request, settings: Settings) -> bytes:
    limit = settings.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"Request body of {request.content_length} bytes is over the limit of {limit}.")
    try:
        async with asyncio.timeout(settings.client_timeout):
            return await request.read()
    except TimeoutError:
        raise RequestTimeout(f"The request body did not arrive within {settings.client_timeout:g} s.") from None
    except web.RequestPayloadError:  # its text quotes the client's bytes: not repeated
        raise BadRequest("The request body does not match its Content-Encoding or Transfer-Encoding.",
                         code="invalid_body") from None

