"""The ``ctxproxy`` command: ``serve``, ``run``, ``demo``, ``check``, ``replay`` and ``sessions
list|log|view|show|uncompact``.

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

import click
import cloup
import orjson

from proxy import preflight, render
from proxy.demo.command import demo
from proxy.errors import StoreError
from proxy.launch.command import run
from proxy.logs import default_log_config
from proxy.savings import SavingsCache, saved_text
from proxy.serveflags import option_groups, serve_options, settings_from, store_option
from proxy.settings import Settings, default_store_url, redacted
from proxy.store import FactLog, SessionKey, open_store
from proxy.store.base import MAX_SEQ

T = TypeVar("T")

logger = logging.getLogger(__name__)


@cloup.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="ctxproxy")
def main() -> None:
    """ctxproxy: a proxy for coding agents that keeps long runs inside the model's context window.

    It serves four doors: OpenAI Chat Completions and Responses (http://HOST:PORT/v1, or /s/SESSION/v1),
    Anthropic Messages (http://HOST:PORT/v1/messages) and the Gemini API (http://HOST:PORT/v1beta/models/...).
    `ctxproxy run AGENT` points an agent at it for you.

    New here? `ctxproxy demo` shows a long run compacted, with no key and no network.
    """


@main.command()
@option_groups(network=[click.option(
    "--workers", envvar="CTXPROXY_WORKERS", type=click.IntRange(min=1), default=1, show_envvar=True,
    show_default=True, help="Processes serving the port (SO_REUSEPORT); e.g. the number of cores")])
def serve(workers: int, **options: Any) -> None:
    """Run the proxy."""
    settings = settings_from(options)
    logging.config.dictConfig(default_log_config(settings.log_level, settings.log_format))
    preflight.check_upstreams(settings)
    preflight.check_store(settings)
    if workers > 1:
        from proxy.workers import serve_workers

        preflight.check_port(settings)
        raise SystemExit(serve_workers(settings, workers))
    from proxy.app import create_app
    from proxy.server import run
    from proxy.startup import startup_line

    def listening() -> None:
        logger.info("%s", startup_line(settings))

    run(create_app(settings), settings, on_listening=listening)


# -- for people: sessions and check -------------------------------------------------------------


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
@store_option
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
@store_option
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
@store_option
@_json_option
def sessions_view(session: str, tenant: str | None, model: str | None, store: str | None, as_json: bool) -> None:
    """What the next request of SESSION would send upstream, if the client resent the logged conversation.

    Settings that shape the view (CTXPROXY_CONTEXT_WINDOW, CTXPROXY_COMPRESSION_THRESHOLD…) are read from the
    environment, as ``serve`` reads them.
    """
    from proxy.app import engine_settings
    from proxy.context.engine import ContextEngine
    from proxy.context.log.history import HistoryManager

    try:
        settings = Settings.from_env(None, store=store)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None

    async def work() -> None:
        async with _opened(settings.store) as log:
            key = await _resolve(log, session, tenant)
            lineage = await render.replay(log, key, run=True)
            engine = ContextEngine(HistoryManager(log, clock=time.time), engine_settings(settings))
        if not lineage.facts:
            raise click.ClickException(f"no session {session!r} under tenant {key.tenant!r}")
        view = render.build_view(engine, lineage, model or settings.summary_model or "")
        click.echo(orjson.dumps(view.to_json()).decode() if as_json else render.render_view(view, key))

    _run(work)


@sessions.command("uncompact")
@click.argument("session")
@click.option("--checkpoint", "checkpoint_seq", type=click.IntRange(min=0, max=MAX_SEQ), default=None,
              help="Seq of the checkpoint entry to undo [default: the newest live checkpoint]")
@_tenant_option
@store_option
@_json_option
def sessions_uncompact(session: str, checkpoint_seq: int | None, tenant: str | None, store: str | None,
                       as_json: bool) -> None:
    """Undo a compaction of SESSION: an entry appended to the log retires the checkpoint (and those made from it),
    and the next view is built from the checkpoint it was made from, or from the whole history (``ctxproxy
    sessions view`` shows it). Refused while a compaction of the session runs (try again once it is done)."""
    from proxy.context.log.history import HistoryManager
    from proxy.context.log.undo import uncompact
    from proxy.errors import NothingToUndo

    async def work() -> None:
        async with _opened(store) as log:
            key = await _resolve(log, session, tenant)
            try:
                undone = await uncompact(HistoryManager(log, clock=time.time), key, checkpoint_seq)
            except NothingToUndo as exc:
                raise click.ClickException(exc.message) from None
        if as_json:
            click.echo(orjson.dumps(undone.to_json()).decode())
        else:
            click.echo(render.undo_line(undone))

    _run(work)


@sessions.command("show")
@click.argument("session")
@_tenant_option
@store_option
@_json_option
def sessions_show(session: str, tenant: str | None, store: str | None, as_json: bool) -> None:
    """What SESSION saved: its requests, the tokens the client sent against those the model saw, cached, dollars."""

    async def work() -> None:
        async with _opened(store) as log:
            key = await _resolve(log, session, tenant)
            totals = await SavingsCache().totals(log, key)
        if as_json:
            click.echo(orjson.dumps({"tenant": key.tenant, "session": key.session, **totals.to_json()}).decode())
        else:
            click.echo(f"# Session {key.session} (tenant {key.tenant})\n{totals.replies:,} requests: "
                       f"{saved_text(totals)}.")

    _run(work)


@main.command()
@click.argument("source")
@serve_options
@_tenant_option
@click.option("--summariser", type=click.Choice(["none", "upstream"]), default="none", show_default=True,
              help="Who writes the summaries: none (built in, offline: a summary that keeps nothing, so the report "
                   "shows what the proxy keeps by itself) or upstream (the configured upstream's summary model)")
@click.option("--model", default=None, help="Model whose window and prices to use [default: the recording's]")
@_json_option
def replay(source: str, tenant: str | None, summariser: str, model: str | None, as_json: bool,
           **options: Any) -> None:
    """Replay SOURCE through the context engine, offline and deterministically, and report what it kept.

    SOURCE is a recorded session file (Claude Code session JSONL, Codex rollout JSONL, a Gemini CLI saved chat, a
    JSON list of Chat messages or an object holding one under "messages") or a session in the store. Each
    recorded reply answers its step; the log is a throwaway one, the store is only read. The JSONL formats' times
    drive the clock: a request after an idle gap past --cache-ttl finds the cache cold. Reports, per compaction
    and at the end: tokens before and after, prefix changes, cost at the model's prices, and the retention of
    written paths, commands, error lines, user constraints and the last three written files (exact), beside plain
    truncation.
    """
    from pathlib import Path

    from proxy.app import engine_settings
    from proxy.replay import report as replay_report
    from proxy.replay.lab import replay as run_replay
    from proxy.replay.sources import Recording, SourceError, read_file, read_store

    settings = settings_from(options)
    path = Path(source)

    async def recording() -> Recording:
        if path.is_file():
            try:
                return read_file(path)
            except SourceError as exc:
                raise click.BadParameter(str(exc), param_hint="SOURCE") from None
        async with _opened(settings.store) as log:
            key = await _resolve(log, source, tenant)
            found = await read_store(log, key)
        if not found.items:
            raise click.ClickException(f"no session {source!r} under tenant {key.tenant!r}")
        return found

    async def work() -> dict[str, Any] | str:
        import aiohttp

        from proxy.summarycall import summary_completer

        recorded = await recording()
        chosen = model or recorded.model
        if summariser == "none":
            done = await run_replay(recorded, engine_settings(settings), summariser=summariser, model=chosen)
        else:
            async with aiohttp.ClientSession() as client:
                complete = summary_completer(client, settings, {}, settings.summary_model or chosen,
                                             recorded.dialect)
                done = await run_replay(recorded, engine_settings(settings), complete=complete,
                                        summariser=summariser, model=chosen)
        return done.to_json() if as_json else replay_report.render(done)

    result = _run(work)
    click.echo(orjson.dumps(result, option=orjson.OPT_SORT_KEYS).decode() if isinstance(result, dict) else result)


@main.command()
@serve_options
def check(**options: Any) -> None:
    """What serve would do with these flags: open and ping the store, probe each upstream (reachable, answering,
    at a path that looks right) and say where requests would go. Prints a line each; exits 1 if any failed."""
    from proxy.probe import probe_all

    settings = settings_from(options)
    url = settings.store
    problem = asyncio.run(preflight.store_problem(url))  # as serve's start-up judges it: opened, answering, writable
    if problem is not None:
        click.echo(f"store {redacted(url)}: failed: {problem}", err=True)
    else:
        click.echo(f"store {redacted(url)}: ok")
    probed = asyncio.run(probe_all(settings))
    for found in probed:
        click.echo(found.line, err=not found.ok)
    if problem is not None or not all(found.ok for found in probed):
        raise SystemExit(1)


main.add_command(run)
main.add_command(demo)
