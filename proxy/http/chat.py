"""``POST /v1/chat/completions``: sync the log, build the view, forward, relay, log the reply."""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from aiohttp import web

from proxy.constants import HEADER_COMPACTED, HEADER_OVERHEAD, HEADER_SESSION, HEADER_VIEW_TOKENS
from proxy.context.history import HistoryManager
from proxy.context.messages import message_hash, text_length
from proxy.errors import ProxyError, StoreError
from proxy.http.body import ChatRequest, parse_chat, read_body
from proxy.http.relay import RelayTiming, is_event_stream, relay_stream, relay_whole
from proxy.keys import client_key, history_key, metrics_key, settings_key
from proxy.metrics import Metrics
from proxy.sessions import check_client_key, credential, explicit_session, fingerprint_session, tenant_of
from proxy.store.base import SessionKey
from proxy.types import Message
from proxy.upstream import client_timeout, map_upstream_errors, request_headers

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("proxy.access")


def _upstream_body(chat: ChatRequest, view: list[Message] | None, inject_usage: bool) -> bytes:
    """The client's bytes when nothing changes; otherwise the payload with only what must change."""
    if view is None and not inject_usage:
        return chat.raw
    payload: dict[str, Any] = dict(chat.payload)
    if view is not None:
        payload["messages"] = view
    if inject_usage:
        options = payload.get("stream_options")
        payload["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return orjson.dumps(payload)


def _wants_usage(chat: ChatRequest) -> bool:
    options = chat.payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


async def _sync(history: HistoryManager, metrics: Metrics, key: SessionKey, messages: list[Message],
                hashes: list[str]) -> None:
    try:
        await history.sync(key, messages, hashes)
    except StoreError as exc:
        metrics.store_errors.inc()
        logger.warning("store error while logging the request of session %s: %s", key.session, exc)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    settings = request.app[settings_key]
    metrics = request.app[metrics_key]
    history = request.app[history_key]

    raw = await read_body(request, settings.max_body_bytes)
    chat = parse_chat(raw)
    key_text = credential(request.headers)
    check_client_key(key_text, settings.client_keys)
    session = explicit_session(request.match_info.get("session"), request.headers) or fingerprint_session(
        chat.messages
    )
    key = SessionKey(tenant_of(key_text), session)
    metrics.session_seen(key)

    hashes = [message_hash(m) for m in chat.messages]
    await _sync(history, metrics, key, chat.messages, hashes)

    view: list[Message] | None = None
    compacted = "none"
    estimate = sum(text_length(m) for m in chat.messages) // 3

    inject_usage = chat.stream and not _wants_usage(chat)
    body = _upstream_body(chat, view, inject_usage)
    timing = RelayTiming()

    async def sink(reply: Message | None, usage: dict[str, Any] | None, complete: bool) -> None:
        if reply is None:
            return
        extra: dict[str, Any] = {}
        if usage is not None:
            extra["usage"] = usage
        if not complete:
            extra["partial"] = True
        try:
            await history.sync(key, [*chat.messages, reply], [*hashes, message_hash(reply)],
                               upstream_from=len(chat.messages), extra_upstream=extra)
        except StoreError as exc:
            metrics.store_errors.inc()
            logger.warning("store error while logging the reply of session %s: %s", key.session, exc)

    extra_headers = {HEADER_SESSION: session, HEADER_COMPACTED: compacted, HEADER_VIEW_TOKENS: str(estimate)}
    url = settings.upstream_base + "/chat/completions"
    headers = request_headers(request.headers, settings, identity=True)
    client = request.app[client_key]
    status = 502
    try:
        async with map_upstream_errors():
            timing.wait_started()
            async with client.post(url, data=body, headers=headers, timeout=client_timeout(settings)) as resp:
                timing.wait_ended()
                status = resp.status
                extra_headers[HEADER_OVERHEAD] = f"{(time.perf_counter() - started - timing.upstream) * 1000:.2f}"
                if is_event_stream(resp) and chat.stream:
                    return await relay_stream(request, resp, extra_headers, sink, timing, hide_usage=inject_usage)
                return await relay_whole(resp, extra_headers, sink, timing)
    except ProxyError as exc:
        status = exc.status
        raise
    finally:
        total = time.perf_counter() - started
        metrics.requests.labels(route="chat", status=str(status)).inc()
        metrics.upstream_seconds.observe(timing.upstream)
        metrics.overhead_seconds.observe(max(total - timing.upstream, 0.0))
        access_logger.info(
            "chat session=%s status=%s upstream_ms=%.1f proxy_ms=%.2f",
            session, status, timing.upstream * 1000, (total - timing.upstream) * 1000,
        )
