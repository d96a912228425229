"""The proxy as a real child process (``python3 -m proxy serve``), for crash, concurrency and fuzz tests.

A test that kills the proxy with SIGKILL must not share its process with it, so
these tests run ``ctxproxy serve`` exactly as a user would, against a fake
upstream served by the test process (``aiohttp_server``) over 127.0.0.1.
Readiness is a bounded poll of ``/healthz``; the child's stderr goes to a file
the test can read (log-leak scans) after the process ended.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from tests.redisproc import free_port, terminate

ROOT = Path(__file__).resolve().parent.parent


class ProxyProcess:
    """One ``ctxproxy serve`` child. ``start`` and ``restart`` keep the port, so a client's URL stays valid."""

    def __init__(self, upstream: str, store: str, workdir: Path, args: Sequence[str] = (),
                 *, name: str = "proxy", port: int | None = None) -> None:
        self.upstream = upstream
        self.store = store
        self.workdir = Path(workdir)
        self.args = list(args)
        self.name = name
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}-{self.port}.log"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "proxy", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--upstream", self.upstream, "--store", self.store, "--precompact-threshold", "1", *self.args]

    async def start(self, ready_timeout: float = 20.0) -> None:
        if self.proc is not None:
            raise RuntimeError(f"{self.name} is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        self.starts += 1
        await self.wait_ready(ready_timeout)

    async def wait_ready(self, timeout: float) -> None:
        """Poll ``/healthz`` until 200; fail early if the child exited (bad flags, port taken)."""
        proc = self._running()
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as client:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    self.proc = None
                    raise RuntimeError(f"{self.name} exited with {proc.returncode}: {self.log_tail()}")
                try:
                    async with client.get(self.url + "/healthz") as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.05)  # polling a child process: there is nothing to await
        raise TimeoutError(f"{self.name} not ready within {timeout}s: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush, as in an OOM kill or a power cut of the process."""
        proc = self._running()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        self.proc = None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        terminate(self._running(), timeout)
        self.proc = None

    async def restart(self) -> None:
        await self.start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_bytes(self, field: str = "VmRSS") -> int:
        """Resident set size of the child, from /proc (Linux); ``field="VmHWM"``: its peak since it started."""
        proc = self._running()
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {field} in /proc status")

    def log_bytes(self) -> bytes:
        return self.log_path.read_bytes() if self.log_path.exists() else b""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_bytes().decode(errors="replace").splitlines()[-lines:])

    def _running(self) -> subprocess.Popen[bytes]:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.proc

    def close(self) -> None:
        if self.proc is not None:
            self.stop()

    async def __aenter__(self) -> ProxyProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()
