"""``ctxproxy run AGENT``: the agent in the foreground, through an embedded proxy (or ``--proxy``), then one line.

The embedded proxy is the app ``serve`` runs, on a free loopback port, for as
long as the agent runs. The agent inherits the terminal (stdin, stdout,
stderr) and the process group, so Ctrl-C, Ctrl-Z and window resizes reach it
from the terminal itself; SIGINT and SIGQUIT are then ignored here (the agent
decides what they mean), and SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to
``ctxproxy`` are passed on. Its exit status is ours (128 + N after signal N).

The closing line is read from the store, not from this process's metrics, so
it is the same with ``--proxy`` (a proxy already serving, over the same
``--store``): every tenant's session of that name and its sub-agents'
(``SESSION/agent``) count.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shlex
import signal
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from proxy.launch.agents import AGENTS, Target, agent_env
from proxy.savings import SavingsCache, UsageTotals, saved_text
from proxy.settings import Settings
from proxy.store import open_store
from proxy.store.base import SessionInfo

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
#: The terminal sends these to the whole foreground group, the agent included: not sent twice.
LEFT_TO_THE_AGENT = (signal.SIGINT, signal.SIGQUIT)


@dataclass(frozen=True)
class Launch:
    agent: str
    args: Sequence[str]
    settings: Settings
    session: str
    #: A proxy already serving (its root URL), instead of an embedded one.
    proxy: str | None = None
    keep_compaction: bool = False


def new_session(agent: str, clock: float | None = None) -> str:
    """``AGENT-YYYYMMDD-HHMMSS-xxxx``: sorts by start time, and two runs in one second still differ."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(clock))
    return f"{agent}-{stamp}-{secrets.token_hex(2)}"


def served_root(settings: Settings, proxy: str | None) -> str:
    """The proxy the agent talks to: ``--proxy``, else where ``serve`` with the same flags listens."""
    return (proxy or f"http://{settings.host}:{settings.port}").rstrip("/")


@contextlib.asynccontextmanager
async def proxy_root(launch: Launch) -> AsyncIterator[str]:
    if launch.proxy is not None:
        yield launch.proxy.rstrip("/")
        return
    from proxy.app import create_app
    from proxy.server import serving

    async with serving(create_app(launch.settings), launch.settings) as root:
        yield root


async def run_agent(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``argv`` in the foreground until it exits; its status (128 + N when signal N ended it)."""
    loop = asyncio.get_running_loop()
    proc = await asyncio.create_subprocess_exec(*argv, env=dict(env))
    for sig in LEFT_TO_THE_AGENT:
        loop.add_signal_handler(sig, lambda: None)
    def forward(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            proc.send_signal(sig)

    for sig in FORWARDED:
        loop.add_signal_handler(sig, forward, sig)
    try:
        code = await proc.wait()
    finally:
        for sig in (*LEFT_TO_THE_AGENT, *FORWARDED):
            loop.remove_signal_handler(sig)
    return 128 - code if code < 0 else code


@dataclass
class RunFigures:
    """A session's figures, summed over its tenants and sub-agents."""

    infos: list[SessionInfo]
    totals: UsageTotals

    @property
    def compactions(self) -> int:
        return sum(i.checkpoints for i in self.infos)


async def figures(settings: Settings, session: str) -> RunFigures:
    store = await open_store(settings.store)
    try:
        infos = [i async for i in store.sessions() if i.session == session or i.session.startswith(session + "/")]
        cache, totals = SavingsCache(), UsageTotals()
        for info in infos:
            totals.merge(await cache.of(store, info))
    finally:
        await store.aclose()
    return RunFigures(infos, totals)


def exit_line(session: str, run: RunFigures, inspector_root: str) -> str:
    """``ctxproxy: session S: N requests, K compactions, …; inspector URL`` (one line, for people and scripts)."""
    t = run.totals
    main = next((i for i in run.infos if i.session == session), None)
    where = (f"{inspector_root}/ui/sessions/{quote(main.tenant, safe='')}/{quote(session, safe='')}"
             if main is not None else f"{inspector_root}/ui")
    return (f"ctxproxy: session {session}: {t.replies:,} requests, {run.compactions:,} compactions, "
            f"{saved_text(t)}; inspector {where}")


async def launch_agent(launch: Launch, program: str, workdir: Path) -> int:
    """Run the agent through the proxy and return its status; the closing line is printed by the caller."""
    async with proxy_root(launch) as root:
        target = Target(root, launch.session, launch.keep_compaction, workdir, os.environ)
        env = {**os.environ, **agent_env(launch.agent, target)}
        return await run_agent([program, *launch.args], env)


def env_lines(agent: str, target: Target) -> str:
    """``export NAME=value`` lines for a shell (values quoted), and where the files are."""
    env = agent_env(agent, target)
    lines = [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    if any(target.workdir.iterdir()):
        lines.append(f"# files for {AGENTS[agent].command} in {target.workdir} (remove it when done)")
    return "\n".join(lines)
