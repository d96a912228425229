"""A private redis-server for tests: started on a given port and dir, stoppable and restartable.

Outage tests stop a server (or kill it) and start it again on the same port and
dir, so with ``--appendonly yes`` the data survives, as in production.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers_ping(port: int, timeout: float = 0.5) -> bool:
    """True when a server on ``port`` replies +PONG (not -LOADING, not refused)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisProcess:
    """One redis-server child process. ``extra_args`` come last, so they override the defaults."""

    def __init__(self, port: int, dir: Path, extra_args: list[str] | None = None) -> None:
        self.port = port
        self.dir = Path(dir)
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, ready_timeout: float = 10.0) -> None:
        if self.proc is not None:
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        self.dir.mkdir(parents=True, exist_ok=True)
        args = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(self.dir), *self.extra_args,
        ]
        with open(self.dir / f"redis-{self.port}.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready(ready_timeout)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Poll PING until it answers; fail early if the process died (e.g. port taken)."""
        proc = self._running()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if answers_ping(self.port):
                return
            try:
                # Doubles as the pause between attempts and as the early exit when the server crashed.
                code = proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            self.proc = None
            raise RuntimeError(f"redis-server on port {self.port} exited with {code}; see {self.dir}")
        raise TimeoutError(f"redis-server on port {self.port} did not answer PING within {timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful shutdown (SIGTERM): Redis flushes its AOF first."""
        proc = self._running()
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self.proc = None

    def kill(self) -> None:
        """Abrupt death (SIGKILL), as in a crash or OOM kill."""
        proc = self._running()
        proc.kill()
        proc.wait()
        self.proc = None

    def _running(self) -> subprocess.Popen[bytes]:
        if self.proc is None:
            raise RuntimeError(f"redis-server on port {self.port} is not running")
        return self.proc

    def __enter__(self) -> RedisProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.stop()
