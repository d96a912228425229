"""Relaying the upstream's answer to a chat request, and capturing the assistant reply on the side.

Streams are relayed event by event the moment each event is complete: nothing
waits for the end of the stream. Two events are held back or hidden: the
usage-only chunk the proxy asked for on the client's behalf (the client did not
ask for it, so it must not see it), and ``[DONE]``, which is written only after
the reply has been logged, so a client that sends its next request the instant
the stream ends always finds its previous reply in the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.errors import UpstreamError
from proxy.sse import (
    EventTooLarge,
    SSEEvent,
    SSESplitter,
    StreamAssembler,
    is_usage_only,
    message_from_completion,
    parse_event,
)
from proxy.types import Message
from proxy.upstream import response_headers

logger = logging.getLogger(__name__)

#: Called once with the assembled reply (or None), its usage, and whether it is complete.
ReplySink = Callable[[Message | None, dict[str, Any] | None, bool], Awaitable[None]]


@dataclass
class RelayTiming:
    """Seconds spent waiting on the upstream, so the proxy's own share can be told apart."""

    upstream: float = 0.0
    _mark: float = field(default_factory=time.perf_counter)

    def wait_started(self) -> None:
        self._mark = time.perf_counter()

    def wait_ended(self) -> None:
        self.upstream += time.perf_counter() - self._mark


async def read_whole(resp: aiohttp.ClientResponse, timing: RelayTiming) -> bytes:
    timing.wait_started()
    body = await resp.read()
    timing.wait_ended()
    return body


async def read_first_event(resp: aiohttp.ClientResponse, timing: RelayTiming,
                           limit: int) -> tuple[list[bytes], SSEEvent | None]:
    """Read until the first event that carries data, so an error in it can still be retried unseen.

    What is held meanwhile is bounded by ``limit``; past it nothing has reached
    the client yet, so the request fails as a 502.
    """
    splitter = SSESplitter(limit)
    chunks: list[bytes] = []
    held = 0
    timing.wait_started()
    try:
        async for chunk in resp.content.iter_any():
            chunks.append(chunk)
            held += len(chunk)
            too_large: EventTooLarge | None = None
            try:
                events = splitter.feed(chunk)
            except EventTooLarge as exc:  # an event with data before it still goes out, up to the cut
                events, too_large = exc.events, exc
            for raw in events:
                event = parse_event(raw)
                if event is not None and event.data:
                    return chunks, event
            if too_large is not None or held > limit:
                raise UpstreamError(f"The upstream sent over {limit} bytes (--max-event-bytes) without an event "
                                    "to relay.", code="upstream_event_too_large")
        return chunks, None
    finally:
        timing.wait_ended()


async def relay_whole(resp: aiohttp.ClientResponse, body: bytes, extra_headers: dict[str, str], sink: ReplySink,
                      ) -> web.Response:
    """A non-streaming answer (or any error), already read: log the reply, relay it byte for byte."""
    if resp.status == 200 and resp.content_type == "application/json":
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            message, usage = message_from_completion(parsed)
            if message is not None:
                await sink(message, usage, True)
    headers = response_headers(resp.headers, decoded=True)
    headers.update(extra_headers)
    return web.Response(status=resp.status, headers=headers, body=body)


class _StreamRelay:
    """A relayed stream: cut into events, each written to the client; the reply assembled on the side, logged once."""

    def __init__(self, out: web.StreamResponse, sink: ReplySink, hide_usage: bool, limit: int) -> None:
        self.out = out
        self.splitter = SSESplitter(limit)
        self.sink = sink
        self.hide_usage = hide_usage
        self.assembler = StreamAssembler()
        self.received = False  # whether any completion chunk arrived: an empty stream logs no reply
        self.logged = False

    async def forward(self, chunk: bytes) -> None:
        """Relay the events ``chunk`` completes; ``EventTooLarge`` after relaying those before the long one."""
        try:
            events = self.splitter.feed(chunk)
        except EventTooLarge as exc:
            await self._relay(exc.events)
            raise
        await self._relay(events)

    async def _relay(self, events: list[bytes]) -> None:
        for raw in events:
            relay, done = self.inspect(raw)
            if done:
                await self.log(True)
            if relay:
                await self.out.write(raw)

    def inspect(self, raw: bytes) -> tuple[bool, bool]:
        """Whether to relay this raw event, and whether it is ``[DONE]``."""
        event = parse_event(raw)
        if event is None or not event.data:
            return True, False
        if event.is_done:
            return True, True
        obj = _json_or_none(event.data)
        if isinstance(obj, dict):
            self.received = self.received or bool(obj.get("choices"))
            self.assembler.feed(obj)
            if self.hide_usage and is_usage_only(obj):
                return False, False
        return True, False

    async def log(self, complete: bool) -> None:
        if self.logged:
            return
        self.logged = True
        message = self.assembler.message() if self.received else None
        await self.sink(message, self.assembler.usage, complete and self.assembler.finished)


async def relay_stream(request: web.Request, resp: aiohttp.ClientResponse, extra_headers: dict[str, str],
                       sink: ReplySink, timing: RelayTiming, *, hide_usage: bool,
                       prefix: list[bytes], limit: int) -> web.StreamResponse:
    """Relay an SSE stream as it arrives; log the assembled reply before ``[DONE]`` reaches the client.

    ``prefix`` holds the chunks already read to look at the first event; they go out first.
    An event longer than ``limit`` bytes ends the stream as an upstream failure does.
    """
    headers = response_headers(resp.headers, decoded=True)
    headers.update(extra_headers)
    out = web.StreamResponse(status=resp.status, headers=headers)
    relay = _StreamRelay(out, sink, hide_usage, limit)

    try:
        await out.prepare(request)
        for chunk in prefix:
            await relay.forward(chunk)
        timing.wait_started()
        async for chunk in resp.content.iter_any():
            timing.wait_ended()
            await relay.forward(chunk)
            timing.wait_started()
        timing.wait_ended()
        tail = relay.splitter.flush()
        if tail:
            await out.write(tail)
        await relay.log(True)
        await out.write_eof()
    except (asyncio.CancelledError, ConnectionResetError):
        # The client went away: the upstream request is closed by our caller; keep what arrived, as partial.
        await asyncio.shield(relay.log(False))
        raise
    except (TimeoutError, aiohttp.ClientError, EventTooLarge) as exc:
        # The upstream broke mid-stream. Headers are sent, so no error status is possible: keep the partial
        # reply and cut the client's connection, so it sees a truncated stream rather than a clean end.
        if isinstance(exc, EventTooLarge):
            logger.warning("cutting a stream from the upstream: %s, over --max-event-bytes", exc)
        await asyncio.shield(relay.log(False))
        if request.transport is not None:
            request.transport.close()
    return out


def _json_or_none(data: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
