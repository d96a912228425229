"""Settings: one frozen dataclass, built once from flags and environment, passed down.

Every setting is a flag and a ``CTXPROXY_*`` environment variable; flags win.
The table in CONTRACT.md is the public part; the rest are ours to tune.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import platformdirs

from proxy.context.view.masking import KEEP_OUTPUTS_SHARE


class Secret(str):
    """A credential: behaves as the string it wraps but never prints itself."""

    def __repr__(self) -> str:
        return "Secret('**********')"


#: A shorter ``--secret`` could be guessed offline from one reference.
MIN_SECRET_CHARS = 16


def default_store_url() -> str:
    return "sqlite:///" + str(Path(platformdirs.user_state_dir("ctxproxy")) / "facts.db")


def _split_keys(value: str) -> tuple[Secret, ...]:
    return tuple(Secret(k.strip()) for k in value.split(",") if k.strip())


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8787
    upstream: str = "https://api.openai.com/v1"
    #: Where Anthropic Messages requests (``/v1/messages…``) go; no ``/v1``: the path carries it.
    anthropic_upstream: str = "https://api.anthropic.com"
    #: Where Gemini API requests (``/v1beta/models/…``) go; no version: the path carries it.
    gemini_upstream: str = "https://generativelanguage.googleapis.com"
    store: str = field(default_factory=default_store_url)
    #: Serve even when the store does not answer at start-up (``proxy.preflight``): requests go unlogged until it does.
    store_optional: bool = False
    #: None: the model's input window from the bundled model map, else 128000.
    context_window: int | None = None
    compression_threshold: float = 0.8
    #: Start a background summary when the estimate passes window x this; at or above the compression threshold,
    #: there is no background compaction.
    precompact_threshold: float = 0.6
    min_retain_rounds: int = 10
    summary_model: str | None = None
    summary_timeout: float = 120.0
    #: Output bound of one summary call (at most a quarter of the summary model's window is used).
    summary_max_tokens: int = 8192
    admin_token: Secret | None = None
    upstream_key: Secret | None = None
    #: ``--upstream-key``'s counterpart for the Anthropic upstream (sent as ``x-api-key``).
    anthropic_upstream_key: Secret | None = None
    #: ``--upstream-key``'s counterpart for the Gemini upstream (sent as ``x-goog-api-key``).
    gemini_upstream_key: Secret | None = None
    client_keys: tuple[Secret, ...] = ()
    #: Signs the references the proxy hands out (Codex ``compaction`` items); None: generated at the first start
    #: and kept in the store (``proxy.secret``).
    secret: Secret | None = None
    #: Requests whose body is larger get a 413 before being read whole.
    max_body_bytes: int = 32 * 1024 * 1024
    #: Bytes the cached session states may hold, estimated (issue 23); past it the least recently used go, and a
    #: session's next request reads its log again.
    state_cache_bytes: int = 256 * 1024 * 1024
    #: Seconds without a byte from the upstream before the request fails with 504.
    upstream_timeout: float = 600.0
    #: Seconds to wait for the upstream's TCP/TLS connection.
    connect_timeout: float = 10.0
    #: Seconds a client has to send a request head (from the connection's start or its previous response, so
    #: also how long an idle keep-alive connection stays open), and again to send the whole body (then 408).
    client_timeout: float = 75.0
    #: Longest server-sent event relayed from the upstream; a longer one fails the request (502) or ends the stream.
    max_event_bytes: int = 16 * 1024 * 1024
    #: Compact-harder-and-retry attempts after the upstream refuses a prompt as too long.
    reactive_retries: int = 2
    #: Token estimate: "tokenizer" (default, measured in docs/BENCHMARKS.md), "chars" (the seed's) or "max".
    estimator: str = "tokenizer"
    #: Where the summary goes in the view: a "user" message (default) or appended to the "system" message.
    summary_placement: str = "user"
    #: Seconds proactive compaction pauses for a session after 3 failures in a row.
    compaction_cooldown: float = 300.0
    #: Seconds the provider keeps a prompt cache (Anthropic's default 5 minutes; 3600 for its 1-hour cache): a
    #: request after a longer idle gap finds the cache cold, where a reduction costs no extra write (issue 34).
    cache_ttl: float = 300.0
    #: Recent tool outputs never masked (the last N items holding tool output).
    keep_tool_outputs: int = 10
    #: Share of the window those outputs may take whole (past it the older ones are masked too); 1: count only.
    keep_tool_output_share: float = KEEP_OUTPUTS_SHARE
    #: Tokens of the user's own words carried verbatim into a summary; None: 10 % of the window.
    keep_user_words: int | None = None
    #: Offer the model a ``ctxproxy_recall`` tool for masked outputs.
    recall_tool: bool = False
    #: Compute and log the view of every request, but forward the client's request unchanged (``--shadow``): the log
    #: and the inspector show what the proxy would have sent.
    shadow: bool = False
    #: Request fields the client did not send (``prompt_cache_key``; ``stream_options.include_usage`` on a streamed
    #: Chat request): "auto" adds them only for an upstream known to take them (``OFFICIAL_OPENAI_HOST``),
    #: "always" everywhere, "never" nowhere. Azure OpenAI refuses a request with an argument it does not know.
    add_fields: str = "auto"
    log_format: str = "text"
    log_level: str = "INFO"
    #: OpenTelemetry tracing on, exported as the ``OTEL_*`` variables say (``proxy.tracing``); those variables
    #: alone turn it on too.
    otel: bool = False

    def __post_init__(self) -> None:
        for name in ("compression_threshold", "precompact_threshold"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1]")
        if self.context_window is not None and self.context_window < 1024:
            raise ValueError("context_window must be at least 1024 tokens")
        if self.min_retain_rounds < 1:
            raise ValueError("min_retain_rounds must be at least 1")
        if self.summary_timeout <= 0 or self.upstream_timeout <= 0 or self.client_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if self.summary_max_tokens < 256:
            raise ValueError("summary_max_tokens must be at least 256: eight sections need room")
        if self.secret is not None and len(self.secret) < MIN_SECRET_CHARS:
            raise ValueError(f"secret must be at least {MIN_SECRET_CHARS} characters")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        if self.max_event_bytes < 1024:
            raise ValueError("max_event_bytes must be at least 1024")
        if self.reactive_retries < 0:
            raise ValueError("reactive_retries must be 0 or more")
        self._check_tiers()
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}")

    def _check_tiers(self) -> None:
        if self.cache_ttl <= 0:
            raise ValueError("cache_ttl must be positive")
        if self.keep_tool_output_share <= 0:
            raise ValueError("keep_tool_output_share must be positive")
        if self.keep_tool_outputs < 1:
            raise ValueError("keep_tool_outputs must be at least 1: the model must see the output it just asked for")
        if self.keep_user_words is not None and self.keep_user_words < 0:
            raise ValueError("keep_user_words must be 0 or more")

    @property
    def upstream_base(self) -> str:
        return self.upstream.rstrip("/")

    @property
    def anthropic_base(self) -> str:
        return self.anthropic_upstream.rstrip("/")

    @property
    def gemini_base(self) -> str:
        return self.gemini_upstream.rstrip("/")

    @property
    def adds_fields(self) -> bool:
        """Whether requests to ``--upstream`` may carry fields the client did not send (``--add-fields``)."""
        if self.add_fields == "auto":
            return (urlsplit(self.upstream).hostname or "").lower() == OFFICIAL_OPENAI_HOST
        return self.add_fields == "always"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``CTXPROXY_<NAME>`` variables, then ``overrides`` (flags) that are not None."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get("CTXPROXY_" + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = _coerce(f.name, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        for name in ("admin_token", "upstream_key", "anthropic_upstream_key", "gemini_upstream_key", "secret"):
            if isinstance(values.get(name), str):
                values[name] = Secret(values[name])
        if isinstance(values.get("client_keys"), str):
            values["client_keys"] = _split_keys(values["client_keys"])
        return cls(**values)


#: The one upstream known to take every field the proxy may add: ``--add-fields auto`` adds them only there.
OFFICIAL_OPENAI_HOST = "api.openai.com"

#: Settings that take one of a few words.
_CHOICES = {"estimator": ("tokenizer", "chars", "max"), "summary_placement": ("user", "system"),
            "log_format": ("text", "json"), "add_fields": ("auto", "always", "never")}
_INTS = {"port", "context_window", "min_retain_rounds", "summary_max_tokens", "max_body_bytes", "max_event_bytes",
         "state_cache_bytes", "reactive_retries", "keep_tool_outputs", "keep_user_words"}
_BOOLS = {"recall_tool", "shadow", "otel", "store_optional"}
_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})
_FLOATS = {"compression_threshold", "precompact_threshold", "summary_timeout", "upstream_timeout",
           "connect_timeout", "client_timeout", "compaction_cooldown", "cache_ttl",
           "keep_tool_output_share"}


def _coerce(name: str, raw: str) -> Any:
    if name in _BOOLS:
        if raw.strip().lower() not in _TRUE | _FALSE:
            raise ValueError(f"CTXPROXY_{name.upper()} must be true or false, got {raw!r}")
        return raw.strip().lower() in _TRUE
    try:
        if name in _INTS:
            return int(raw)
        if name in _FLOATS:
            return float(raw)
    except ValueError:
        raise ValueError(f"CTXPROXY_{name.upper()} must be a number, got {raw!r}") from None
    return raw


def redacted(url: str) -> str:
    """``url`` without its password, fit to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
