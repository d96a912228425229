"""OpenTelemetry tracing: off unless the standard ``OTEL_*`` environment variables or ``--otel`` turn it on.

A proxied request is a server span; the upstream call, each summary call and
each compaction attempt are its children (``proxy.otel`` says which attributes
they carry). Tracing is on when ``--otel`` (``CTXPROXY_OTEL``) is set, or the
environment names an exporter the way every OpenTelemetry SDK reads it
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_TRACES_EXPORTER``); ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn it off whatever else is set.

Off, nothing of OpenTelemetry is imported and every hook is ``OFF``'s: no span
object is made, a summary completer is returned as it came, and a request pays
a few calls that do nothing. The packages are an optional extra
(``pip install 'ctxproxy[otel]'``); asking for tracing without them is a
one-line error at start-up (``problem``), not a traceback on the first request.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from proxy.settings import Settings

if TYPE_CHECKING:  # the CLI imports this module for ``problem``: what the hooks take is only named here
    from aiohttp import web

    from proxy.context.checkpoint import CompactionResult
    from proxy.context.summary.summarizer import Complete
    from proxy.context.view.prepared import PreparedView
    from proxy.dialects.base import Dialect
    from proxy.http.turn import Turn
    from proxy.store.base import SessionKey

#: The variables that name where spans go: any of them set turns tracing on.
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
#: The exporters ``OTEL_TRACES_EXPORTER`` may name (the SDK's own names); OTLP goes over HTTP (http/protobuf).
EXPORTERS = ("otlp", "console")
#: Where the OTLP/HTTP exporter sends spans when no endpoint is set (the specification's default).
DEFAULT_ENDPOINT = "http://localhost:4318"
#: What ``pip`` needs for tracing (the ``otel`` extra).
PACKAGES = "opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"


def exporters(environ: Mapping[str, str]) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (OTLP when it names none)."""
    named = [name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()]
    return named or ["otlp"]


def requested(settings: Settings, environ: Mapping[str, str]) -> bool:
    """Whether tracing is on (see the module's docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or exporters(environ) == ["none"]:
        return False
    return settings.otel or bool(environ.get("OTEL_TRACES_EXPORTER", "").strip()) or any(
        environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def problem(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """Why tracing, asked for, cannot start, in one line that says what to do; None when it can (or is off)."""
    if not requested(settings, environ):
        return None
    unknown = [name for name in exporters(environ) if name not in EXPORTERS]
    if unknown:
        return (f"OTEL_TRACES_EXPORTER={environ.get('OTEL_TRACES_EXPORTER')}: ctxproxy exports traces with "
                f"{' or '.join(EXPORTERS)}, not {', '.join(unknown)}")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol.strip() != "http/protobuf":
        return (f"OTLP protocol {protocol.strip()!r}: ctxproxy exports traces over OTLP/HTTP only; set "
                f"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf and point the endpoint at the collector's HTTP port "
                f"(4318)")
    try:
        importlib.import_module("opentelemetry.sdk.trace")
        importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    except ImportError:
        return (f"tracing is on ({_why(settings, environ)}) but OpenTelemetry is not installed: "
                f"pip install 'ctxproxy[otel]' (or {PACKAGES}), or unset it")
    return None


def destination(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """Where spans go, for the start-up line: the OTLP endpoint (the SDK's default when none is set) or
    ``console``; None when tracing is off."""
    if not requested(settings, environ):
        return None
    endpoint = (environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
                or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or DEFAULT_ENDPOINT)
    return ", ".join(endpoint if name == "otlp" else name for name in exporters(environ))


def _why(settings: Settings, environ: Mapping[str, str]) -> str:
    if settings.otel:
        return "--otel"
    return next(name for name in ("OTEL_TRACES_EXPORTER", *ENDPOINT_VARIABLES) if environ.get(name, "").strip())


def open_tracing(settings: Settings, environ: Mapping[str, str]) -> Tracing:
    """The tracing the environment asks for: ``OFF``, or spans exported as it says (``proxy.otel``)."""
    if not requested(settings, environ):
        return OFF
    from proxy.otel import from_environment  # imports OpenTelemetry: only when tracing is on

    return from_environment(environ)


class RequestSpan:
    """A proxied request's span, current while the request is handled; ``end`` closes it (this one: nothing)."""

    __slots__ = ()

    def end(self, turn: Turn | None, status: int, view: PreparedView | None) -> None:
        return None


class _Nothing:
    """An async context manager that does nothing (``async with``), for the upstream call when tracing is off."""

    __slots__ = ()

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        return None


_NO_SPAN = RequestSpan()
_NOTHING = _Nothing()


class Tracing:
    """The hooks the proxy calls: this class is tracing off, each hook doing nothing; ``proxy.otel`` is it on."""

    def request(self, request: web.Request, dialect: Dialect) -> RequestSpan:
        """A span for ``request`` at ``dialect``'s door, made current until ``RequestSpan.end``."""
        return _NO_SPAN

    def upstream_call(self, turn: Turn, url: str) -> Any:
        """An async context manager around one call to the upstream (``async with``)."""
        return _NOTHING

    def summary_calls(self, complete: Complete, dialect: Dialect, model: str) -> Complete:
        """``complete`` with a span around each summary call it makes."""
        return complete

    def compaction(self, key: SessionKey, trigger: str, result: CompactionResult, seconds: float) -> None:
        """A compaction attempt that took ``seconds`` and ended now (the engine's observer)."""
        return None

    async def aclose(self) -> None:
        """Export what is left and stop (the app's cleanup)."""
        return None


#: Tracing off: the hooks every app has unless tracing is on.
OFF = Tracing()
