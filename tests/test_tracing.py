"""OpenTelemetry tracing: the spans of a compacting request on each door, read from an in-memory exporter.

Each door's scripted client (tests/scripted.py, tests/test_gemini.py, and a Chat
client here) runs against its fake upstream in a window small enough that the
proxy compacts with a summary (masking off) while the request waits. That
request is one server span; under it, the compaction (``ctxproxy.compaction``),
the summary call and the upstream call, each with the GenAI attributes that say
which API and model, and the tokens the upstream reported.

Tracing off imports nothing of OpenTelemetry; asked for without it installed, the
proxy refuses to start in one line; and a real ``ctxproxy serve`` child turned on
by ``OTEL_EXPORTER_OTLP_ENDPOINT`` alone exports its spans over OTLP/HTTP to a
collector in the test (flushed when it stops).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from proxy import tracing
from proxy.app import create_app
from proxy.cli import main
from proxy.constants import HEADER_COMPACTED, HEADER_SESSION
from proxy.keys import store_key
from proxy.otel import OtelTracing
from proxy.savings import dialect_of
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakechat import SHELL as CHAT_SHELL
from tests.fakechat import FakeChat
from tests.fakegemini import FakeGemini
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import STEP, Script
from tests.proxyfixtures import MASKING_OFF, read_log
from tests.proxyproc import ProxyProcess
from tests.redisproc import free_port
from tests.scripted import KEY, Claude, Codex, echo
from tests.test_client_compaction import CODEX_HEADERS, codex_run
from tests.test_gemini import KEY as GEMINI_KEY
from tests.test_gemini import MODEL as GEMINI_MODEL
from tests.test_gemini import GeminiClient

#: A window the scripted runs outgrow in a few steps; summaries, not masking, make room (the summary call is traced).
SMALL: dict[str, Any] = {"context_window": 4_000, "min_retain_rounds": 1, "keep_tool_outputs": 1_000,
                         "keep_tool_output_share": 1.0, "precompact_threshold": 1.0}
#: A client's trace the chat requests continue (W3C trace context).
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
CHAT_TOOLS = [{"type": "function", "function": {"name": CHAT_SHELL, "description": "Runs a shell command.",
                                                "parameters": {"type": "object",
                                                               "properties": {"command": {"type": "string"}}}}}]


class RequestsEnded(SpanProcessor):
    """Wakes the test when a request's server span ends: a streamed answer reaches the client before the handler's
    last lines run, so the spans are read only once the request span is in."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    def on_end(self, span: ReadableSpan) -> None:
        if span.kind is SpanKind.SERVER:
            self.ended.set()


@pytest.fixture
def traced() -> tuple[OtelTracing, InMemorySpanExporter, RequestsEnded]:
    exporter, ended = InMemorySpanExporter(), RequestsEnded()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(ended)
    return OtelTracing(provider), exporter, ended


Step = Callable[[], Awaitable[Any]]


async def chat_door(proxy: TestClient[Any, Any]) -> Step:
    """A Chat Completions agent: each reply and the output of its shell call join the conversation."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Run the steps."}]
    headers = {"Authorization": f"Bearer {KEY}", "X-Session-Id": "chat-run",
               "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}

    async def step() -> Any:
        resp = await proxy.post("/v1/chat/completions", headers=headers, data=orjson.dumps(
            {"model": "gpt-4o", "messages": messages, "tools": CHAT_TOOLS, "stream": False}))
        assert resp.status == 200, await resp.text()
        reply = (await resp.json())["choices"][0]["message"]
        messages.append(reply)
        for call in reply.get("tool_calls") or []:
            command = orjson.loads(call["function"]["arguments"])["command"]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": echo(command)})
        return resp

    return step


async def gemini_door(proxy: TestClient[Any, Any]) -> Step:
    agent = GeminiClient(proxy, padding=" lorem ipsum" * 150)
    agent.contents.append({"role": "user", "parts": [{"text": "Run the steps."}]})

    async def step() -> Any:
        resp = await agent.turn()
        for call in [p["functionCall"] for p in agent.contents[-1]["parts"] if "functionCall" in p]:
            output = f"Output: step-{STEP.search(call['args']['command'])[1]}" + " lorem ipsum" * 150  # type: ignore[index]
            agent.contents.append({"role": "user", "parts": [{"functionResponse": {
                "id": call.get("id"), "name": call["name"], "response": {"output": output}}}]})
        return resp

    return step


async def codex_door(proxy: TestClient[Any, Any]) -> Step:
    return Codex(proxy).step


async def claude_door(proxy: TestClient[Any, Any]) -> Step:
    return Claude(proxy).step


#: Per door: its fake upstream, the settings pointing at it, its client, the route, the provider and operation,
#: the model, the tenant's key.
DOORS: dict[str, tuple[Callable[[], Any], str, Callable[[TestClient[Any, Any]], Awaitable[Step]], str, str, str,
                       str, str]] = {
    "chat": (lambda: FakeChat(Script(steps=40)), "upstream", chat_door, "/v1/chat/completions", "openai", "chat",
             "gpt-4o", KEY),
    "responses": (lambda: FakeResponses(Script(steps=40)), "upstream", codex_door, "/v1/responses", "openai", "chat",
                  "gpt-5.5", KEY),
    "messages": (lambda: FakeMessages(Script(steps=40)), "anthropic_upstream", claude_door, "/v1/messages",
                 "anthropic", "chat", "claude-opus-5-5", KEY),
    "gemini": (lambda: FakeGemini(Script(steps=40)), "gemini_upstream", gemini_door,
               "/{version}/models/{model}:{method}", "gcp.gemini", "generate_content", GEMINI_MODEL, GEMINI_KEY),
}


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


@pytest.mark.parametrize("door", DOORS)
async def test_a_compacting_request_is_a_span_with_its_compaction_summary_and_upstream_call_under_it(
        aiohttp_server, aiohttp_client, tmp_path: Path, traced: tuple[OtelTracing, InMemorySpanExporter,
                                                                      RequestsEnded], door: str) -> None:
    make_fake, setting, make_client, route, provider, operation, model, key = DOORS[door]
    tracer, exporter, ended = traced
    upstream: TestServer = await aiohttp_server(make_fake().app())
    base = str(upstream.make_url("")).rstrip("/")
    settings = Settings(**{setting: base + ("/v1" if setting == "upstream" else "")},
                        store=f"sqlite:///{tmp_path}/facts.db", **SMALL)
    proxy: TestClient[Any, Any] = await aiohttp_client(create_app(settings, tracing=tracer))
    step = await make_client(proxy)

    for _ in range(30):
        exporter.clear()
        ended.ended.clear()
        resp = await step()
        await asyncio.wait_for(ended.ended.wait(), 30)
        if resp.headers[HEADER_COMPACTED] == "proactive":
            break
    else:
        pytest.fail("the run never compacted")
    spans = exporter.get_finished_spans()

    [request] = [s for s in spans if s.kind is SpanKind.SERVER]
    assert request.name == f"POST {route}"
    attributes = dict(request.attributes or {})
    session = resp.headers[HEADER_SESSION]
    assert {name: attributes[name] for name in (
        "ctxproxy.door", "ctxproxy.session", "gen_ai.conversation.id", "ctxproxy.tenant", "ctxproxy.compacted",
        "http.response.status_code", "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.system",
        "gen_ai.request.model")} == {
        "ctxproxy.door": door, "ctxproxy.session": session, "gen_ai.conversation.id": session,
        "ctxproxy.tenant": tenant_of(key), "ctxproxy.compacted": "proactive", "http.response.status_code": 200,
        "gen_ai.operation.name": operation, "gen_ai.provider.name": provider, "gen_ai.system": provider,
        "gen_ai.request.model": model}
    assert 0 < attributes["ctxproxy.view_tokens"] < attributes["ctxproxy.client_tokens"]  # type: ignore[operator]
    assert attributes["gen_ai.usage.input_tokens"] > 0 and attributes["gen_ai.usage.output_tokens"] > 0  # type: ignore[operator]
    facts = await read_log(proxy.server.app[store_key], SessionKey(tenant_of(key), session))
    reply = [f for f in facts if f.kind == "message" and f.source == "upstream"][-1]  # the log's own figure
    cached = dialect_of(reply).cached_tokens(reply.extra["usage"]) or 0
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == cached
    if door == "chat":  # the client's trace goes on through the proxy
        assert request.parent is not None and f"{request.parent.span_id:016x}" == PARENT_ID
        assert f"{request.context.trace_id:032x}" == TRACE_ID

    under = children(spans, request)
    assert len(under) == len(spans) - 1, "every other span is the request's child"
    [compaction] = [s for s in under if s.name == "ctxproxy.compaction"]
    done = dict(compaction.attributes or {})
    assert {name: done[name] for name in ("ctxproxy.compaction.trigger", "ctxproxy.compaction.outcome",
                                          "ctxproxy.compaction.tier", "ctxproxy.session")} == {
        "ctxproxy.compaction.trigger": "proactive", "ctxproxy.compaction.outcome": "ok",
        "ctxproxy.compaction.tier": "summary", "ctxproxy.session": session}
    assert 0 < done["ctxproxy.compaction.tokens_after"] < done["ctxproxy.compaction.tokens_before"]  # type: ignore[operator]

    calls = [s for s in under if s.kind is SpanKind.CLIENT]
    summaries = [s for s in calls if (s.attributes or {})["ctxproxy.call"] == "summary"]
    [sent] = [s for s in calls if (s.attributes or {})["ctxproxy.call"] == "upstream"]
    assert summaries and len(summaries) + 1 == len(calls)
    for call in (*summaries, sent):
        assert call.name == f"{operation} {model}"
        assert {name: (call.attributes or {})[name] for name in (
            "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model")} == {
            "gen_ai.operation.name": operation, "gen_ai.provider.name": provider, "gen_ai.request.model": model}
    assert compaction.start_time <= min(s.start_time for s in summaries)  # type: ignore[operator]
    assert max(s.end_time for s in summaries) <= compaction.end_time <= sent.start_time  # type: ignore[operator]
    upstream_call = dict(sent.attributes or {})
    assert upstream_call["http.response.status_code"] == 200
    assert (upstream_call["server.address"], upstream_call["server.port"]) == ("127.0.0.1", upstream.port)
    assert upstream_call["gen_ai.usage.input_tokens"] == attributes["gen_ai.usage.input_tokens"]
    assert {s.context.trace_id for s in spans} == {request.context.trace_id}


async def test_codexs_remote_compaction_is_a_request_span_with_the_compaction_under_it(
        aiohttp_server, aiohttp_client, tmp_path: Path, traced: tuple[OtelTracing, InMemorySpanExporter,
                                                                      RequestsEnded]) -> None:
    """``/v1/responses/compact``, answered by the proxy from a summary it makes then (trigger ``client``)."""
    tracer, exporter, ended = traced
    upstream: TestServer = await aiohttp_server(FakeResponses(Script(steps=40)).app())
    settings = Settings(upstream=str(upstream.make_url("/v1")), store=f"sqlite:///{tmp_path}/facts.db",
                        context_window=6_000, min_retain_rounds=1, precompact_threshold=1.0, **MASKING_OFF)
    proxy: TestClient[Any, Any] = await aiohttp_client(create_app(settings, tracing=tracer))
    items = await codex_run(proxy, 12)
    exporter.clear()
    ended.ended.clear()
    resp = await proxy.post("/v1/responses/compact", headers=CODEX_HEADERS, json={"model": "gpt-5.5", "input": items})
    assert resp.status == 200, await resp.text()
    await asyncio.wait_for(ended.ended.wait(), 30)

    spans = exporter.get_finished_spans()
    [request] = [s for s in spans if s.kind is SpanKind.SERVER]
    assert request.name == "POST /v1/responses/compact"
    assert {name: (request.attributes or {})[name] for name in ("ctxproxy.door", "ctxproxy.session",
                                                                "http.response.status_code")} == {
        "ctxproxy.door": "responses", "ctxproxy.session": CODEX_HEADERS["session-id"], "http.response.status_code": 200}
    under = children(spans, request)
    assert len(under) == len(spans) - 1
    [compaction] = [s for s in under if s.name == "ctxproxy.compaction"]
    assert ((compaction.attributes or {})["ctxproxy.compaction.trigger"],
            (compaction.attributes or {})["ctxproxy.compaction.outcome"],
            (compaction.attributes or {})["ctxproxy.compaction.tier"]) == ("client", "ok", "summary")
    assert [(s.attributes or {})["ctxproxy.call"] for s in under if s.kind is SpanKind.CLIENT] == ["summary"]


# -- on, off, and a missing package --------------------------------------------------------------


@pytest.mark.parametrize(("otel", "environ", "on"), [
    (False, {}, False),
    (True, {}, True),
    (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    (False, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    (False, {"OTEL_TRACES_EXPORTER": "console"}, True),
    (True, {"OTEL_SDK_DISABLED": "true"}, False),
    (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    (False, {"OTEL_SERVICE_NAME": "gateway"}, False),
])
def test_tracing_is_on_when_the_standard_variables_or_the_flag_say(otel: bool, environ: dict[str, str],
                                                                   on: bool) -> None:
    assert tracing.requested(Settings(otel=otel), environ) is on
    assert Settings.from_env({"CTXPROXY_OTEL": "1"}).otel is True


def test_off_the_proxy_imports_nothing_of_opentelemetry(tmp_path: Path) -> None:
    script = ("import sys; from proxy.app import create_app; from proxy.settings import Settings; "
              f"app = create_app(Settings(store='sqlite:///{tmp_path}/facts.db')); import proxy.cli; "
              "print(sorted(m for m in sys.modules if m.startswith('opentelemetry') or m == 'proxy.otel'))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CTXPROXY_"))}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True,
                         cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("args", "environ", "said"), [
    (["--otel"], {}, "tracing is on (--otel) but OpenTelemetry is not installed: pip install 'ctxproxy[otel]'"),
    ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
     "tracing is on (OTEL_EXPORTER_OTLP_ENDPOINT) but OpenTelemetry is not installed"),
])
def test_tracing_asked_for_without_the_packages_is_a_one_line_error_at_start(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], environ: dict[str, str], said: str) -> None:
    for name in ("opentelemetry", "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed: importing it fails
    result = CliRunner().invoke(main, ["serve", "--store", f"sqlite:///{tmp_path}/facts.db", *args],
                                env={**environ, "CTXPROXY_PORT": str(free_port())})
    assert result.exit_code == 1
    [line] = result.output.splitlines()
    assert line.startswith("Error: " + said), line


def test_an_otlp_protocol_the_proxy_cannot_speak_is_a_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "--store", f"sqlite:///{tmp_path}/facts.db"],
                                env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
                                     "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert result.exit_code == 1
    [line] = result.output.splitlines()
    assert line.startswith("Error: OTLP protocol 'grpc': ctxproxy exports traces over OTLP/HTTP only"), line


async def test_the_standard_endpoint_variable_alone_exports_a_served_proxys_spans_over_otlp(
        aiohttp_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real ``ctxproxy serve`` child, with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a collector here: its
    request's spans arrive as OTLP/HTTP protobuf, the last batch when it stops (SIGTERM)."""
    upstream: TestServer = await aiohttp_server(FakeChat(Script(steps=3)).app())
    received: list[ExportTraceServiceRequest] = []

    async def collect(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        received.append(export)
        return web.Response(content_type="application/x-protobuf", body=b"")

    collector_app = web.Application()
    collector_app.router.add_post("/v1/traces", collect)
    collector: TestServer = await aiohttp_server(collector_app)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", str(collector.make_url("")).rstrip("/"))
    monkeypatch.setenv("OTEL_SERVICE_NAME", "ctxproxy-test")
    proxy = ProxyProcess(str(upstream.make_url("/v1")), f"sqlite:///{tmp_path}/facts.db", tmp_path)
    async with proxy:
        step = await chat_door(OtherProcess(proxy.url))
        await step()
        # Stopped in a thread: the child exports its last batch to the collector, which this loop serves.
        await asyncio.to_thread(proxy.stop, 60)
    spans = [(resource.resource, span) for export in received for resource in export.resource_spans
             for scope in resource.scope_spans for span in scope.spans]
    assert {"POST /v1/chat/completions", "chat gpt-4o"} <= {span.name for _, span in spans}, proxy.log_tail()
    services = {a.value.string_value for resource, _ in spans for a in resource.attributes if a.key == "service.name"}
    assert services == {"ctxproxy-test"}


class OtherProcess:
    """Just enough of ``TestClient`` for ``chat_door``, against a proxy in another process."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def post(self, path: str, **options: Any) -> Any:
        async with aiohttp.ClientSession() as session, session.post(self.url + path, **options) as resp:
            await resp.read()  # kept: ``json`` and ``text`` read it after the session closed
            return resp
