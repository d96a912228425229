"""The start-up line: where the proxy listens, where each door's requests go, the store, the inspector, tracing.

One line an operator reads to know what this process will do with a request:
every upstream (a Messages or Gemini request does not go to ``--upstream``), the
store (a Redis password withheld), and where the inspector is, or how to turn it
on. URLs are printed without their passwords.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from proxy import tracing
from proxy.settings import Settings, redacted


def root_url(settings: Settings) -> str:
    """``http://host:port``, an IPv6 host in brackets."""
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{settings.port}"


def startup_line(settings: Settings, *, workers: int = 1, environ: Mapping[str, str] | None = None) -> str:
    """The line ``serve`` logs as it starts (see the module's docstring)."""
    root = root_url(settings)
    parts = [f"ctxproxy listening on {root}" + (f" with {workers} workers" if workers > 1 else ""),
             f"upstreams: openai {redacted(settings.upstream)}, anthropic {redacted(settings.anthropic_upstream)}, "
             f"gemini {redacted(settings.gemini_upstream)}",
             f"store {redacted(settings.store)}",
             f"inspector {root}/ui" if settings.admin_token else "inspector off: pass --admin-token"]
    destination = tracing.destination(settings, os.environ if environ is None else environ)
    if destination is not None:
        parts.append(f"tracing to {redacted(destination)}")
    return "; ".join(parts)
