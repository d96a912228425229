"""``POST /v1/chat/completions``: sync the log, build the view, forward, relay, log the reply.

When the upstream refuses the prompt as too long (recognised by
``proxy.overflow`` in the error body, or in the first event of a stream, before
anything reached the client), the turn compacts harder and retries, at most
``reactive_retries`` times; then the client gets the upstream's first refusal,
status and body unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.constants import HEADER_COMPACTED, HEADER_OVERHEAD, HEADER_SESSION, HEADER_VIEW_TOKENS
from proxy.context.budget import requested_output_tokens, retry_limit
from proxy.context.engine import ContextEngine, PreparedView
from proxy.context.lineage import ConversationState
from proxy.context.messages import message_hash
from proxy.context.summarizer import SummaryAnswer
from proxy.errors import ProxyError, StoreError
from proxy.http.body import ChatRequest, parse_chat, read_body
from proxy.http.relay import RelayTiming, read_first_event, read_whole, relay_stream, relay_whole
from proxy.keys import client_key, engine_key, history_key, metrics_key, settings_key
from proxy.metrics import Metrics
from proxy.overflow import Overflow, classify_overflow, classify_sse_event
from proxy.sessions import credential, explicit_session, fingerprint_session, tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from proxy.store.codec import check_encodable
from proxy.summarycall import summary_completer
from proxy.types import Message
from proxy.upstream import client_timeout, map_upstream_errors, request_headers, response_headers

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("proxy.access")


@dataclass
class Refusal:
    """The upstream's first too-long answer, relayed unchanged if no retry rescues the request."""

    status: int
    headers: Any
    body: bytes


@dataclass
class ChatTurn:
    """One request's journey; holds what the reply sink and the retries need."""

    request: web.Request
    chat: ChatRequest
    key: SessionKey
    hashes: list[str]
    state: ConversationState | None
    settings: Settings
    metrics: Metrics
    engine: ContextEngine
    timing: RelayTiming = field(default_factory=RelayTiming)
    status: int = 502
    refusal: Refusal | None = None
    attempts: int = 0

    @property
    def inject_usage(self) -> bool:
        options = self.chat.payload.get("stream_options")
        return self.chat.stream and not (isinstance(options, dict) and options.get("include_usage") is True)

    def upstream_body(self, view: PreparedView) -> bytes:
        """The client's bytes when nothing changes; otherwise the payload with only what must change."""
        if not view.changed and not self.inject_usage:
            return self.chat.raw
        payload: dict[str, Any] = dict(self.chat.payload)
        payload["messages"] = view.messages
        if self.inject_usage:
            options = payload.get("stream_options")
            payload["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        return orjson.dumps(payload)

    def sink_for(self, view: PreparedView) -> Any:
        history = self.request.app[history_key]
        messages, hashes = self.chat.messages, self.hashes
        last = view.messages[-1]
        view_info = {"key": view.view_key, "length": len(view.messages),
                     "last": hashes[-1] if last is messages[-1] else message_hash(last)}

        async def sink(reply: Message | None, usage: dict[str, Any] | None, complete: bool) -> None:
            if reply is None:
                return
            extra: dict[str, Any] = {"view": view_info}
            if usage is not None:
                extra["usage"] = usage
            if not complete:
                extra["partial"] = True
            try:
                check_encodable(reply, extra)  # an unwritable reply is refused here, never kept for a retry
                await history.sync(self.key, [*messages, reply], [*hashes, message_hash(reply)],
                                   upstream_from=len(messages), extra_upstream=extra)
            except StoreError as exc:
                self.metrics.store_errors.inc()
                logger.warning("store error while logging the reply of session %s: %s", self.key.session, exc)

        return sink

    def headers(self, view: PreparedView, started: float) -> dict[str, str]:
        overhead = (time.perf_counter() - started - self.timing.upstream) * 1000
        return {HEADER_SESSION: self.key.session, HEADER_COMPACTED: view.compacted,
                HEADER_VIEW_TOKENS: str(view.estimate.tokens), HEADER_OVERHEAD: f"{overhead:.2f}"}

    async def rescue(self, overflow: Overflow, refused: PreparedView) -> PreparedView | None:
        """Compact harder after a too-long refusal; the new view, or None when nothing can be done.

        Each attempt is one level harder: the compactor halves the retained tail
        and its rounds per level, down to the split-inside-a-round minimum. The
        retry must also come in under what was refused (``retry_limit``), with
        tool results clipped if that is what it takes, so a view that compaction
        cannot shrink (one huge result in the last step) still gets through.
        """
        self.attempts += 1
        attempt = self.attempts
        if attempt > self.settings.reactive_retries:
            return None
        model = self.chat.model or ""
        if overflow.limit_tokens is not None:
            self.engine.learn_window(model, overflow.limit_tokens)
        window = self.engine.window_for(model)
        max_output = requested_output_tokens(self.chat.payload)
        compacted = False
        if self.state is not None:  # without a state the store is down: no compaction, clipping still helps
            result, state = await self.engine.compact(self.key, self.chat.messages, self.hashes, trigger="reactive",
                                                      model=model, complete=self.summarise, window=window,
                                                      level=attempt, tools=self.tools, max_output=max_output)
            compacted = result.outcome == "ok"
            self.state = state if state is not None else self.state
        limit = retry_limit(self.engine.policy(window).hard_limit(max_output), refused.estimate.tokens)
        view = self.engine.view(self.chat.messages, self.hashes, self.state, window=window, tools=self.tools,
                                max_output=max_output, compacted="reactive", limit=limit)
        if not compacted and not view.estimate.tokens < refused.estimate.tokens:
            self.metrics.reactive_retries.labels(outcome="failed").inc()
            return None
        return view

    async def summarise(self, messages: list[Message], max_tokens: int) -> SummaryAnswer:
        """The summary call, as the caller; its headers are built only when a compaction needs them."""
        complete = summary_completer(self.request.app[client_key], self.settings, self.request.headers,
                                     self.settings.summary_model or self.chat.model or "")
        return await complete(messages, max_tokens)

    @property
    def tools(self) -> list[Any] | None:
        tools = self.chat.payload.get("tools")
        return tools if isinstance(tools, list) else None


async def _send(turn: ChatTurn, view: PreparedView, started: float) -> web.StreamResponse | Overflow:
    """One upstream attempt: the response to give the client, or the upstream's too-long refusal."""
    settings = turn.settings
    client = turn.request.app[client_key]
    headers = request_headers(turn.request.headers, settings, identity=True)
    url = settings.upstream_base + "/chat/completions"
    async with map_upstream_errors():
        turn.timing.wait_started()
        async with client.post(url, data=turn.upstream_body(view), headers=headers,
                               timeout=client_timeout(settings)) as resp:
            turn.timing.wait_ended()
            turn.status = resp.status
            streaming = turn.chat.stream and resp.status == 200 and resp.content_type == "text/event-stream"
            if streaming:
                prefix, first = await read_first_event(resp, turn.timing, settings.max_event_bytes)
                overflow = classify_sse_event(first.data) if first is not None else None
                if overflow is None:
                    return await relay_stream(turn.request, resp, turn.headers(view, started), turn.sink_for(view),
                                              turn.timing, hide_usage=turn.inject_usage, prefix=prefix,
                                              limit=settings.max_event_bytes)
                body = b"".join(prefix) + await read_whole(resp, turn.timing)
            else:
                body = await read_whole(resp, turn.timing)
                overflow = classify_overflow(resp.status, body, resp.headers) if resp.status != 200 else None
            if overflow is not None:
                if turn.refusal is None:
                    turn.refusal = Refusal(resp.status, resp.headers.copy(), body)
                return overflow
            return await relay_whole(resp, body, turn.headers(view, started), turn.sink_for(view))


def _refuse(turn: ChatTurn, view: PreparedView, started: float) -> web.Response:
    """The upstream's first too-long answer, as it sent it: no retry could rescue the request."""
    if turn.refusal is None:
        raise RuntimeError("no refusal to relay")
    headers = response_headers(turn.refusal.headers, decoded=True)
    headers.update(turn.headers(view, started))
    turn.status = turn.refusal.status
    return web.Response(status=turn.refusal.status, headers=headers, body=turn.refusal.body)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    app = request.app
    settings, metrics, history, engine = app[settings_key], app[metrics_key], app[history_key], app[engine_key]

    chat = parse_chat(await read_body(request, settings))  # the client key is checked already (proxy.http.clients)
    key_text = credential(request.headers)
    session = explicit_session(request.match_info.get("session"), request.headers) or fingerprint_session(
        chat.messages
    )
    key = SessionKey(tenant_of(key_text), session)
    metrics.session_seen(key)
    hashes = history.hashes_for(key, chat.messages, len(chat.raw))
    # The request's messages are logged together with the reply (one append per step, after the upstream
    # answered); the view needs only the session's checkpoint, which the cached state has.
    state: ConversationState | None = None
    try:
        state = await history.state(key)  # the cached state; the log is read only for a session new here
    except StoreError as exc:
        metrics.store_errors.inc()
        logger.warning("store error while reading session %s: %s", session, exc)
    turn = ChatTurn(request, chat, key, hashes, state, settings, metrics, engine)
    model = chat.model or ""
    view: PreparedView | None = None  # for the access line when the request fails before a view exists
    try:
        view = await engine.prepare(
            key, chat.messages, hashes, state, model=model, tools=turn.tools,
            max_output=requested_output_tokens(chat.payload),
            complete=turn.summarise,
        )
        while True:
            outcome = await _send(turn, view, started)
            if isinstance(outcome, web.StreamResponse):
                if view.compacted == "reactive":
                    metrics.reactive_retries.labels(outcome="ok").inc()
                return outcome
            retry = await turn.rescue(outcome, view)  # the refused response is closed: no connection held meanwhile
            if retry is None:
                return _refuse(turn, view, started)
            view = retry
    except ProxyError as exc:
        turn.status = exc.status
        raise
    except asyncio.CancelledError:
        turn.status = 499  # the client went away (nginx's convention): not an upstream failure
        raise
    except Exception:
        turn.status = 500
        raise
    finally:
        total = time.perf_counter() - started
        upstream = turn.timing.upstream
        metrics.requests.labels(route="chat", status=str(turn.status)).inc()
        metrics.upstream_seconds.observe(upstream)
        metrics.overhead_seconds.observe(max(total - upstream, 0.0))
        access_logger.info(
            "chat session=%s status=%s upstream_ms=%.1f proxy_ms=%.2f",
            session, turn.status, upstream * 1000, (total - upstream) * 1000,
            extra={"fields": {
                "event": "chat", "session": session, "tenant": key.tenant, "status": turn.status,
                "view_tokens": view.estimate.tokens if view is not None else None,
                "compacted": view.compacted if view is not None else None,
                "upstream_ms": round(upstream * 1000, 1), "overhead_ms": round((total - upstream) * 1000, 2),
            }},
        )

