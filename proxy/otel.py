"""Tracing on: the spans ``proxy.tracing``'s hooks make, with OpenTelemetry (imported only when tracing is on).

The spans, following the GenAI semantic conventions where they name the thing:

- a proxied request: a server span ``POST /v1/chat/completions`` (the route),
  joining the client's trace when it sent a ``traceparent``; it carries the door
  (``ctxproxy.door``), the session (``ctxproxy.session``, and
  ``gen_ai.conversation.id``), the tenant's hash (``ctxproxy.tenant``), the
  status, what the client sent and what went instead (``ctxproxy.client_tokens``,
  ``ctxproxy.view_tokens``, the proxy's counts), whether the view was compacted
  (``ctxproxy.compacted``) and what the upstream reported (``gen_ai.usage.input_tokens``,
  ``gen_ai.usage.output_tokens``, ``gen_ai.usage.cache_read.input_tokens``, ``gen_ai.response.model``);
- each call to the upstream under it (a retry after a too-long refusal, a
  recall round: one each): a client span ``chat {model}`` (``generate_content``
  for Gemini) with ``gen_ai.operation.name``, ``gen_ai.provider.name`` (and the
  older ``gen_ai.system``), ``gen_ai.request.model``, the server's address and
  the answer's status and usage; ``ctxproxy.call`` is ``upstream``;
- each summary call: the same, ``ctxproxy.call`` ``summary``;
- each compaction attempt: ``ctxproxy.compaction`` (the conventions have no
  name for it), with its trigger, tier, outcome and the tokens before and after,
  recorded when the engine reports it, from the time it started.

Where spans go is the environment's to say, as for any OpenTelemetry SDK:
``OTEL_TRACES_EXPORTER`` (``otlp``, the default, over HTTP, or ``console``),
``OTEL_EXPORTER_OTLP_ENDPOINT`` and the rest of ``OTEL_EXPORTER_OTLP_*``,
``OTEL_SERVICE_NAME`` (default ``ctxproxy``), ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER``. Spans are exported in batches off the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from contextvars import Token
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from proxy.context.checkpoint import CompactionResult
from proxy.context.summary.summarizer import Complete, SummaryAnswer
from proxy.dialects.base import Dialect
from proxy.store.base import SessionKey
from proxy.tracing import RequestSpan, Tracing, exporters
from proxy.types import Message

if TYPE_CHECKING:
    from aiohttp import web

    from proxy.context.view.prepared import PreparedView
    from proxy.http.turn import Turn

#: ``gen_ai.provider.name`` of each door's API (the conventions' well-known values).
PROVIDERS = {"chat": "openai", "responses": "openai", "messages": "anthropic", "gemini": "gcp.gemini"}
#: The name of the ``gen_ai.operation.name`` for a door's call: Gemini's is ``generate_content``, the others' ``chat``.
OPERATIONS = {"gemini": "generate_content"}


def from_environment(environ: Mapping[str, str]) -> OtelTracing:
    """Tracing as the ``OTEL_*`` variables configure it (``proxy.tracing.problem`` checked them)."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "ctxproxy"}))
    provider = TracerProvider(resource=resource)
    for name in exporters(environ):
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    return OtelTracing(provider)


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout and compression from OTEL_EXPORTER_OTLP_*


def _version() -> str:
    try:
        return version("ctxproxy")
    except PackageNotFoundError:  # run from a checkout
        return "0"


def gen_ai(dialect: Dialect, model: str | None) -> dict[str, Any]:
    """The GenAI attributes that say which API and model a call is to."""
    provider = PROVIDERS.get(dialect.name, dialect.name)
    attributes: dict[str, Any] = {"gen_ai.operation.name": OPERATIONS.get(dialect.name, "chat"),
                                  "gen_ai.provider.name": provider, "gen_ai.system": provider}
    if model:
        attributes["gen_ai.request.model"] = model
    return attributes


def call_name(dialect: Dialect, model: str | None) -> str:
    """A GenAI span's name: ``{operation} {model}``."""
    operation = OPERATIONS.get(dialect.name, "chat")
    return f"{operation} {model}" if model else operation


def set_usage(span: Span, dialect: Dialect, usage: Mapping[str, Any] | None, model: str | None) -> None:
    """What the upstream reported about a call: its tokens and the model that answered."""
    if model:
        span.set_attribute("gen_ai.response.model", model)
    if usage is None:
        return
    for name, figure in (("gen_ai.usage.input_tokens", dialect.prompt_tokens(usage)),
                         ("gen_ai.usage.output_tokens", dialect.output_tokens(usage)),
                         ("gen_ai.usage.cache_read.input_tokens", dialect.cached_tokens(usage))):
        if figure is not None:
            span.set_attribute(name, figure)


def failed(span: Span, exc: BaseException) -> None:
    span.set_attribute("error.type", type(exc).__qualname__)
    if isinstance(exc, Exception):
        span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))


class _RequestSpan(RequestSpan):
    __slots__ = ("_dialect", "_span", "_token")

    def __init__(self, span: Span, token: Token[Context], dialect: Dialect) -> None:
        self._span, self._token, self._dialect = span, token, dialect

    def end(self, turn: Turn | None, status: int, view: PreparedView | None) -> None:
        span = self._span
        try:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_attribute("error.type", str(status))
                span.set_status(Status(StatusCode.ERROR))
            if turn is not None:
                span.set_attributes({"ctxproxy.session": turn.key.session, "ctxproxy.tenant": turn.key.tenant,
                                     "gen_ai.conversation.id": turn.key.session})
                if turn.parsed.model:
                    span.set_attribute("gen_ai.request.model", turn.parsed.model)
                if turn.tokens is not None:
                    span.set_attribute("ctxproxy.client_tokens", turn.tokens["client"])
                set_usage(span, self._dialect, turn.usage, turn.answered)
            if view is not None:
                # The proxy's own count, as ``client_tokens`` is: the estimate (the header's) carries the upstream's
                # usage, which counts more than the proxy's measure, and the view seemed larger than the request.
                span.set_attributes({"ctxproxy.compacted": view.compacted,
                                     "ctxproxy.view_tokens": view.estimate.local})
        finally:
            span.end()
            context.detach(self._token)


class _UpstreamCall:
    """One call to the upstream: its span, ended when the call's answer has been relayed (or has failed)."""

    __slots__ = ("_span", "_tracer", "_turn", "_url")

    def __init__(self, tracer: trace.Tracer, turn: Turn, url: str) -> None:
        self._tracer, self._turn, self._url = tracer, turn, url
        self._span: Span | None = None

    async def __aenter__(self) -> None:
        turn, target = self._turn, urlsplit(self._url)
        attributes = {**gen_ai(turn.dialect, turn.parsed.model), "ctxproxy.call": "upstream",
                      "ctxproxy.reactive_retry": turn.attempts, "server.address": target.hostname or ""}
        if target.port is not None:
            attributes["server.port"] = target.port
        self._span = self._tracer.start_span(call_name(turn.dialect, turn.parsed.model), kind=SpanKind.CLIENT,
                                             attributes=attributes)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        span, turn = self._span, self._turn
        if span is None:
            return
        try:
            if exc is not None:
                failed(span, exc)
                return
            span.set_attribute("http.response.status_code", turn.status)
            if turn.status >= 400:
                span.set_attribute("error.type", str(turn.status))
                span.set_status(Status(StatusCode.ERROR))
            set_usage(span, turn.dialect, turn.usage, turn.answered)
        finally:
            span.end()


class OtelTracing(Tracing):
    """Spans to ``provider``'s processors (a test gives it an in-memory exporter)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("ctxproxy", _version())

    def request(self, request: web.Request, dialect: Dialect) -> RequestSpan:
        parent = propagate.extract(request.headers)
        route = request.match_info.route.resource
        template = route.canonical if route is not None else request.path
        span = self.tracer.start_span(f"{request.method} {template}", context=parent, kind=SpanKind.SERVER,
                                      attributes={"http.request.method": request.method, "http.route": template,
                                                  "ctxproxy.door": dialect.name, **gen_ai(dialect, None)})
        return _RequestSpan(span, context.attach(trace.set_span_in_context(span, parent)), dialect)

    def upstream_call(self, turn: Turn, url: str) -> Any:
        return _UpstreamCall(self.tracer, turn, url)

    def summary_calls(self, complete: Complete, dialect: Dialect, model: str) -> Complete:
        tracer = self.tracer

        async def traced(messages: list[Message], max_tokens: int) -> SummaryAnswer:
            attributes = {**gen_ai(dialect, model), "ctxproxy.call": "summary", "gen_ai.request.max_tokens": max_tokens}
            with tracer.start_as_current_span(call_name(dialect, model), kind=SpanKind.CLIENT, attributes=attributes,
                                              record_exception=False, set_status_on_exception=False) as span:
                try:
                    answer = await complete(messages, max_tokens)
                except BaseException as exc:
                    failed(span, exc)
                    raise
                if answer.usage is not None:
                    set_usage(span, dialect, answer.usage.reported, answer.usage.model)
                return answer

        return traced

    def compaction(self, key: SessionKey, trigger: str, result: CompactionResult, seconds: float) -> None:
        ended = time.time_ns()
        attributes: dict[str, Any] = {
            "ctxproxy.session": key.session, "ctxproxy.tenant": key.tenant, "gen_ai.conversation.id": key.session,
            "ctxproxy.compaction.trigger": trigger, "ctxproxy.compaction.outcome": result.outcome,
            "ctxproxy.compaction.tokens_before": result.tokens_before,
            "ctxproxy.compaction.tokens_after": result.tokens_after,
        }
        if result.outcome in ("ok", "fallback"):
            attributes["ctxproxy.compaction.tier"] = result.tier
        if result.detail:
            attributes["ctxproxy.compaction.detail"] = result.detail
        if result.usage is not None:
            attributes["ctxproxy.compaction.summary_calls"] = result.usage.calls
        span = self.tracer.start_span("ctxproxy.compaction", start_time=ended - int(seconds * 1e9),
                                      attributes=attributes)
        if result.outcome in ("failed", "timeout"):
            span.set_status(Status(StatusCode.ERROR, result.summary_error or result.detail or result.outcome))
        span.end(end_time=ended)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.provider.shutdown)  # the last batch is exported: a blocking HTTP call
