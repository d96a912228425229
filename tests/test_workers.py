"""``ctxproxy serve --workers 2``: one port, two processes, metrics summed exactly, and nothing left behind.

The proxy is a real ``python3 -m proxy serve --workers 2`` child against the
fake upstream served by the test's event loop. Requests and scrapes each open a
fresh connection, so the kernel (SO_REUSEPORT) spreads them over both workers.
Every wait is a bounded poll on a condition; the process tree is killed in
``finally`` whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakeupstream import FakeUpstream
from tests.redisproc import free_port

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = 40
SESSIONS = 8
TIMEOUT = 30.0


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid``, from /proc (no psutil)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def listening_sockets(port: int) -> int:
    """Sockets in LISTEN on 127.0.0.1:port: one per worker with SO_REUSEPORT."""
    needle = f"0100007F:{port:04X}"
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == needle and fields[3] == "0A":
            count += 1
    return count


async def poll(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.05)  # polling other processes: there is nothing to await


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"
        self.workers: list[int] = []


@pytest.fixture
async def served(aiohttp_server: Any, tmp_path: Path) -> AsyncIterator[Served]:
    upstream = await aiohttp_server(FakeUpstream().app())
    port = free_port()
    log = tmp_path / "proxy.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXPROXY_", "PROMETHEUS_"))}
    args = [sys.executable, "-m", "proxy", "serve", "--workers", "2", "--host", "127.0.0.1", "--port", str(port),
            "--upstream", str(upstream.make_url("/v1")), "--store", f"sqlite:///{tmp_path}/facts.db"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    served = Served(proc, port, log)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
            return listening_sockets(port) == 2

        await poll(ready, "two workers listening")
        served.workers = children(proc.pid)
        assert len(served.workers) == 2, served.workers
        yield served
    finally:
        for pid in [proc.pid, *served.workers]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=10)


async def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with (aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
                http.get(url + "/metrics") as resp):
        assert resp.status == 200
        text = await resp.text()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_two_workers_count_every_request_once_and_stop_on_sigterm(served: Served) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        for i in range(REQUESTS):
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": f"step {i}"}]}
            async with http.post(served.url + "/v1/chat/completions", data=orjson.dumps(body),
                                 headers={"Authorization": "Bearer sk-workers",
                                          "X-Session-Id": f"w{i % SESSIONS}"}) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()

    for _ in range(12):  # fresh connections: the kernel hands the scrapes to either worker
        samples = await scrape(served.url)
        requests = sum(v for (name, _), v in samples.items() if name == "ctxproxy_requests_total")
        assert requests == REQUESTS
        assert samples[("ctxproxy_requests_total", frozenset({("route", "chat"), ("status", "200")}))] == REQUESTS
        assert samples[("ctxproxy_overhead_seconds_count", frozenset())] == REQUESTS
        # Per worker, summed over live workers: each session counts once per worker that served it.
        assert SESSIONS <= samples[("ctxproxy_sessions_active", frozenset())] <= 2 * SESSIONS
        rss = {dict(labels)["pid"] for (name, labels), v in samples.items()
               if name == "process_resident_memory_bytes" and v > 0}
        assert rss == {str(pid) for pid in served.workers}

    served.proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(served.proc.wait, TIMEOUT)
    assert code == 0, served.log.read_text()[-2000:]
    await poll(lambda: not any(alive(pid) for pid in served.workers), "no worker left after SIGTERM")
    assert listening_sockets(served.port) == 0


async def test_a_worker_that_dies_stops_the_others_and_the_parent_fails(served: Served) -> None:
    victim, other = served.workers
    os.kill(victim, signal.SIGKILL)
    code = await asyncio.to_thread(served.proc.wait, TIMEOUT)
    assert code == 1
    await poll(lambda: not alive(other), "the surviving worker stopped")
    assert "exited unexpectedly with signal SIGKILL" in served.log.read_text()
