"""The ``ctxproxy run`` command: flags, then ``proxy.launch.run``."""

from __future__ import annotations

import asyncio
import logging.config
import os
import sys
from pathlib import Path
from typing import Any

import click
import cloup

from proxy.launch.agents import AGENTS
from proxy.launch.programs import find_program, missing_line
from proxy.launch.run import (
    Closing,
    Launch,
    env_lines,
    exit_line,
    figures,
    launch_agent,
    new_session,
    run_log_path,
    served_root,
)
from proxy.logs import default_log_config
from proxy.preflight import check_store, check_upstreams
from proxy.serveflags import option_groups, settings_from
from proxy.sessions import valid_session


def _session(value: str | None) -> str | None:
    if value is not None and not valid_session(value):
        raise click.BadParameter("1-128 characters of A-Za-z0-9._:-", param_hint="--session")
    return value


def _upstreams_from_the_environment(agent: str, options: dict[str, Any]) -> None:
    """Where the user's environment already sends the agent (their gateway) is the upstream of that door, unless
    a flag or its ``CTXPROXY_*`` variable (both reach ``options``) names one."""
    for door, url in AGENTS[agent].endpoints(os.environ).items():
        if options.get(door) is None:
            options[door] = url


def _log_to(path: Path | None, level: str, fmt: str) -> Path | None:
    """Send the embedded proxy's log to ``path`` (made on its first record), or to stderr where it is None or
    its directory cannot be made; the file it goes to."""
    config = default_log_config(level, fmt)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            path = None
        else:
            config["handlers"] = {"file": {"class": "logging.FileHandler", "filename": str(path), "delay": True,
                                           "encoding": "utf-8", "formatter": "default", "filters": ["redact"]}}
            config["root"]["handlers"] = ["file"]
    logging.config.dictConfig(config)
    return path


@cloup.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
@cloup.option_group(
    "Run",
    click.option("--proxy", "proxy_url", default=None, metavar="URL",
                 help="Use the proxy already serving at URL instead of starting one (the closing line's figures "
                      "are read from --store when it is given)"),
    click.option("--session", default=None, help="Session name [default: AGENT-YYYYMMDD-HHMMSS-xxxx]"),
    click.option("--keep-agent-compaction", is_flag=True,
                 help="Leave the agent's own auto-compaction on (the proxy answers it from its checkpoint)"),
    click.option("--print-env", is_flag=True,
                 help="Print the variables (export lines) and arguments (an alias) the agent would run with, and "
                      "exit; its files are kept"),
    click.option("--verbose", is_flag=True,
                 help="Log the embedded proxy to the terminal the agent draws on [default: to a file the closing "
                      "line names]"),
)
@option_groups(embedded=True)
@click.argument("agent", type=click.Choice(list(AGENTS)))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(agent: str, args: tuple[str, ...], proxy_url: str | None, session: str | None, keep_agent_compaction: bool,
        print_env: bool, verbose: bool, **options: Any) -> None:
    """Run AGENT (claude, codex, opencode, pi, aider, qwen, gemini) through the proxy: ctxproxy run [FLAGS] AGENT
    [-- ARGS…]. The flags serve takes go before AGENT; everything after it goes to the agent.

    The agent's own auto-compaction is turned off (the proxy compacts), an endpoint the environment already
    sends the agent to is the upstream (unless --upstream and the like say otherwise), nothing is written into
    its config files or its home, and on exit one line says what the run saved.
    """
    name = _session(session) or new_session(agent)
    if print_env:
        settings = settings_from(options)
        click.echo(env_lines(agent, served_root(settings, proxy_url), name, keep_agent_compaction))
        return
    store_named = options.get("store") is not None
    if proxy_url is None:
        _upstreams_from_the_environment(agent, options)
    settings = settings_from(options)
    program = find_program(AGENTS[agent].command)
    if program is None:
        raise click.ClickException(missing_line(agent, AGENTS[agent].command))
    reads_store = proxy_url is None or store_named  # --proxy: a store of our own only when one is named
    if reads_store:  # one line (exit 2) for a store that cannot be opened or written
        check_store(settings)
    if proxy_url is None:
        check_upstreams(settings)
    # The agent owns the terminal: the embedded proxy logs to a file (warnings, unless --log-level says more).
    embedded_log = run_log_path(name) if proxy_url is None and not verbose else None
    log = _log_to(embedded_log, options.get("log_level") or "WARNING", settings.log_format)
    launch = Launch(agent, list(args[1:] if args[:1] == ("--",) else args), settings, name, proxy_url,
                    keep_agent_compaction)
    status = asyncio.run(launch_agent(launch, program))
    for handler in logging.getLogger().handlers:  # the file holds every record before the closing line names it
        handler.flush()
    served = None if proxy_url is not None else launch.tenants
    found = asyncio.run(figures(settings, name, served)) if reads_store else None
    closing = Closing(name, served_root(settings, proxy_url), settings.store if proxy_url is None else None,
                      launch.failures, log if log is not None and log.exists() else None)
    click.echo(exit_line(closing, found), err=True)
    sys.exit(status)
