"""Relaying the upstream's answer to a front door's request, and capturing the reply on the side.

Streams are relayed event by event the moment each event is complete: nothing
waits for the end of the stream. The dialect's ``ReplyReader`` reads a copy of
each event; two kinds are held back or hidden: what the proxy asked for on the
client's behalf (Chat's usage-only chunk: the client did not ask for it, so it
must not see it), and the terminal event (``[DONE]``, ``response.completed``,
``message_stop``), written only after the reply has been logged, so a client
that sends its next request the instant the stream ends always finds its
previous reply in the log. Before relaying begins, the events that commit
nothing (``response.created``, ``message_start``) are held, so an overflow
error that follows them can still be retried unseen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.context.items import Item
from proxy.dialects.base import Dialect, ReplyReader, Verdict, answered_model
from proxy.errors import UpstreamError
from proxy.overflow import Overflow, classify_sse_event
from proxy.sse import EventTooLarge, SSESplitter, looks_like_sse, parse_event
from proxy.upstream import response_headers

logger = logging.getLogger(__name__)

#: Bytes read at most to tell an event stream sent under another content type from a body (whitespace only).
SNIFF_BYTES = 4096

#: Called once with the reply's items (none: nothing to log), its usage, whether it is complete, its id
#: (``Dialect.reply_id``) and the model the upstream answered with (``answered_model``; None: it named none).
ReplySink = Callable[[list[Item], dict[str, Any] | None, bool, str | None, str | None], Awaitable[None]]


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


async def answers_stream(resp: aiohttp.ClientResponse, timing: RelayTiming, asked: bool) -> tuple[bool, bytes]:
    """Whether to relay the answer as an event stream, and the bytes read to tell (they come first).

    Only a 200 to a request that asked to stream is one. ``text/event-stream``
    says so; under any other content type (the ChatGPT Codex backend sends
    none) the first bytes tell (``looks_like_sse``): an event stream is relayed
    as one, event by event, and logged; a JSON body stays a body.
    """
    if not asked or resp.status != 200:
        return False, b""
    if resp.content_type == "text/event-stream":
        return True, b""
    head = b""
    timing.wait_started()
    try:
        while (verdict := looks_like_sse(head)) is None and len(head) < SNIFF_BYTES:
            chunk = await resp.content.readany()
            if not chunk:
                break
            head += chunk
    finally:
        timing.wait_ended()
    return verdict is True, head


def event_data(text: str) -> Any:
    """An event's data, decoded when it is JSON, else the text itself (``[DONE]``, an old llama.cpp error)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


async def _chunks(resp: aiohttp.ClientResponse, head: bytes) -> AsyncIterator[bytes]:
    if head:
        yield head
    async for chunk in resp.content.iter_any():
        yield chunk


async def read_until_commit(resp: aiohttp.ClientResponse, timing: RelayTiming, limit: int,
                            dialect: Dialect, head: bytes = b"") -> tuple[list[bytes], Overflow | None]:
    """Read until an event that commits the answer (``Dialect.commits``), or an overflow before one.

    ``head`` is what was read of the stream already (``answers_stream``). Returns
    the chunks read (to be relayed first) and the overflow, if one of the
    withheld events was the upstream saying the prompt is too long. What is held
    meanwhile is bounded by ``limit``; past it nothing has reached the client
    yet, so the request fails as a 502.
    """
    splitter = SSESplitter(limit)
    chunks: list[bytes] = []
    held = 0
    timing.wait_started()
    try:
        async for chunk in _chunks(resp, head):
            chunks.append(chunk)
            held += len(chunk)
            too_large: EventTooLarge | None = None
            try:
                events = splitter.feed(chunk)
            except EventTooLarge as exc:  # an event with data before it still goes out, up to the cut
                events, too_large = exc.events, exc
            for raw in events:
                event = parse_event(raw)
                if event is None or not event.data:
                    continue
                data = event_data(event.data)
                refusal = dialect.refusal_of(data)
                overflow = classify_sse_event(event.data if refusal is data else orjson.dumps(refusal))
                if overflow is not None:
                    return chunks, overflow
                if dialect.commits(data):
                    return chunks, None
            if too_large is not None or held > limit:
                raise UpstreamError(f"The upstream sent over {limit} bytes (--max-event-bytes) without an event "
                                    "to relay.", code="upstream_event_too_large")
        return chunks, None
    finally:
        timing.wait_ended()


async def relay_whole(resp: aiohttp.ClientResponse, body: bytes, extra_headers: dict[str, str], sink: ReplySink,
                      dialect: Dialect) -> web.Response:
    """A non-streaming answer (or any error), already read: log the reply, relay it byte for byte."""
    if resp.status == 200 and resp.content_type == "application/json":
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        items, usage, _ = dialect.reply_from_json(parsed)
        if items:
            await sink(items, usage, True, dialect.reply_id(parsed) if isinstance(parsed, dict) else None,
                       answered_model(parsed))
    headers = response_headers(resp.headers, decoded=True)
    headers.update(extra_headers)
    return web.Response(status=resp.status, headers=headers, body=body)


class _StreamRelay:
    """A relayed stream: cut into events, each written to the client; the reply read on the side, logged once."""

    def __init__(self, out: web.StreamResponse, sink: ReplySink, reader: ReplyReader, limit: int) -> None:
        self.out = out
        self.splitter = SSESplitter(limit)
        self.sink = sink
        self.reader = reader
        self.logged = False
        #: The model the upstream's events name (the first that names one).
        self.model: str | None = None

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
            event = parse_event(raw)
            verdict = Verdict.RELAY
            if event is not None and event.data:
                data = event_data(event.data)
                verdict = self.reader.feed(event.event, data)
                if self.model is None:
                    self.model = answered_model(data)
            if verdict is Verdict.TERMINAL:
                await self.log(True)
            if verdict is not Verdict.HIDE:
                await self.out.write(raw)

    async def log(self, complete: bool) -> None:
        if self.logged:
            return
        self.logged = True
        reader = self.reader
        await self.sink(reader.items() if reader.received else [], reader.usage, complete and reader.finished,
                        reader.reply_id, self.model)


async def relay_stream(request: web.Request, resp: aiohttp.ClientResponse, extra_headers: dict[str, str],
                       sink: ReplySink, timing: RelayTiming, *, reader: ReplyReader,
                       prefix: list[bytes], limit: int) -> web.StreamResponse:
    """Relay an SSE stream as it arrives; log the reply before the terminal event reaches the client.

    ``prefix`` holds the chunks already read to look at the first event; they go out first.
    An event longer than ``limit`` bytes ends the stream as an upstream failure does.
    """
    headers = response_headers(resp.headers, decoded=True)
    headers.update(extra_headers)
    out = web.StreamResponse(status=resp.status, headers=headers)
    relay = _StreamRelay(out, sink, reader, limit)

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
