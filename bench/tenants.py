"""One request beside the others (issue 23): another tenant's latency while a large request is served.

    python3 -m bench.tenants [--before DIR] [--write]

Runs ``bench.fakeserver`` and a real ``python3 -m proxy serve`` (SQLite store
in a temporary directory) as subprocesses, then for each large request (a body
of 8 MiB and of 30 MiB, one message of one repeated character, the tokenizer's
worst case, and a history of 300,000 short messages) sends it on a session of
its own while another tenant (another credential, another session) sends
small requests one after the other until the large one is answered. Reports
that tenant's latency (median and worst), the large request's time, and the
proxy's resident memory (``/proc/PID/statm``) before, right after, and after
3 s idle. ``--before DIR`` runs the same against the proxy in ``DIR`` (e.g. a
``git archive`` of an earlier commit) first, for a before/after table.
``--write`` replaces the section ``## One request beside the others (issue 23)``
of ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

from bench.latency import ROOT, spawn, wait_http, write_doc
from tests.redisproc import free_port

SECTION = "## One request beside the others (issue 23)"
PAGE = os.sysconf("SC_PAGE_SIZE")
SMALL = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
IDLE = 3.0


def rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20


def large_bodies() -> list[tuple[str, bytes]]:
    def one(mib: int) -> bytes:
        return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "a" * (mib * 2**20 - 64)}]})

    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(300_000)]
    return [("8 MiB body", one(8)), ("30 MiB body", one(30)),
            ("300,000 messages", orjson.dumps({"model": "m", "messages": history}))]


async def beside(http: aiohttp.ClientSession, base: str, name: str, body: bytes, pid: int) -> dict[str, float]:
    tag = "".join(c for c in name if c.isalnum())
    """The large request on a session of its own; the other tenant's small requests until it is answered."""
    before = rss_mb(pid)
    latencies: list[float] = []
    big = asyncio.create_task(http.post(f"{base}/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": "Bearer large-tenant", "X-Session-Id": f"big-{tag}"}))
    started = time.perf_counter()
    i = 0
    while not big.done():
        t0 = time.perf_counter()
        async with http.post(f"{base}/chat/completions", data=SMALL, headers={
                "Content-Type": "application/json", "Authorization": "Bearer other-tenant",
                "X-Session-Id": f"small-{tag}-{i}"}) as resp:
            await resp.read()
            if resp.status != 200:
                raise SystemExit(f"small request: {resp.status} {(await resp.read())[:300]!r}")
        latencies.append(time.perf_counter() - t0)
        i += 1
    resp = await big
    async with resp:
        await resp.read()
        if resp.status != 200:
            raise SystemExit(f"{name}: {resp.status} {(await resp.read())[:300]!r}")
    seconds = time.perf_counter() - started
    after = rss_mb(pid)
    await asyncio.sleep(IDLE)
    return {"p50_ms": statistics.median(latencies) * 1000, "max_ms": max(latencies) * 1000, "count": len(latencies),
            "large_s": seconds, "rss_before": before, "rss_after": after, "rss_idle": rss_mb(pid)}


async def run(code: Path, upstream: str, workdir: Path) -> dict[str, dict[str, float]]:
    port = free_port()
    proxy = spawn(f"proxy-{port}", [sys.executable, "-m", "proxy", "serve", "--upstream", upstream,
                                    "--store", f"sqlite:///{workdir}/facts-{port}.db", "--port", str(port),
                                    "--host", "127.0.0.1", "--context-window", "100000000"], workdir, cwd=code)
    results: dict[str, dict[str, float]] = {}
    try:
        timeout = aiohttp.ClientTimeout(total=900)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await wait_http(http, f"http://127.0.0.1:{port}/healthz", proxy)
            base = f"http://127.0.0.1:{port}/v1"
            for _ in range(3):  # warm: the encoding loaded, the first connections made
                async with http.post(f"{base}/chat/completions", data=SMALL,
                                     headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
            for name, body in large_bodies():
                results[name] = await beside(http, base, name, body, proxy.proc.pid)
                print(f"  {code}: {name}: {results[name]}", flush=True)
    finally:
        proxy.stop()
    return results


def table(label: str, results: dict[str, dict[str, float]]) -> str:
    return "\n".join(
        f"| {label} | {name} | {r['p50_ms']:,.0f} ms | {r['max_ms']:,.0f} ms | {r['large_s']:.1f} s | "
        f"{r['rss_before']:,.0f} → {r['rss_after']:,.0f} → {r['rss_idle']:,.0f} MB |"
        for name, r in results.items())


async def amain(opts: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        up_port = free_port()
        fake = spawn("fakeupstream", [sys.executable, "-m", "bench.fakeserver", "--port", str(up_port)], workdir)
        try:
            async with aiohttp.ClientSession() as http:
                await wait_http(http, f"http://127.0.0.1:{up_port}/healthz", fake)
            upstream = f"http://127.0.0.1:{up_port}/v1"
            rows = []
            if opts.before is not None:
                rows.append(table("before", await run(Path(opts.before).resolve(), upstream, workdir)))
            rows.append(table("after", await run(ROOT, upstream, workdir)))
        finally:
            fake.stop()
    load = os.getloadavg()[0]
    return (f"{SECTION}\n\n`python3 -m bench.tenants --before DIR --write` (DIR: `git archive 19399d6`): a real "
            "proxy subprocess (SQLite) and `bench.fakeserver`; the large request on its own session while another "
            "tenant sends small requests one after the other until it is answered; "
            f"{platform.python_version()}, {os.cpu_count()} cores shared with other work "
            f"(load average {load:.1f} at the end).\n\n"
            "| proxy | large request | other tenant, median | other tenant, worst | large request | "
            f"proxy RSS: before → answered → {IDLE:.0f} s idle |\n|---|---|---:|---:|---:|---|\n"
            + "\n".join(rows) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a tree holding the proxy to compare with (run first)")
    parser.add_argument("--write", action="store_true", help="replace the section in docs/BENCHMARKS.md")
    opts = parser.parse_args()
    text = asyncio.run(amain(opts))
    print(text)
    if opts.write:
        write_doc(text, heading=SECTION)


if __name__ == "__main__":
    main()
