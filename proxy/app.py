"""``create_app(settings)``: routes and resource lifecycles, opening nothing until the app starts.

Each resource has its own single-yield cleanup context, in dependency order:
the upstream HTTP client, then the store (and the HistoryManager over it, whose
background retries are cancelled before the store closes).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from proxy.compactions import RecentCompactions
from proxy.context.compactor import CompactionResult
from proxy.context.engine import ContextEngine, EngineSettings
from proxy.context.log.history import HistoryManager
from proxy.context.view.tokens import bundled_encoding
from proxy.context.view.window import bundled_model_map
from proxy.dialects import CHAT, MESSAGES, RESPONSES
from proxy.http import admin, counts, gemini, health, passthrough, ui
from proxy.http.accesslog import operator_access_middleware
from proxy.http.clients import client_key_middleware, open_route
from proxy.http.continuity import Links
from proxy.http.frontdoor import compact_endpoint, front_door
from proxy.http.middleware import error_middleware, remember_prepared
from proxy.keys import (
    client_key,
    compactions_key,
    engine_key,
    history_key,
    links_key,
    metrics_key,
    prefixes_key,
    savings_key,
    secret_key,
    settings_key,
    store_key,
    throttle_key,
    timelines_key,
    tracing_key,
)
from proxy.metrics import Metrics
from proxy.prefixes import PrefixTracker
from proxy.savings import SavingsCache
from proxy.secret import ServerSecret
from proxy.settings import Settings
from proxy.store import open_store
from proxy.store.base import SessionKey
from proxy.throttle import FailureThrottle
from proxy.tracing import Tracing, open_tracing
from proxy.ui.timeline import TimelineCache


async def _upstream_client(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
    async with aiohttp.ClientSession(
        connector=connector, auto_decompress=True, timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=("User-Agent",), cookie_jar=aiohttp.DummyCookieJar(),
    ) as client:
        app[client_key] = client
        yield


async def _store(app: web.Application) -> AsyncIterator[None]:
    settings, metrics = app[settings_key], app[metrics_key]
    store = await open_store(settings.store)
    app[store_key] = store
    app[secret_key] = ServerSecret(settings.secret, store)
    app[links_key] = Links()
    history = HistoryManager(store, clock=time.time, on_append=metrics.facts_appended,
                             on_error=metrics.store_errors.inc, state_bytes=settings.state_cache_bytes)
    app[history_key] = history
    compactions, tracing = app[compactions_key], app[tracing_key]

    def observe(key: SessionKey, trigger: str, result: CompactionResult, seconds: float) -> None:
        metrics.compaction_done(trigger, result, seconds)
        compactions.record(key, trigger, result, seconds)
        tracing.compaction(key, trigger, result, seconds)

    engine = ContextEngine(history, engine_settings(settings), observer=observe,
                           wait_observer=metrics.compaction_wait_seconds.observe)
    app[engine_key] = engine
    timelines = app[timelines_key]
    metrics.caches = lambda: {**history.bytes, "tokens": engine.counter.bytes, "timelines": timelines.bytes}
    if settings.estimator != "chars":
        await asyncio.to_thread(bundled_encoding)  # ~0.5 s: paid at startup, not by the first request
    await asyncio.to_thread(bundled_model_map)  # windows and prices: ~40 ms of parsing, not the first request's
    try:
        yield
    finally:
        try:
            await engine.aclose()  # background compactions use the history and the store: stopped first
            await history.aclose()  # background retries of pending replies use the store: stop them first
        finally:
            await store.aclose()


def engine_settings(settings: Settings) -> EngineSettings:
    return EngineSettings(
        context_window=settings.context_window, compression_threshold=settings.compression_threshold,
        min_retain_rounds=settings.min_retain_rounds, summary_timeout=settings.summary_timeout,
        summary_model=settings.summary_model, summary_max_tokens=settings.summary_max_tokens,
        estimator=settings.estimator, summary_placement="system" if settings.summary_placement == "system" else "user",
        failure_cooldown=settings.compaction_cooldown, precompact_threshold=settings.precompact_threshold,
        keep_tool_outputs=settings.keep_tool_outputs, keep_tool_output_share=settings.keep_tool_output_share,
        keep_user_words=settings.keep_user_words,
        recall_tool=settings.recall_tool, cache_ttl=settings.cache_ttl,
    )


async def _tracing(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[tracing_key].aclose()  # after the store's cleanup: its last compactions' spans are in


def create_app(settings: Settings, *, metrics: Metrics | None = None,
               tracing: Tracing | None = None) -> web.Application:
    """``tracing``: where spans go; by default as the ``OTEL_*`` environment and ``--otel`` say (``proxy.tracing``)."""
    app = web.Application(client_max_size=settings.max_body_bytes,
                          middlewares=[operator_access_middleware, error_middleware, client_key_middleware])
    app[settings_key] = settings
    app[metrics_key] = metrics or Metrics()
    app[tracing_key] = tracing if tracing is not None else open_tracing(settings, os.environ)
    app.on_response_prepare.append(remember_prepared)
    app[compactions_key] = RecentCompactions(clock=time.time)
    app[timelines_key] = TimelineCache()
    app[throttle_key] = FailureThrottle()
    app[savings_key] = SavingsCache()
    app[prefixes_key] = PrefixTracker(ttl=settings.cache_ttl)
    app.cleanup_ctx.append(_tracing)
    app.cleanup_ctx.append(_upstream_client)
    app.cleanup_ctx.append(_store)

    app.router.add_get("/healthz", open_route(health.healthz))
    app.router.add_get("/readyz", open_route(health.readyz))
    app.router.add_get("/metrics", open_route(health.metrics))
    chat, responses, messages = front_door(CHAT), front_door(RESPONSES), front_door(MESSAGES)
    for prefix in ("", "/s/{session}"):
        app.router.add_post(prefix + "/v1/chat/completions", chat)
        app.router.add_post(prefix + "/v1/responses", responses)
        app.router.add_get(prefix + "/v1/responses", passthrough.responses_socket)
        app.router.add_post(prefix + "/v1/responses/input_tokens", counts.input_tokens)
        app.router.add_post(prefix + "/v1/responses/compact", compact_endpoint)
        app.router.add_post(prefix + "/v1/messages", messages)
        app.router.add_post(prefix + "/v1/messages/count_tokens", counts.count_tokens)
        app.router.add_route("*", prefix + "/v1/{tail:.*}", passthrough.passthrough)
    gemini.add_routes(app.router)
    admin.add_routes(app.router)
    ui.add_routes(app.router)
    return app
