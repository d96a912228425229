"""The flags ``serve`` takes, shared with ``run`` (which starts an embedded proxy with them).

Each is also an environment variable; flags win. ``settings_from`` builds the
``Settings`` of one command's flags. The flags come in groups (network,
upstreams, keys, store, window, summaries, masking, limits, logging) that
``--help`` shows under headings: cloup's option groups, on commands made with
``cloup`` (``ctxproxy``'s group makes them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import click
import cloup

from proxy import tracing
from proxy.settings import Settings, default_store_url

#: A ``click.option(...)``: adds one flag to the command it decorates.
Decorator = Callable[[Any], Any]


def store_option(f: Any) -> Any:
    return click.option("--store", envvar="CTXPROXY_STORE", default=None, show_envvar=True,
                        help=f"redis://…, rediss://… (add ?cluster=1 for Redis Cluster) or sqlite:///path "
                             f"[default: {default_store_url()}]")(f)


def option_groups(*, network: Sequence[Decorator] = (), embedded: bool = False) -> Decorator:
    """Every flag of ``serve`` under its heading, ``network`` added to the network group's; ``embedded``: for a
    command whose own proxy listens on a free loopback port (``run``), where ``--host`` and ``--port`` only say
    where a ``serve`` with the same flags would listen (``--print-env``, the closing line), so no bind default is
    claimed for them."""

    def decorate(f: Any) -> Any:
        for title, text, options in reversed(_GROUPS):  # the last decorator applied is the first heading
            f = cloup.option_group(title, *options, help=text)(f)
        return cloup.option_group("Network", *_network(embedded), *network)(f)

    return decorate


def _network(embedded: bool) -> list[Decorator]:
    if embedded:
        host = ("Address of a `ctxproxy serve` with these flags, where --print-env points the agent and the closing "
                "line's inspector command listens [default: 127.0.0.1]")
        port = "Its port (8787 unless set); run's own proxy listens on a free loopback port"
    else:
        host, port = "Bind address [default: 127.0.0.1]", "Bind port [default: 8787]"
    return [click.option("--host", envvar="CTXPROXY_HOST", default=None, show_envvar=True, help=host),
            click.option("--port", envvar="CTXPROXY_PORT", type=int, default=None, show_envvar=True, help=port)]


#: Every flag of ``serve`` but ``--workers`` (``check`` and ``replay`` take them too).
serve_options = option_groups()


def settings_from(options: dict[str, Any]) -> Settings:
    """The settings of one command's flags; tracing asked for and unable to start is a one-line error here."""
    try:
        settings = Settings.from_env({}, **options)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    problem = tracing.problem(settings, os.environ)
    if problem is not None:
        raise click.ClickException(problem)
    return settings


_UPSTREAMS: list[Decorator] = [
    click.option("--upstream", envvar="CTXPROXY_UPSTREAM", default=None, show_envvar=True,
                 help="Where /v1/chat/completions and /v1/responses (OpenAI) go: the base URL, path prefix included "
                      "[default: https://api.openai.com/v1]"),
    click.option("--anthropic-upstream", envvar="CTXPROXY_ANTHROPIC_UPSTREAM", default=None, show_envvar=True,
                 help="Where /v1/messages (Anthropic Messages API) goes [default: https://api.anthropic.com]"),
    click.option("--gemini-upstream", envvar="CTXPROXY_GEMINI_UPSTREAM", default=None, show_envvar=True,
                 help="Where /v1beta/models/... (Gemini API) goes, without the version "
                      "[default: https://generativelanguage.googleapis.com]"),
    click.option("--add-fields", envvar="CTXPROXY_ADD_FIELDS", type=click.Choice(["auto", "always", "never"]),
                 default=None, show_envvar=True,
                 help="Add fields the client did not send (prompt_cache_key; stream_options.include_usage on streamed "
                      "Chat requests; prompt_cache_breakpoint on a summary for GPT-5.6 and later): auto only when "
                      "--upstream is api.openai.com, always, or never (Azure OpenAI "
                      "refuses arguments it does not know) [default: auto]"),
]

_KEYS: list[Decorator] = [
    click.option("--admin-token", envvar="CTXPROXY_ADMIN_TOKEN", default=None, show_envvar=True,
                 help="Bearer token for /admin/* [default: unset, admin API off]"),
    click.option("--upstream-key", envvar="CTXPROXY_UPSTREAM_KEY", default=None, show_envvar=True,
                 help="Key the proxy uses upstream instead of the client's [default: unset]"),
    click.option("--anthropic-upstream-key", envvar="CTXPROXY_ANTHROPIC_UPSTREAM_KEY", default=None,
                 show_envvar=True, help="Key the proxy sends the Anthropic upstream (x-api-key) instead of the "
                                        "client's [default: unset]"),
    click.option("--gemini-upstream-key", envvar="CTXPROXY_GEMINI_UPSTREAM_KEY", default=None,
                 show_envvar=True, help="Key the proxy sends the Gemini upstream (x-goog-api-key) instead of the "
                                        "client's [default: unset]"),
    click.option("--client-keys", envvar="CTXPROXY_CLIENT_KEYS", default=None, show_envvar=True,
                 help="Comma-separated keys a client must present, 401 otherwise [default: unset, any key]"),
    click.option("--secret", envvar="CTXPROXY_SECRET", default=None, show_envvar=True,
                 help="Signs the references the proxy hands out (Codex compaction items); at least 16 characters, "
                      "the same on every replica [default: generated on first start, kept in the store]"),
]

_STORE: list[Decorator] = [
    store_option,
    click.option("--store-optional", envvar="CTXPROXY_STORE_OPTIONAL", is_flag=True, default=None, show_envvar=True,
                 help="Start even when the store does not answer (Redis down): requests are served but not logged "
                      "or compacted until it answers [default: refuse to start]"),
]

_WINDOW: list[Decorator] = [
    click.option("--context-window", envvar="CTXPROXY_CONTEXT_WINDOW", type=int, default=None, show_envvar=True,
                 help="Tokens [default: the model's input window from the bundled model map, else 128000]"),
    click.option("--compression-threshold", envvar="CTXPROXY_COMPRESSION_THRESHOLD", type=float, default=None,
                 show_envvar=True, help="Compact when the estimate exceeds window x threshold [default: 0.8]"),
    click.option("--precompact-threshold", envvar="CTXPROXY_PRECOMPACT_THRESHOLD", type=float, default=None,
                 show_envvar=True, help="Start a background summary when the estimate exceeds window x this, so the "
                                        "request at the compression threshold finds it ready [default: 0.6]"),
    click.option("--min-retain-rounds", envvar="CTXPROXY_MIN_RETAIN_ROUNDS", type=int, default=None, show_envvar=True,
                 help="Recent rounds kept verbatim [default: 10]"),
    click.option("--estimator", envvar="CTXPROXY_ESTIMATOR", type=click.Choice(["tokenizer", "chars", "max"]),
                 default=None, show_envvar=True,
                 help="Token estimate: tiktoken count, the seed's characters / 3, or the larger [default: tokenizer]"),
    click.option("--reactive-retries", envvar="CTXPROXY_REACTIVE_RETRIES", type=int, default=None, show_envvar=True,
                 help="Compact-harder-and-retry attempts after a prompt-too-long answer [default: 2]"),
    click.option("--compaction-cooldown", envvar="CTXPROXY_COMPACTION_COOLDOWN", type=float, default=None,
                 show_envvar=True, help="Seconds proactive compaction pauses after 3 failures in a row [default: 300]"),
    click.option("--cache-ttl", envvar="CTXPROXY_CACHE_TTL", type=float, default=None, show_envvar=True,
                 help="Seconds the provider keeps a prompt cache: after a longer idle gap a due reduction is made at "
                      "once (the cache is cold, it costs no extra write), mid-burst it waits [default: 300, "
                      "Anthropic's 5 minutes]"),
    click.option("--shadow/--no-shadow", envvar="CTXPROXY_SHADOW", default=None, show_envvar=True,
                 help="Compute and log the view of every request (compacting as it would), but forward the client's "
                      "request unchanged: the log and the inspector show what it would have sent [default: off]"),
]

_SUMMARIES: list[Decorator] = [
    click.option("--summary-model", envvar="CTXPROXY_SUMMARY_MODEL", default=None, show_envvar=True,
                 help="Model that writes summaries [default: the request's model]"),
    click.option("--summary-timeout", envvar="CTXPROXY_SUMMARY_TIMEOUT", type=float, default=None, show_envvar=True,
                 help="Seconds a compaction's summary calls may take together before it is abandoned "
                      "[default: 120]"),
    click.option("--summary-max-tokens", envvar="CTXPROXY_SUMMARY_MAX_TOKENS", type=int, default=None,
                 show_envvar=True, help="Output bound of a summary call, sent as max_tokens (max_completion_tokens "
                                        "for OpenAI reasoning models); at most a quarter of the summary model's "
                                        "window is used [default: 8192]"),
    click.option("--summary-placement", envvar="CTXPROXY_SUMMARY_PLACEMENT", type=click.Choice(["user", "system"]),
                 default=None, show_envvar=True,
                 help="Put the summary in a user message or append it to the system message [default: user]"),
    click.option("--keep-user-words", envvar="CTXPROXY_KEEP_USER_WORDS", type=click.IntRange(min=0), default=None,
                 show_envvar=True, help="Tokens of the user's own messages carried verbatim into a summary; over it "
                                        "the oldest long ones are clipped [default: 10% of the window]"),
]

_MASKING: list[Decorator] = [
    click.option("--keep-tool-outputs", envvar="CTXPROXY_KEEP_TOOL_OUTPUTS", type=click.IntRange(min=1),
                 default=None, show_envvar=True,
                 help="Recent tool outputs never masked; older ones give way to a one-line placeholder "
                      "naming their log entry, in batches (a number above any run's length turns "
                      "masking off), as long as they fit --keep-tool-output-share [default: 10]"),
    click.option("--keep-tool-output-share", envvar="CTXPROXY_KEEP_TOOL_OUTPUT_SHARE", type=click.FloatRange(min=0,
                 min_open=True), default=None, show_envvar=True,
                 help="Share of the window the kept tool outputs may take whole, and at most a fifth of the room the "
                      "tool definitions leave under the threshold; past it the older ones are masked too, so masking "
                      "comes before a summary (1: only --keep-tool-outputs counts) [default: 0.25]"),
    click.option("--recall-tool/--no-recall-tool", envvar="CTXPROXY_RECALL_TOOL", default=None, show_envvar=True,
                 help="Offer the model a ctxproxy_recall tool that reads a masked output back from the log "
                      "[default: off]"),
]

_LIMITS: list[Decorator] = [
    click.option("--max-body-bytes", envvar="CTXPROXY_MAX_BODY_BYTES", type=int, default=None, show_envvar=True,
                 help="Largest request body accepted; larger gets 413 [default: 33554432]"),
    click.option("--max-event-bytes", envvar="CTXPROXY_MAX_EVENT_BYTES", type=int, default=None, show_envvar=True,
                 help="Longest server-sent event relayed from the upstream: longer fails the request with 502, or "
                      "ends a stream already under way [default: 16777216]"),
    click.option("--state-cache-bytes", envvar="CTXPROXY_STATE_CACHE_BYTES", type=int, default=None,
                 show_envvar=True, help="Bytes the cached session states may hold, estimated; past it the least "
                                        "recently used are dropped [default: 268435456]"),
    click.option("--client-timeout", envvar="CTXPROXY_CLIENT_TIMEOUT", type=float, default=None, show_envvar=True,
                 help="Seconds a client has to send a request head (from connecting or from its previous response: "
                      "also how long an idle keep-alive connection stays open), and again to send the whole body, "
                      "else 408 [default: 75]"),
    click.option("--upstream-timeout", envvar="CTXPROXY_UPSTREAM_TIMEOUT", type=float, default=None, show_envvar=True,
                 help="Seconds of upstream silence before a 504 [default: 600]"),
]

_LOGGING: list[Decorator] = [
    click.option("--log-format", envvar="CTXPROXY_LOG_FORMAT", type=click.Choice(["text", "json"]), default=None,
                 show_envvar=True, help="Log line format [default: text]"),
    click.option("--log-level", envvar="CTXPROXY_LOG_LEVEL", default=None, show_envvar=True,
                 help="Log level [default: INFO]"),
    click.option("--otel/--no-otel", envvar="CTXPROXY_OTEL", default=None, show_envvar=True,
                 help="OpenTelemetry tracing, exported as the OTEL_* variables say (OTLP over HTTP to "
                      "localhost:4318 by default); OTEL_EXPORTER_OTLP_ENDPOINT alone turns it on too; needs "
                      "pip install 'ctxproxy[otel]' [default: off]"),
]

#: Every flag of ``serve`` but the network's, under its heading (with a line on what the heading covers).
_GROUPS: list[tuple[str, str, list[Decorator]]] = [
    ("Upstreams", "Where each door's requests go: OpenAI Chat Completions and Responses, Anthropic Messages, "
                  "Gemini API.", _UPSTREAMS),
    ("Keys", "Better set as environment variables than as flags, which other users can read in ps.", _KEYS),
    ("Store", "Where the sessions' fact logs are kept.", _STORE),
    ("Window", "When the proxy compacts, and how it counts.", _WINDOW),
    ("Summaries", "The model call that writes a checkpoint.", _SUMMARIES),
    ("Masking", "Old tool outputs shortened to a one-line placeholder, with no model call.", _MASKING),
    ("Limits", "Sizes and timeouts.", _LIMITS),
    ("Logging", "Log lines and OpenTelemetry traces.", _LOGGING),
]
