"""The ``ctxproxy`` command: ``serve``, ``check`` and, for people, ``sessions list|log|view``.

The ``sessions`` commands read the store directly (no proxy needs to run) and
stream: a log is fetched and printed one page at a time. Rendering lives in
``proxy.render``; these commands only open the store, call and print.
"""

from __future__ import annotations

import asyncio
import logging.config
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click
import orjson

from proxy import render
from proxy.errors import StoreError
from proxy.logs import default_log_config
from proxy.settings import Settings, default_store_url
from proxy.store import FactLog, SessionKey, open_store

T = TypeVar("T")

logger = logging.getLogger(__name__)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="ctxproxy")
def main() -> None:
    """ctxproxy: an OpenAI-compatible proxy that keeps long agent runs inside the model's context window.

    Point your agent's OPENAI_BASE_URL at http://HOST:PORT/v1 (or /s/SESSION/v1).
    """


def _store_option(f: Any) -> Any:
    return click.option("--store", envvar="CTXPROXY_STORE", default=None, show_envvar=True,
                        help=f"redis://…, rediss://… (add ?cluster=1 for Redis Cluster) or sqlite:///path "
                             f"[default: {default_store_url()}]")(f)


@main.command()
@click.option("--host", envvar="CTXPROXY_HOST", default=None, show_envvar=True,
              help="Bind address [default: 127.0.0.1]")
@click.option("--port", envvar="CTXPROXY_PORT", type=int, default=None, show_envvar=True,
              help="Bind port [default: 8787]")
@click.option("--upstream", envvar="CTXPROXY_UPSTREAM", default=None, show_envvar=True,
              help="Base URL of the OpenAI-compatible upstream, path prefix included "
                   "[default: https://api.openai.com/v1]")
@click.option("--anthropic-upstream", envvar="CTXPROXY_ANTHROPIC_UPSTREAM", default=None, show_envvar=True,
              help="Where /v1/messages (Anthropic Messages API) goes [default: https://api.anthropic.com]")
@_store_option
@click.option("--context-window", envvar="CTXPROXY_CONTEXT_WINDOW", type=int, default=None, show_envvar=True,
              help="Tokens [default: the model's input window from the bundled model map, else 128000]")
@click.option("--compression-threshold", envvar="CTXPROXY_COMPRESSION_THRESHOLD", type=float, default=None,
              show_envvar=True, help="Compact when the estimate exceeds window x threshold [default: 0.8]")
@click.option("--precompact-threshold", envvar="CTXPROXY_PRECOMPACT_THRESHOLD", type=float, default=None,
              show_envvar=True, help="Start a background summary when the estimate exceeds window x this, so the "
                                     "request at the compression threshold finds it ready [default: 0.6]")
@click.option("--min-retain-rounds", envvar="CTXPROXY_MIN_RETAIN_ROUNDS", type=int, default=None, show_envvar=True,
              help="Recent rounds kept verbatim [default: 10]")
@click.option("--summary-model", envvar="CTXPROXY_SUMMARY_MODEL", default=None, show_envvar=True,
              help="Model that writes summaries [default: the request's model]")
@click.option("--summary-timeout", envvar="CTXPROXY_SUMMARY_TIMEOUT", type=float, default=None, show_envvar=True,
              help="Seconds a compaction's summary calls may take together before it is abandoned "
                   "[default: 120]")
@click.option("--summary-max-tokens", envvar="CTXPROXY_SUMMARY_MAX_TOKENS", type=int, default=None,
              show_envvar=True, help="Output bound of a summary call, sent as max_tokens (max_completion_tokens "
                                     "for OpenAI reasoning models); at most a quarter of the summary model's "
                                     "window is used [default: 8192]")
@click.option("--admin-token", envvar="CTXPROXY_ADMIN_TOKEN", default=None, show_envvar=True,
              help="Bearer token for /admin/* [default: unset, admin API off]")
@click.option("--upstream-key", envvar="CTXPROXY_UPSTREAM_KEY", default=None, show_envvar=True,
              help="Key the proxy uses upstream instead of the client's [default: unset]")
@click.option("--anthropic-upstream-key", envvar="CTXPROXY_ANTHROPIC_UPSTREAM_KEY", default=None,
              show_envvar=True, help="Key the proxy sends the Anthropic upstream (x-api-key) instead of the client's "
                                     "[default: unset]")
@click.option("--client-keys", envvar="CTXPROXY_CLIENT_KEYS", default=None, show_envvar=True,
              help="Comma-separated keys a client must present, 401 otherwise [default: unset, any key]")
@click.option("--secret", envvar="CTXPROXY_SECRET", default=None, show_envvar=True,
              help="Signs the references the proxy hands out (Codex compaction items); at least 16 characters, "
                   "the same on every replica [default: generated on first start, kept in the store]")
@click.option("--max-body-bytes", envvar="CTXPROXY_MAX_BODY_BYTES", type=int, default=None, show_envvar=True,
              help="Largest request body accepted; larger gets 413 [default: 33554432]")
@click.option("--state-cache-bytes", envvar="CTXPROXY_STATE_CACHE_BYTES", type=int, default=None,
              show_envvar=True, help="Bytes the cached session states may hold, estimated; past it the least "
                                     "recently used are dropped [default: 268435456]")
@click.option("--max-event-bytes", envvar="CTXPROXY_MAX_EVENT_BYTES", type=int, default=None, show_envvar=True,
              help="Longest server-sent event relayed from the upstream: longer fails the request with 502, or "
                   "ends a stream already under way [default: 16777216]")
@click.option("--client-timeout", envvar="CTXPROXY_CLIENT_TIMEOUT", type=float, default=None, show_envvar=True,
              help="Seconds a client has to send a request head (from connecting or from its previous response: "
                   "also how long an idle keep-alive connection stays open), and again to send the whole body, "
                   "else 408 [default: 75]")
@click.option("--upstream-timeout", envvar="CTXPROXY_UPSTREAM_TIMEOUT", type=float, default=None, show_envvar=True,
              help="Seconds of upstream silence before a 504 [default: 600]")
@click.option("--reactive-retries", envvar="CTXPROXY_REACTIVE_RETRIES", type=int, default=None, show_envvar=True,
              help="Compact-harder-and-retry attempts after a prompt-too-long answer [default: 2]")
@click.option("--estimator", envvar="CTXPROXY_ESTIMATOR", type=click.Choice(["tokenizer", "chars", "max"]),
              default=None, show_envvar=True,
              help="Token estimate: tiktoken count, the seed's characters / 3, or the larger [default: tokenizer]")
@click.option("--summary-placement", envvar="CTXPROXY_SUMMARY_PLACEMENT", type=click.Choice(["user", "system"]),
              default=None, show_envvar=True,
              help="Put the summary in a user message or append it to the system message [default: user]")
@click.option("--compaction-cooldown", envvar="CTXPROXY_COMPACTION_COOLDOWN", type=float, default=None,
              show_envvar=True, help="Seconds proactive compaction pauses after 3 failures in a row [default: 300]")
@click.option("--keep-tool-outputs", envvar="CTXPROXY_KEEP_TOOL_OUTPUTS", type=click.IntRange(min=1), default=None,
              show_envvar=True, help="Recent tool outputs never masked; older ones give way to a one-line placeholder "
                                     "naming their log entry, in batches (a number above any run's length turns "
                                     "masking off), as long as they fit --keep-tool-output-share [default: 10]")
@click.option("--keep-tool-output-share", envvar="CTXPROXY_KEEP_TOOL_OUTPUT_SHARE", type=click.FloatRange(min=0,
              min_open=True), default=None, show_envvar=True,
              help="Share of the window the kept tool outputs may take whole, and at most half the room the tool "
                   "definitions leave under the threshold; past it the older ones are masked too, so masking comes "
                   "before a summary (1: only --keep-tool-outputs counts; 0.25 is the measured option, issue 19) "
                   "[default: 1]")
@click.option("--keep-user-words", envvar="CTXPROXY_KEEP_USER_WORDS", type=click.IntRange(min=0), default=None,
              show_envvar=True, help="Tokens of the user's own messages carried verbatim into a summary; over it "
                                     "the oldest long ones are clipped [default: 10% of the window]")
@click.option("--recall-tool/--no-recall-tool", envvar="CTXPROXY_RECALL_TOOL", default=None, show_envvar=True,
              help="Offer the model a ctxproxy_recall tool that reads a masked output back from the log "
                   "[default: off]")
@click.option("--add-fields", envvar="CTXPROXY_ADD_FIELDS", type=click.Choice(["auto", "always", "never"]),
              default=None, show_envvar=True,
              help="Add fields the client did not send (prompt_cache_key; stream_options.include_usage on streamed "
                   "Chat requests): auto only when --upstream is api.openai.com, always, or never (Azure OpenAI "
                   "refuses arguments it does not know) [default: auto]")
@click.option("--log-format", envvar="CTXPROXY_LOG_FORMAT", type=click.Choice(["text", "json"]), default=None,
              show_envvar=True, help="Log line format [default: text]")
@click.option("--log-level", envvar="CTXPROXY_LOG_LEVEL", default=None, show_envvar=True,
              help="Log level [default: INFO]")
@click.option("--workers", envvar="CTXPROXY_WORKERS", type=click.IntRange(min=1), default=1, show_envvar=True,
              show_default=True, help="Processes serving the port (SO_REUSEPORT); e.g. the number of cores")
def serve(workers: int, **options: Any) -> None:
    """Run the proxy."""
    try:
        settings = Settings.from_env({}, **options)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    logging.config.dictConfig(default_log_config(settings.log_level, settings.log_format))
    if workers > 1:
        from proxy.workers import serve_workers

        raise SystemExit(serve_workers(settings, workers))
    from proxy.app import create_app
    from proxy.server import run

    logger.info("ctxproxy listening on http://%s:%d, upstream %s", settings.host, settings.port, settings.upstream)
    run(create_app(settings), settings)


# -- for people: sessions and check -------------------------------------------------------------


def _redacted(url: str) -> str:
    """The store URL without its password, fit to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


@asynccontextmanager
async def _opened(url: str | None) -> AsyncIterator[FactLog]:
    try:
        store = await open_store(url or default_store_url())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--store") from None
    try:
        yield store
    finally:
        await store.aclose()


def _run(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run one command's coroutine; a store failure is a one-line error and exit status 1, not a traceback."""
    try:
        return asyncio.run(work())
    except StoreError as exc:
        raise click.ClickException(f"store failed: {exc}") from None


async def _resolve(store: FactLog, session: str, tenant: str | None) -> SessionKey:
    """The session's key; without ``--tenant`` the one tenant that has it, else an error naming the choices."""
    if tenant is not None:
        return SessionKey(tenant, session)
    tenants = await render.find_tenants(store, session)
    if not tenants:
        raise click.ClickException(f"no session {session!r} in the store")
    if len(tenants) > 1:
        raise click.ClickException(f"session {session!r} exists under several tenants, pick one with --tenant: "
                                   + ", ".join(tenants))
    return SessionKey(tenants[0], session)


_json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
_tenant_option = click.option("--tenant", default=None,
                              help="Tenant id [default: the only tenant that has SESSION]")


@main.group()
def sessions() -> None:
    """Inspect logged sessions, straight from the store (no proxy needs to run)."""


@sessions.command("list")
@_store_option
@_json_option
def sessions_list(store: str | None, as_json: bool) -> None:
    """Every session: tenant, id, message and checkpoint counts, last update (most recent first)."""

    async def work() -> None:
        async with _opened(store) as log:
            infos = await render.session_infos(log)
        if as_json:
            click.echo(orjson.dumps([render.info_json(i) for i in infos]).decode())
        else:
            click.echo(render.sessions_table(infos))

    _run(work)


@sessions.command("log")
@click.argument("session")
@_tenant_option
@_store_option
@_json_option
def sessions_log(session: str, tenant: str | None, store: str | None, as_json: bool) -> None:
    """The whole fact log of SESSION, oldest first: a transcript, or one JSON entry per line with --json."""

    async def work() -> None:
        async with _opened(store) as log:
            key = await _resolve(log, session, tenant)
            transcript = render.Transcript()
            found = False
            async for page in render.pages(log, key):
                if not found and not as_json:
                    click.echo(f"# Session {key.session} (tenant {key.tenant})")
                found = True
                if as_json:
                    click.echo(b"".join(render.fact_line(f) for f in page).decode(), nl=False)
                else:
                    click.echo("".join("\n" + transcript.fact(f) + "\n" for f in page), nl=False)
            if not found:
                raise click.ClickException(f"no session {session!r} under tenant {key.tenant!r}")

    _run(work)


@sessions.command("view")
@click.argument("session")
@_tenant_option
@click.option("--model", default=None, help="Model whose window to plan for [default: --summary-model, "
                                            "else --context-window, else 128000 tokens]")
@_store_option
@_json_option
def sessions_view(session: str, tenant: str | None, model: str | None, store: str | None, as_json: bool) -> None:
    """What the next request of SESSION would send upstream, if the client resent the logged conversation.

    Settings that shape the view (CTXPROXY_CONTEXT_WINDOW, CTXPROXY_COMPRESSION_THRESHOLD…) are read from the
    environment, as ``serve`` reads them.
    """
    from proxy.app import engine_settings
    from proxy.context.engine import ContextEngine
    from proxy.context.history import HistoryManager

    try:
        settings = Settings.from_env(None, store=store)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None

    async def work() -> None:
        async with _opened(settings.store) as log:
            key = await _resolve(log, session, tenant)
            lineage = await render.replay(log, key)
            engine = ContextEngine(HistoryManager(log, clock=time.time), engine_settings(settings))
        if not lineage.facts:
            raise click.ClickException(f"no session {session!r} under tenant {key.tenant!r}")
        view = render.build_view(engine, lineage, model or settings.summary_model or "")
        click.echo(orjson.dumps(view.to_json()).decode() if as_json else render.render_view(view, key))

    _run(work)


@main.command()
@_store_option
def check(store: str | None) -> None:
    """Open the store and ping it: prints ok and exits 0, or prints why and exits 1."""
    url = store or default_store_url()

    async def work() -> str | None:
        try:
            async with _opened(url) as log:
                await log.ping()
        except (StoreError, OSError) as exc:
            return str(exc) or type(exc).__name__
        return None

    problem = _run(work)
    if problem is not None:
        click.echo(f"store {_redacted(url)}: failed: {problem}", err=True)
        raise SystemExit(1)
    click.echo(f"store {_redacted(url)}: ok")
