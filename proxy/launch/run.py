"""``ctxproxy run AGENT``: the agent in the foreground, through an embedded (or running) proxy, then one line.

The embedded proxy is the app ``serve`` runs, on a free loopback port, for as
long as the agent runs. The agent inherits the terminal (stdin, stdout,
stderr) and the process group, so Ctrl-C, Ctrl-Z and window resizes reach it
from the terminal itself: while ``ctxproxy`` is the terminal's foreground job,
SIGINT and SIGQUIT are left to the agent (the agent decides what they mean).
Otherwise (no terminal, or sent by ``kill``) they are passed on, as SIGTERM,
SIGHUP, SIGUSR1 and SIGUSR2 are; an agent still running ``GRACE_SECONDS`` after
a SIGTERM, SIGHUP, SIGINT or SIGQUIT it was passed is killed. The agent dies
with ``ctxproxy`` (Linux: a parent-death signal), so a ``kill -9`` of the
launcher leaves no agent behind; the launcher writes no file but its log (a recipe's files
are memory files read through ``/proc``, gone with the process; where there are
none, a temporary directory removed after the run). Its exit
status is the agent's (128 + N after signal N).

The agent owns the terminal, so the embedded proxy's own log goes to a file
(``run_log_path``; ``--verbose``: the terminal), made only when something is
logged, and named in the closing line. One thing is said at once: the first
request the embedded proxy failed (an unreachable or refusing upstream), in one
line, so a run against a wrong upstream is not minutes of silence while the
agent retries; the closing line counts them all.

The closing line is read from the store, not from this process's metrics, so
it is the same with ``--proxy`` (a proxy already serving, over the same
``--store``). It counts the session of that name and its sub-agents'
(``SESSION/agent``) under the tenants the embedded proxy served, not another
tenant's use of the same name; its compactions by kind: model summaries,
masking batches (old tool outputs shortened, no model call) and model-free
checkpoints (no summary could be had). The embedded proxy is gone after the
run, so the line gives the command that serves its inspector over the same
store, then the session's page.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

import aiohttp
import platformdirs
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.context.log.tiers import TierCounts, tiers_in_log
from proxy.errors import ProxyError
from proxy.launch.agents import AGENTS, Plan, Target, agent_environ, agent_plan
from proxy.savings import SavingsCache, UsageTotals, saved_text
from proxy.sessions import credential, tenant_of
from proxy.settings import Settings, redacted
from proxy.store import open_store
from proxy.store.base import SessionInfo, SessionKey

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
#: The terminal sends these to the whole foreground group, the agent included: passed on only when it did not.
FROM_THE_TERMINAL = (signal.SIGINT, signal.SIGQUIT)
#: Signals that ask the agent to end: one it ignores for this long is killed.
ENDING = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
GRACE_SECONDS = 5.0
PR_SET_PDEATHSIG = 1


@dataclass
class Failures:
    """The requests the embedded proxy answered with a server error (5xx): how many, and the first one's cause."""

    count: int = 0
    first: str | None = None


@dataclass(frozen=True)
class Launch:
    agent: str
    args: Sequence[str]
    settings: Settings
    session: str
    #: A proxy already serving (its root URL), instead of an embedded one.
    proxy: str | None = None
    keep_compaction: bool = False
    #: The tenants the embedded proxy served (filled while it runs): whose figures the closing line sums.
    tenants: set[str] = field(default_factory=set)
    #: The requests the embedded proxy failed (filled while it runs).
    failures: Failures = field(default_factory=Failures)


def new_session(agent: str, clock: float | None = None) -> str:
    """``AGENT-YYYYMMDD-HHMMSS-xxxx``: sorts by start time, and two runs in one second still differ."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(clock))
    return f"{agent}-{stamp}-{secrets.token_hex(2)}"


def served_root(settings: Settings, proxy: str | None) -> str:
    """The proxy the agent talks to: ``--proxy``, else where ``serve`` with the same flags listens."""
    return (proxy or f"http://{settings.host}:{settings.port}").rstrip("/")


class MemoryFiles:
    """A recipe's files as memory files (``memfd``), read at ``/proc/PID/fd/N``: they live exactly as long as this
    process, so even a ``kill -9`` leaves nothing on disk."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def put(self, name: str, content: bytes) -> str:
        fd = os.memfd_create(f"ctxproxy-{name}")
        self._fds.append(fd)
        os.fchmod(fd, 0o600)  # a memfd starts at 0777, and Gemini CLI skips a settings file others may write
        with os.fdopen(os.dup(fd), "wb") as out:
            out.write(content)
        return f"/proc/{os.getpid()}/fd/{fd}"

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.pop())


class DirectoryFiles:
    """A recipe's files in a directory made on the first one (``--print-env``: they must outlive this process).

    It is made in ctxproxy's state directory, not in /tmp: Gemini CLI skips a settings file with a directory
    above it that others may write."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.directory: Path | None = None

    def put(self, name: str, content: bytes) -> str:
        if self.directory is None:
            (parent := Path(platformdirs.user_state_dir("ctxproxy")) / "files").mkdir(parents=True, exist_ok=True)
            self.directory = Path(tempfile.mkdtemp(prefix=f"{self.agent}-", dir=parent))
        (path := self.directory / name).write_bytes(content)
        return str(path)

    def close(self) -> None:
        """Remove the directory (where there are no memory files, after the run)."""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def tenant_recorder(tenants: set[str]) -> Middleware:
    """A middleware noting the tenant of every request the embedded proxy serves (only the agent calls it)."""

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        tenants.add(tenant_of(credential(request.headers, request.query)))
        return await handler(request)

    return record


def failure_cause(exc: BaseException) -> str:
    """A failed request's cause in words: the upstream's address and what its connection did, where the failure
    was one (the error chain holds aiohttp's ``ClientConnectorError``), else the error the client was answered."""
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, aiohttp.ClientConnectorError):
        seen = seen.__cause__ or seen.__context__
    if seen is not None:
        where, error = f"upstream {seen.host}:{seen.port}", seen.os_error
        if isinstance(error, ConnectionRefusedError):
            return f"{where} refused the connection"
        if isinstance(seen, aiohttp.ClientConnectorDNSError) or isinstance(error, socket.gaierror):
            return f"{where}: no such host"
        return f"{where} could not be reached ({error.strerror or error})"
    message = exc.message if isinstance(exc, ProxyError) else "internal proxy error"
    return message.rstrip(".")


def failure_recorder(failures: Failures, announce: Callable[[str], None]) -> Middleware:
    """A middleware counting the requests the embedded proxy answered with a server error, ``announce`` called
    with the first one's cause (the rest wait for the closing line: one line, not one per retry)."""

    def failed(cause: str) -> None:
        failures.count += 1
        if failures.first is None:
            failures.first = cause
            announce(cause)

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException:
            raise
        except Exception as exc:
            if not isinstance(exc, ProxyError) or exc.status >= 500:
                failed(failure_cause(exc))
            raise
        if response.status >= 500:
            failed(f"the upstream answered {response.status}")
        return response

    return record


def announce_failure(cause: str) -> None:
    """The first failed request, one line on the terminal the agent shares (later ones: the closing line)."""
    print(f"ctxproxy: a request failed: {cause} (the closing line counts any more)", file=sys.stderr, flush=True)


def run_log_path(session: str) -> Path:
    """Where the embedded proxy logs during ``run`` (unless ``--verbose``): the user's state directory."""
    return Path(platformdirs.user_state_dir("ctxproxy")) / "logs" / f"run-{session}.log"


@contextlib.asynccontextmanager
async def proxy_root(launch: Launch) -> AsyncIterator[str]:
    if launch.proxy is not None:
        yield launch.proxy.rstrip("/")
        return
    from proxy.app import create_app
    from proxy.server import serving

    app = create_app(launch.settings)
    app.middlewares.append(tenant_recorder(launch.tenants))
    app.middlewares.append(failure_recorder(launch.failures, announce_failure))
    async with serving(app, launch.settings) as root:
        yield root


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process dies (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()  # looked up before the fork

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # this process died before the signal was asked for
            os._exit(128 + signal.SIGKILL)

    return preexec


def _terminal_sent_it() -> bool:
    """Whether a SIGINT or SIGQUIT came from the terminal (we are its foreground job, the agent with us)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError):
        return False


async def run_agent(argv: Sequence[str], env: Mapping[str, str], grace: float = GRACE_SECONDS) -> int:
    """Run ``argv`` in the foreground until it exits; its status (128 + N when signal N ended it)."""
    loop = asyncio.get_running_loop()
    proc = await asyncio.create_subprocess_exec(*argv, env=dict(env), preexec_fn=_die_with_parent())
    killer: asyncio.TimerHandle | None = None

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    def forward(sig: signal.Signals) -> None:
        nonlocal killer
        if sig in FROM_THE_TERMINAL and _terminal_sent_it():
            return
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            proc.send_signal(sig)
        if sig in ENDING and killer is None:
            killer = loop.call_later(grace, kill)

    for sig in (*FROM_THE_TERMINAL, *FORWARDED):
        loop.add_signal_handler(sig, forward, sig)
    try:
        code = await proc.wait()
    finally:
        if killer is not None:
            killer.cancel()
        for sig in (*FROM_THE_TERMINAL, *FORWARDED):
            loop.remove_signal_handler(sig)
    return 128 - code if code < 0 else code


@dataclass
class RunFigures:
    """A session's figures, summed over its sub-agents and the run's tenants."""

    infos: list[SessionInfo]
    totals: UsageTotals
    compactions: TierCounts = field(default_factory=TierCounts)


async def figures(settings: Settings, session: str, tenants: Collection[str] | None = None) -> RunFigures:
    """The session's figures under ``tenants`` (None: every tenant's)."""
    store = await open_store(settings.store)
    try:
        infos = [i async for i in store.sessions() if (i.session == session or i.session.startswith(session + "/"))
                 and (tenants is None or i.tenant in tenants)]
        cache, totals, compactions = SavingsCache(), UsageTotals(), TierCounts()
        for info in infos:
            totals.merge(await cache.of(store, info))
            compactions.merge(await tiers_in_log(store, SessionKey(info.tenant, info.session)))
    finally:
        await store.aclose()
    return RunFigures(infos, totals, compactions)


@dataclass(frozen=True)
class Closing:
    """What the closing line says besides the store's figures."""

    session: str
    #: The proxy the agent was sent to (``--proxy``) or where ``serve`` with the run's flags listens.
    root: str
    #: The store the run logged to: its inspector is served by ``serve --store`` (None: ``--proxy`` serves it).
    store: str | None = None
    failures: Failures = field(default_factory=Failures)
    #: The embedded proxy's log file, when anything was logged to it.
    log: Path | None = None


def inspector_command(store: str, root: str) -> str:
    """The command that serves the inspector over ``store`` where ``root`` says, with a fresh admin token (the one
    to sign in with): the embedded proxy, and its inspector, ended with the run."""
    where = urlsplit(root)
    flags = ["--store", redacted(store), "--admin-token", secrets.token_urlsafe(16)]
    if where.hostname and where.hostname != Settings.host:
        flags += ["--host", where.hostname]
    if where.port and where.port != Settings.port:
        flags += ["--port", str(where.port)]
    return shlex.join(["ctxproxy", "serve", *flags])


def exit_line(closing: Closing, run: RunFigures | None) -> str:
    """``ctxproxy: session S: N requests (F failed: cause), 2 summaries, 5 masking batches, …saved; log FILE;
    inspector: ctxproxy serve … then URL`` (one line, for people and scripts); without figures (``--proxy`` and no
    ``--store``: no store of its own is opened) ``ctxproxy: session S; inspector URL``."""
    session, root = closing.session, redacted(closing.root)
    main = next((i for i in run.infos if i.session == session), None) if run is not None else None
    where = (f"{root}/ui/sessions/{quote(main.tenant, safe='')}/{quote(session, safe='')}"
             if main is not None else f"{root}/ui")
    inspector = (f"inspector: {inspector_command(closing.store, closing.root)}, then {where}"
                 if closing.store is not None else f"inspector {where}")
    log = f"; log {closing.log}" if closing.log is not None else ""
    if run is None:
        return f"ctxproxy: session {session}{log}; {inspector}"
    t, failed = run.totals, closing.failures  # a failed request left no reply in the log
    failures = f" ({failed.count:,} failed: {failed.first})" if failed.count else ""
    return (f"ctxproxy: session {session}: {t.replies + failed.count:,} requests{failures}, "
            f"{run.compactions.text()}, {saved_text(t)}{log}; {inspector}")


def agent_argv(agent: str, program: str, plan: Plan, args: Sequence[str]) -> list[str]:
    """The recipe's arguments before the user's, unless the user's name a command that calls no model (``pi
    install …``: the recipe's flags would turn the command into a prompt)."""
    if args[:1] and args[0] in AGENTS[agent].bare_commands:
        return [program, *args]
    return [program, *plan.args, *args]


async def launch_agent(launch: Launch, program: str) -> int:
    """Run the agent through the proxy and return its status; the closing line is printed by the caller."""
    files = MemoryFiles() if hasattr(os, "memfd_create") else DirectoryFiles(launch.agent)
    try:
        async with proxy_root(launch) as root:
            target = Target(root, launch.session, launch.keep_compaction, files, os.environ)
            plan = agent_plan(launch.agent, target)
            env = {**agent_environ(os.environ), **plan.env}
            return await run_agent(agent_argv(launch.agent, program, plan, launch.args), env)
    finally:
        files.close()


def env_lines(agent: str, root: str, session: str, keep_compaction: bool) -> str:
    """``export NAME=value`` lines for a shell (values quoted), the agent's arguments as an alias, and where the
    files are."""
    files = DirectoryFiles(agent)
    plan = agent_plan(agent, Target(root, session, keep_compaction, files, os.environ))
    lines = [f"export {name}={shlex.quote(value)}" for name, value in plan.env.items()]
    command = AGENTS[agent].command
    if plan.args:
        lines.append(f"alias {command}={shlex.quote(shlex.join([command, *plan.args]))}")
    if files.directory is not None:
        lines.append(f"# files for {command} in {files.directory} (remove it when done)")
    return "\n".join(lines)
