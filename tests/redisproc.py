"""A private redis-server for tests: started on a given port and dir, stoppable and restartable.

Outage tests stop a server (or kill it) and start it again on the same port and
dir, so with ``--appendonly yes`` the data survives, as in production.
``RedisClusterProcess`` builds a real Redis Cluster out of several of them.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if the process does not exit within ``timeout``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: all held open at once, so the kernel cannot hand out one twice."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


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
        terminate(self._running(), timeout)
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


class RedisClusterProcess:
    """A throwaway Redis Cluster: ``masters`` redis-server primaries, no replicas, on free ports.

    Each node is a ``RedisProcess`` with its own dir (and so its own
    ``nodes-PORT.conf``), so a node can be stopped and started again and rejoin
    with the slots it had. ``start`` returns only once every node reports
    ``cluster_state:ok``.
    """

    def __init__(self, dir: Path, masters: int = 3, extra_args: list[str] | None = None) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 primaries")
        self.dir = Path(dir)
        self.nodes: list[RedisProcess] = []
        ports = free_ports(2 * masters)
        for port, bus_port in zip(ports[::2], ports[1::2], strict=True):
            # The bus port is explicit: the default, port + 10000, overflows for ephemeral ports.
            args = ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-port", str(bus_port), *(extra_args or [])]
            self.nodes.append(RedisProcess(port, self.dir / str(port), args))

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """The store URL: the first node as seed, ``cluster=1`` for ``RedisFactLog.from_url``."""
        return f"redis://127.0.0.1:{self.ports[0]}/0?cluster=1"

    def start(self, timeout: float = 30.0) -> None:
        try:
            for node in self.nodes:
                node.start()
            subprocess.run(
                [REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                 "--cluster-replicas", "0", "--cluster-yes"],
                check=True, capture_output=True, timeout=timeout,
            )
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise

    def cluster_state(self, port: int) -> str | None:
        """``cluster_state`` as the node on ``port`` reports it, or ``None`` when it does not answer."""
        try:
            out = subprocess.run([REDIS_CLI, "-p", str(port), "CLUSTER", "INFO"], capture_output=True, text=True,
                                 timeout=5, check=True).stdout
        except (subprocess.SubprocessError, OSError):
            return None
        for line in out.splitlines():
            name, _, value = line.strip().partition(":")
            if name == "cluster_state":
                return value
        return None

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Poll ``CLUSTER INFO`` on every node until all say ``cluster_state:ok``."""
        deadline = time.monotonic() + timeout
        pending = list(self.ports)
        while pending:
            pending = [port for port in pending if self.cluster_state(port) != "ok"]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster nodes {pending} not ok within {timeout}s; see {self.dir}")
            # Pause between polls; the condition above is what ends the wait.
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None:
                node.stop()

    def __enter__(self) -> RedisClusterProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
