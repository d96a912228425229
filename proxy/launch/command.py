"""The ``ctxproxy run`` command: flags, then ``proxy.launch.run``."""

from __future__ import annotations

import asyncio
import logging.config
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from proxy.launch.agents import AGENTS, Target
from proxy.launch.run import Launch, env_lines, exit_line, figures, launch_agent, new_session, served_root
from proxy.logs import default_log_config
from proxy.serveflags import serve_options, settings_from
from proxy.sessions import valid_session


def _session(value: str | None) -> str | None:
    if value is not None and not valid_session(value):
        raise click.BadParameter("1-128 characters of A-Za-z0-9._:-", param_hint="--session")
    return value


@click.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
@serve_options
@click.option("--proxy", "proxy_url", default=None, metavar="URL",
              help="Use the proxy already serving at URL instead of starting one (its --store gives the figures)")
@click.option("--session", default=None, help="Session name [default: AGENT-YYYYMMDD-HHMMSS-xxxx]")
@click.option("--keep-agent-compaction", is_flag=True,
              help="Leave the agent's own auto-compaction on (the proxy answers it from its checkpoint)")
@click.option("--print-env", is_flag=True,
              help="Print the variables the agent would run with (export lines) and exit; its files are kept")
@click.argument("agent", type=click.Choice(list(AGENTS)))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(agent: str, args: tuple[str, ...], proxy_url: str | None, session: str | None, keep_agent_compaction: bool,
        print_env: bool, **options: Any) -> None:
    """Run AGENT (claude, codex, opencode, pi, aider, qwen, gemini) through the proxy: ctxproxy run [FLAGS] AGENT
    [-- ARGS…]. The flags serve takes go before AGENT; everything after it goes to the agent.

    The agent's own auto-compaction is turned off (the proxy compacts), nothing is written into its config
    files, and on exit one line says what the run saved.
    """
    settings = settings_from(options)
    name = _session(session) or new_session(agent)
    if print_env:
        workdir = Path(tempfile.mkdtemp(prefix=f"ctxproxy-{agent}-"))
        target = Target(served_root(settings, proxy_url), name, keep_agent_compaction, workdir, os.environ)
        click.echo(env_lines(agent, target))
        if not any(workdir.iterdir()):
            workdir.rmdir()
        return
    program = shutil.which(AGENTS[agent].command)
    if program is None:
        raise click.ClickException(f"{AGENTS[agent].command} is not on PATH")
    # The agent owns the terminal: the embedded proxy speaks up only for warnings, unless --log-level says more.
    logging.config.dictConfig(default_log_config(options.get("log_level") or "WARNING", settings.log_format))
    launch = Launch(agent, list(args[1:] if args[:1] == ("--",) else args), settings, name, proxy_url,
                    keep_agent_compaction)
    with tempfile.TemporaryDirectory(prefix=f"ctxproxy-{agent}-") as private:
        status = asyncio.run(launch_agent(launch, program, Path(private)))
    click.echo(exit_line(name, asyncio.run(figures(settings, name)), served_root(settings, proxy_url)), err=True)
    sys.exit(status)

