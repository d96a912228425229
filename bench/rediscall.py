"""What one Redis script call costs ctxproxy: latency and client CPU, three ways, against one private redis-server.

    python3 -m bench.rediscall [--calls N]

- ``RedisFactLog``'s path: a script registered with redis-py (``register_script``) on the client
  ``RedisFactLog.from_url`` builds (``PooledRedis``, hiredis parser), as every log append and first read goes;
- redis-py's connection used directly (``pack_command``, ``send_packed_command``, ``read_response``): the
  client's own layers (retry, timeouts per read, command parsing) left out;
- a bare pipelined RESP protocol on hiredis's reader over an asyncio transport: what any Python client on this
  event loop costs at least (``LeanProtocol``, here only to measure against; ctxproxy does not use it).

Each: N sequential calls of a one-``GET`` script after 200 to warm up; p50 and p99 of the call's latency, and
the process's CPU time per call (user + system, ``time.process_time``). The numbers go to issue 21's section
of docs/BENCHMARKS.md by hand: they explain what bounds a fresh session's added latency.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import hiredis
from redis.asyncio import Redis

from proxy.server import event_loop
from proxy.store.redis import RedisFactLog
from tests.redisproc import RedisProcess, free_port

SCRIPT = "return redis.call('GET', KEYS[1])"
SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()


def pack(*args: bytes | str | int) -> bytes:
    """One RESP command."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class LeanProtocol(asyncio.Protocol):
    """Commands written as they come, replies matched in order: the least a client can do per call."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            self.waiting.popleft().set_result(reply)

    def call(self, *args: bytes | str | int) -> asyncio.Future[Any]:
        assert self.transport is not None
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        self.transport.write(pack(*args))
        return future


async def timed(label: str, call: Callable[[], Awaitable[Any]], calls: int) -> str:
    for _ in range(200):
        await call()
    latencies = []
    cpu = time.process_time()
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - started)
    cpu = (time.process_time() - cpu) / calls
    latencies.sort()
    return (f"| {label} | {latencies[calls // 2] * 1e6:.0f} | {latencies[int(calls * 0.99)] * 1e6:.0f} | "
            f"{cpu * 1e6:.0f} |")


async def measure(calls: int) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp, RedisProcess(free_port(), Path(tmp)) as server:
        log = RedisFactLog.from_url(server.url)
        try:
            script = log.client.register_script(SCRIPT)
            await script(keys=["k"], args=[])  # loads it
            assert isinstance(log.client, Redis)  # a plain URL: not a cluster
            pool = log.client.connection_pool

            async def direct() -> Any:
                conn = await pool.get_connection()  # type: ignore[no-untyped-call]
                try:
                    await conn.send_packed_command(conn.pack_command("EVALSHA", SHA, 1, "k"), check_health=False)
                    return await conn.read_response()
                finally:
                    await pool.release(conn)

            host, port = server.url.removeprefix("redis://").split("/")[0].split(":")
            _, lean = await asyncio.get_running_loop().create_connection(LeanProtocol, host, int(port))
            rows = [await timed("redis-py, as `RedisFactLog` calls it", lambda: script(keys=["k"], args=[]), calls),
                    await timed("redis-py's connection, directly", direct, calls),
                    await timed("bare RESP protocol on hiredis", lambda: lean.call("EVALSHA", SHA, 1, "k"), calls)]
            assert lean.transport is not None
            lean.transport.close()
            return rows
        finally:
            await log.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    loop = event_loop()
    try:
        rows = loop.run_until_complete(measure(args.calls))
    finally:
        loop.close()
    print("| client | p50 µs | p99 µs | client CPU µs per call |\n| --- | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
