"""``ctxproxy serve --workers N``: N processes serving one port, to use every core.

The parent (``serve_workers``) starts N workers (``python -m proxy.workers``,
each handed its settings on stdin) and then only supervises: it serves nothing.
Each worker is a whole proxy with its own event loop, store connection and
caches, listening on the same host and port with ``SO_REUSEPORT`` (aiohttp's
``reuse_port=True``), so the kernel spreads incoming connections over them.
Caches per worker are safe because the store arbitrates: appends are
conditional on the log's length and compaction takes a lock in the store, as
with several replicas.

Signals: SIGTERM or SIGINT to the parent is forwarded to every worker as
SIGTERM (each finishes its in-flight requests, as a single ``serve`` does), and
the parent exits 0 once they have all stopped; a second signal kills them at
once. Workers run in their own process
group, so a terminal's Ctrl-C reaches them only through the parent, once; and
they get SIGTERM from the kernel if the parent dies (Linux), so none is
orphaned.

A worker that dies unexpectedly is not restarted: the parent stops the others
and exits 1, and whatever supervises the parent (systemd, Docker's restart
policy, Kubernetes) restarts the whole. A worker only dies on a bug, an OOM
kill or a failed start (port taken, store unreachable at startup); restarting
it in place would hide that behind a server that still answers ``/healthz``.

Metrics: the parent creates a fresh ``PROMETHEUS_MULTIPROC_DIR`` for the
workers (removed when it exits), so ``/metrics`` sums every worker's counters
whichever worker answers the scrape (see ``proxy.metrics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import logging.config
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from types import FrameType

from aiohttp import web

from proxy.settings import Settings

logger = logging.getLogger("proxy.workers")

#: How long the parent waits for workers to finish in-flight requests after SIGTERM before it SIGKILLs them:
#: a little longer than aiohttp's own graceful shutdown (60 s).
STOP_GRACE = 70.0
#: Workers store their active-session count this often (the per-worker gauge; see ``Metrics.refresh``).
GAUGE_REFRESH = 10.0
_PR_SET_PDEATHSIG = 1


class _Supervisor:
    def __init__(self, settings: Settings, metrics_dir: str) -> None:
        self.settings = settings
        self.metrics_dir = metrics_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopping = False
        #: Whether the workers got SIGTERM already: a second one would cut their graceful stop short.
        self.terminated = False

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag and kill(2) here: a handler that took a lock could deadlock against the interrupted code.
        # A second signal (Ctrl-C twice) does not wait for in-flight requests.
        self.signal_all(signal.SIGKILL if self.stopping else signal.SIGTERM)
        self.stopping = self.terminated = True

    def signal_all(self, sig: signal.Signals) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)

    def start(self, index: int) -> None:
        from proxy.metrics import write_worker_pid

        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir}
        proc = subprocess.Popen([sys.executable, "-m", "proxy.workers"], stdin=subprocess.PIPE, env=env,
                                start_new_session=True)
        self.procs.append(proc)
        assert proc.stdin is not None
        with proc.stdin:
            pickle.dump((self.settings, index, os.getpid()), proc.stdin)
        write_worker_pid(self.metrics_dir, index, proc.pid)

    def supervise(self) -> int:
        """Until a signal or a worker's death: 0 after a requested stop, 1 after an unexpected death."""
        while not self.stopping:
            for index, proc in enumerate(self.procs):
                code = proc.poll()
                if code is not None and not self.stopping:
                    logger.error("worker %d (pid %d) exited unexpectedly with %s; stopping the others",
                                 index, proc.pid, _describe(code))
                    self.stopping = True
                    return 1
            time.sleep(0.2)  # the workers are checked periodically; signals are forwarded by the handler at once
        logger.info("stopping %d workers", len(self.procs))
        return 0

    def stop(self) -> int:
        """SIGTERM every worker still running, wait up to STOP_GRACE, SIGKILL what is left. 1 if any failed."""
        from prometheus_client import multiprocess

        if not self.terminated:
            self.signal_all(signal.SIGTERM)
            self.terminated = True
        failed = 0
        deadline = time.monotonic() + STOP_GRACE
        for index, proc in enumerate(self.procs):
            try:
                code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.error("worker %d (pid %d) did not stop within %.0f s; killing it", index, proc.pid, STOP_GRACE)
                proc.kill()
                code = proc.wait()
            if code not in (0, -signal.SIGTERM):
                failed += 1
            multiprocess.mark_process_dead(proc.pid, self.metrics_dir)  # type: ignore[no-untyped-call]
        return 1 if failed else 0


def _describe(code: int) -> str:
    if code >= 0:
        return f"status {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


def serve_workers(settings: Settings, count: int) -> int:
    """Run ``count`` workers on ``settings.host:settings.port`` until stopped; the exit status for the parent."""
    metrics_dir = tempfile.mkdtemp(prefix="ctxproxy-metrics-")
    sup = _Supervisor(settings, metrics_dir)
    previous = {sig: signal.signal(sig, sup.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    from proxy.startup import startup_line  # the parent's line; its workers need none of the launcher's imports

    logger.info("%s", startup_line(settings, workers=count))
    try:
        for index in range(count):
            if sup.stopping:
                break
            sup.start(index)
        status = sup.supervise()
    finally:
        stopped = sup.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return status or stopped


# -- the worker ---------------------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    """Get SIGTERM when the parent dies (Linux); exit now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        raise SystemExit(1)


async def _refresh_gauges(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: this worker's per-worker gauges stored every GAUGE_REFRESH seconds while it serves."""
    from proxy.keys import metrics_key

    metrics = app[metrics_key]

    async def refresh() -> None:
        while True:  # ends when cancelled, at cleanup
            metrics.refresh()
            await asyncio.sleep(GAUGE_REFRESH)

    task = asyncio.create_task(refresh())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def worker_main() -> None:
    """One worker: settings, index and the parent's pid come pickled on stdin (from ``serve_workers``)."""
    settings, index, parent = pickle.load(sys.stdin.buffer)
    assert isinstance(settings, Settings) and isinstance(index, int) and isinstance(parent, int)
    _die_with_parent(parent)
    from proxy.app import create_app
    from proxy.logs import default_log_config
    from proxy.metrics import Metrics
    from proxy.server import run

    logging.config.dictConfig(default_log_config(settings.log_level, settings.log_format))
    metrics = Metrics(multiprocess_dir=os.environ["PROMETHEUS_MULTIPROC_DIR"])
    app = create_app(settings, metrics=metrics)
    app.cleanup_ctx.append(_refresh_gauges)
    logger.info("worker %d (pid %d) serving http://%s:%d", index, os.getpid(), settings.host, settings.port)
    run(app, settings, reuse_port=True)


if __name__ == "__main__":
    worker_main()
