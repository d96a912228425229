"""The hot path against the floor: ctxproxy ÷ a bare forwarder, on Redis and SQLite, fresh sessions, 16 at once.

Run from the repository root: ``python3 -m bench.hotpath [--quick] [--workers N] [--write]``.

Issue 21's benchmark. One run, one fake upstream (``bench.fakeserver``), one
client (this process); every target its own process: **direct** (the zero),
the **floor** (``bench.floor``, a bare aiohttp forwarder), the **floor with
the log** (``bench.floor --log``, on the private Redis: the floor doing only
the store calls the design cannot skip, the bound of any proxy that keeps its
promises on this stack; its ratios are checked against the targets too), ctxproxy with a
private ``redis-server`` and with a SQLite file, and for ``--workers N`` the
floor with N processes and ctxproxy (redis) with ``--workers N``. Every figure
that matters is a ratio to the floor measured in the same run, the targets
alternating request by request (sequential workloads) or block by block
(concurrent ones, the first of each round rotating), because the machine is
shared and absolute numbers drift between runs.

Workloads, in this order:

- ``memory``: 20,000 small requests over 2,000 sessions of 10 (64 sessions at a time) to the
  floor and both single-process ctxproxies; RSS of each process after 5,000 and after 20,000;
- ``small``: sequential small requests (1 system + 1 user message of ~200 characters), each on a
  **fresh session** (the session's first request: nothing cached, its log created);
- ``large``: sequential ~100k-token bodies (``bench.latency``'s ~300-message agent history) growing by
  one step (the echoed reply and a tool output) per request, on one warm session;
- ``c16``: 16 requests at once, each on a fresh session (``--session-length N``: a fresh session
  every N requests), for blocks of a fixed time: throughput and p99;
- ``w16`` and ``w64``: the same at 16 and 64 at once against the floor with N processes and ctxproxy
  (redis) with ``--workers N``.

Added latency = target - direct at the same percentile. Issue 21's targets, checked for each
single-process ctxproxy: added p50 ≤ 2 x the floor's (small and large), 16-concurrent throughput ≥ 0.5
of the floor's and p99 (client-side, whole request) ≤ 3 x the floor's, RSS growth < 10 % between
request 5,000 and 20,000. Each ctxproxy is also given as a ratio to the floor with the log (what it
costs beyond what the design cannot skip). ``--write`` replaces the section ``## The hot path against the floor
(issue 21)`` of ``docs/BENCHMARKS.md``. ``--proxy-wrapper CMD`` runs the single-process ctxproxies
under CMD (a profiler; ``{key}`` in it becomes ``redis`` or ``sqlite``; see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench.field import Fleet, Runner, Sizes, Target, added, cpu_seconds, growth, machine_busy_seconds, rate, rss_tree
from bench.latency import COMPACTED, MS, SmallConversations, environment, pct, stop_on_sigterm, wait_http, write_doc

SECTION = "## The hot path against the floor (issue 21)"


@dataclass(frozen=True)
class Shape:
    """What this bench adds to ``bench.field.Sizes``."""

    fields: Sizes
    w_blocks: int


FULL = Shape(Sizes(warmup=100, small=800, c16_blocks=4, c64_blocks=0, block_seconds=2.5, large=40, stream=0,
                   mem_sessions=2000, mem_per_session=10, mem_block=2500, mem_check=5000), w_blocks=3)
QUICK = Shape(Sizes(warmup=20, small=150, c16_blocks=2, c64_blocks=0, block_seconds=1.0, large=10, stream=0,
                    mem_sessions=300, mem_per_session=10, mem_block=750, mem_check=750), w_blocks=1)

#: (name, what, limit, higher is better)
GOALS = (
    ("small", "added p50, small request on a fresh session, ÷ floor's", 2.0, False),
    ("large", "added p50, ~100k tokens growing by one step, ÷ floor's", 2.0, False),
    ("c16_rate", "req/s, 16 concurrent, ÷ floor's", 0.5, True),
    ("c16_p99", "p99, 16 concurrent, ÷ floor's", 3.0, False),
    ("rss", "RSS growth, request {check:,} → {total:,}, %", 10.0, False),
)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def _p(t: Target, workload: str, p: float) -> float | None:
    values = t.lat.get(workload)
    return pct(values, p) * MS if values else None


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if v is None else fmt.format(v)


def goal_values(t: Target, floor: Target, direct: Target, sizes: Sizes) -> dict[str, float | None]:
    return {
        "small": _ratio(added(t, direct, "small", 50), added(floor, direct, "small", 50)),
        "large": _ratio(added(t, direct, "large", 50), added(floor, direct, "large", 50)),
        "c16_rate": _ratio(rate(t, "c16"), rate(floor, "c16")),
        "c16_p99": _ratio(_p(t, "c16", 99), _p(floor, "c16", 99)),
        "rss": growth(t, sizes),
    }


def measures_table(targets: list[Target], direct: Target) -> str:
    rows = ["| target | small, fresh session: added p50 / p99 | ~100k tokens +1 step: added p50 / p99 "
            "| 16 concurrent: req/s | 16 concurrent: p50 / p99 | CPU ms per request: small / ~100k / 16 concurrent |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for t in targets:
        if "-w" in t.key:
            continue
        if t is direct:
            cells = [f"{_f(_p(t, w, 50))} / {_f(_p(t, w, 99))} (absolute)" for w in ("small", "large")]
        else:
            cells = [f"{_f(added(t, direct, w, 50), '{:+.2f}')} / {_f(added(t, direct, w, 99), '{:+.2f}')}"
                     for w in ("small", "large")]
        cells += [_f(rate(t, "c16"), "{:.0f}"), f"{_f(_p(t, 'c16', 50))} / {_f(_p(t, 'c16', 99))}",
                  "(serves every target)" if t is direct else
                  " / ".join(_f(t.wall[f"cpu-{w}"] * MS if f"cpu-{w}" in t.wall else None)
                             for w in ("small", "large", "c16"))]
        rows.append(f"| {t.label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def goals_table(ours: list[Target], floor: Target, direct: Target, sizes: Sizes) -> str:
    rows = ["| target | limit | " + " | ".join(t.label for t in ours) + " |",
            "| --- | --- |" + " --- |" * len(ours)]
    vals = {t.key: goal_values(t, floor, direct, sizes) for t in ours}
    for name, what, limit, higher in GOALS:
        cells = []
        for t in ours:
            v = vals[t.key][name]
            met = v is not None and (v >= limit if higher else v < limit if name == "rss" else v <= limit)
            shown = _f(v, "{:+.1f} %" if name == "rss" else "{:.2f}")
            cells.append(f"{shown}: {'met' if met else '**missed**'}")
        bound = ("≥ " if higher else "< " if name == "rss" else "≤ ") + f"{limit:g}"
        rows.append(f"| {what.format(check=sizes.mem_check, total=sizes.mem_total)} | {bound} | "
                    + " | ".join(cells) + " |")
    return "\n".join(rows)


def bound_table(ours: list[Target], bound: Target, direct: Target) -> str:
    """Each ctxproxy against the floor with the log: what it costs beyond what the design cannot skip."""
    measures: list[tuple[str, Callable[[Target], float | None]]] = [
        ("added p50, small request on a fresh session", lambda t: added(t, direct, "small", 50)),
        ("added p50, ~100k tokens growing by one step", lambda t: added(t, direct, "large", 50)),
        ("req/s, 16 concurrent", lambda t: rate(t, "c16")),
        ("p99, 16 concurrent", lambda t: _p(t, "c16", 99)),
        ("CPU per request, 16 concurrent", lambda t: t.wall.get("cpu-c16")),
    ]
    rows = ["| ÷ the floor with the log | " + " | ".join(t.label for t in ours) + " |",
            "| --- |" + " ---: |" * len(ours)]
    rows += [f"| {what} | " + " | ".join(_f(_ratio(value(t), value(bound))) for t in ours) + " |"
             for what, value in measures]
    return "\n".join(rows)


def workers_table(targets: list[Target], n: int) -> str:
    floor = next((t for t in targets if t.key == f"floor-w{n}"), None)
    ours = next((t for t in targets if t.key == f"redis-w{n}"), None)
    if floor is None or ours is None:
        return "(not measured: --workers 1)"
    rows = ["| concurrent | floor, req/s | ctxproxy, req/s | ÷ floor | floor p99 ms | ctxproxy p99 ms | ÷ floor |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for w in ("w16", "w64"):
        a, b = rate(floor, w), rate(ours, w)
        pa, pb = _p(floor, w, 99), _p(ours, w, 99)
        rows.append(f"| {w[1:]} | {_f(a, '{:.0f}')} | {_f(b, '{:.0f}')} | {_f(_ratio(b, a))} | {_f(pa)} | {_f(pb)} "
                    f"| {_f(_ratio(pb, pa))} |")
    return "\n".join(rows)


def memory_table(targets: list[Target], sizes: Sizes) -> str:
    rows = [f"| target | RSS MB at start | after {sizes.mem_check:,} | after {sizes.mem_total:,} | growth |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for t in targets:
        if t.rss.get("start"):
            mb = [_f(t.rss.get(k, 0) / 2**20 or None, "{:.0f}") for k in ("start", str(sizes.mem_check),
                                                                          str(sizes.mem_total))]
            rows.append(f"| {t.label} | " + " | ".join(mb) + f" | {_f(growth(t, sizes), '{:+.1f} %')} |")
    return "\n".join(rows)


def section(targets: list[Target], shape: Shape, info: dict[str, Any]) -> str:
    sizes = shape.fields
    direct = next(t for t in targets if t.key == "direct")
    floor = next(t for t in targets if t.key == "floor")
    ours = [t for t in targets if (t.ctxproxy or t.key == "floor-log") and "-w" not in t.key]
    n = info["workers"]
    broken = [f"- {t.label}: **not measured past the failure**: {t.broken}" for t in targets if t.broken]
    return "\n".join([
        SECTION,
        "",
        f"Command: `{info['command']}` (from the repository root). Run {info['started']:%Y-%m-%d %H:%M} UTC, "
        f"took {info['seconds']:.0f} s. Machine: {environment()}. 1-minute load average at start → end: "
        f"{info['load']}; other processes used {info['others']:.0%} of the machine's CPU time during the run.",
        "",
        f"Targets alternate request by request (small, large) or in blocks of {sizes.block_seconds:g} s "
        f"(concurrent; {sizes.c16_blocks} blocks each at 16, {shape.w_blocks} at 16 and at 64 with workers). "
        f"Small: each request on a fresh session. ~100k tokens: {info['large']}. 16 concurrent: a fresh "
        f"session every {info['length']} requests. Latency in ms, client-side, to the end of the body; added = "
        "target - direct at the same percentile. CPU per request: the target's process (and its children), user + "
        "system, over the phase, ÷ the requests it served in it (less sensitive to other jobs than latency; the "
        "Redis server's own CPU is not in it). The floor + the log (`bench.floor --log`) is the floor doing only "
        "what the design cannot skip, with ctxproxy's own store code: a session new to it read from the log "
        "before the upstream is called, the new messages and the reply appended before the client is answered; "
        "the bound of any proxy that keeps those promises on this stack. "
        + (f"**{len(COMPACTED)} answers were compacted.**" if COMPACTED else "No ctxproxy answer was compacted.")
        + (f" Targets marked baseline run the code of `{info['baseline']}` (`--baseline`), in the same run."
           if info["baseline"] else ""),
        "",
        measures_table(targets, direct),
        "",
        "**Issue 21's targets** (ratios to the floor in this run):",
        "",
        goals_table(ours, floor, direct, sizes),
        "",
        "**Against the bound** (ctxproxy ÷ the floor with the log, in this run):",
        "",
        bound_table([t for t in ours if t.ctxproxy], next(t for t in ours if t.key == "floor-log"), direct),
        "",
        f"**`--workers {n}`** (ctxproxy on Redis) against the floor with {n} processes, "
        f"{shape.w_blocks} blocks each:",
        "",
        workers_table(targets, n),
        "",
        f"**Memory**: {sizes.mem_total:,} small requests over {sizes.mem_sessions:,} sessions of "
        f"{sizes.mem_per_session}, 64 at a time, before the other workloads:",
        "",
        memory_table(targets, sizes),
        *broken,
        "",
    ])


def per_request(targets: list[Target], workload: str, before: dict[str, float]) -> None:
    """CPU seconds per request of ``workload`` for each target, from its CPU seconds ``before`` it. The others
    idle meanwhile, so all of a process's CPU during a workload is that workload's."""
    for t in targets:
        if t.child is not None and t.lat.get(workload):
            t.wall[f"cpu-{workload}"] = (cpu_seconds(t.child.proc.pid) - before[t.key]) / len(t.lat[workload])


async def measure(http: aiohttp.ClientSession, targets: list[Target], shape: Shape, length: int, only: set[str],
                  say: Callable[[str], None]) -> str:
    sizes = shape.fields
    run = f"hot-{os.getpid()}-{int(time.time())}"
    single = [t for t in targets if "-w" not in t.key]
    multi = [t for t in targets if "-w" in t.key]
    main = Runner(http, single, sizes, run, say)
    large = ""

    async def small() -> None:
        convs = {t.key: SmallConversations(f"{run}-small-{t.key}", 3, length=1) for t in single}

        def body(t: Target, i: int) -> tuple[bytes, str]:
            conv = convs[t.key].next()
            return conv.body(), conv.session

        await main.sequential("small", sizes.small, body)

    async def big() -> None:
        nonlocal large
        large = await main.large()

    async def c16() -> None:
        await main.concurrent("c16", 16, sizes.c16_blocks, length=length)

    async def workers() -> None:
        if multi:
            await Runner(http, multi, sizes, run, say).warmup()
            for w, at_once in (("w16", 16), ("w64", 64)):
                await Runner(http, multi, sizes, run, say).concurrent(w, at_once, shape.w_blocks, length=length)

    phases = [("warmup", main.warmup),
              ("memory", lambda: main.memory([t for t in single if t.key != "direct"])),
              ("small", small), ("large", big), ("c16", c16), ("workers", workers)]
    for name, phase in [(n, p) for n, p in phases if not only or n in only or n == "warmup"]:
        t0 = time.perf_counter()
        cpu = {t.key: cpu_seconds(t.child.proc.pid) for t in targets if t.child is not None}
        await phase()
        per_request(targets, name, cpu)
        for t in targets:
            if t.child is not None and not t.broken and not t.child.alive():
                t.broken = f"exited during {name}; see its log"
        say(f"{name}: {time.perf_counter() - t0:.1f} s")
    return large


async def amain(opts: argparse.Namespace, info: dict[str, Any]) -> list[Target]:
    shape = QUICK if opts.quick else FULL

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="ctxproxy-hotpath-", dir="/tmp"))
    fleet = Fleet(workdir, say)
    wrapper = shlex.split(opts.proxy_wrapper) if opts.proxy_wrapper else None
    try:
        keys = ["floor", "floor-log"] + ([f"floor-w{opts.workers}"] if opts.workers > 1 else [])
        direct, pending = fleet.start(keys, None)
        pending += [fleet.ctxproxy(k, direct.base, [w.replace("{key}", k) for w in wrapper or []])
                    for k in ("redis", "sqlite")]
        if opts.baseline:  # the same, from another checkout's code: before and after in one run
            pending += [fleet.ctxproxy(k, direct.base, ["env", "-C", opts.baseline], tag="baseline")
                        for k in ("redis", "sqlite")]
        if opts.workers > 1:
            pending.append(fleet.ctxproxy(f"redis-w{opts.workers}", direct.base))
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                         skip_auto_headers=("User-Agent",)) as http:
            for t in [direct, *pending]:
                assert t.child is not None
                await wait_http(http, t.health, t.child, timeout=60.0)
            targets = [direct, *pending]
            only = {w.strip() for w in opts.only.split(",") if w.strip()}
            info["large"] = await measure(http, targets, shape, opts.session_length, only, say)
            info["own_cpu"] = cpu_seconds(os.getpid())
            for t in targets:
                if t.child is not None and t.child.alive():
                    t.rss["end"] = rss_tree(t.child.proc.pid)
    finally:
        fleet.close(opts.keep)
    return targets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m bench.hotpath", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (about a minute instead of three)")
    parser.add_argument("--workers", type=int, default=2, help="processes of the --workers targets (1: none)")
    parser.add_argument("--session-length", type=int, default=1, help="requests per session, concurrent workloads")
    parser.add_argument("--proxy-wrapper", default="",
                        help="command to run the single-process ctxproxies under; {key} becomes redis or sqlite")
    parser.add_argument("--baseline", default="", help="a checkout whose ctxproxy runs beside this one's "
                        "(e.g. made by `git archive REV | tar -x -C DIR`), on both stores")
    parser.add_argument("--only", default="", help="comma-separated phases: memory, small, large, c16, workers")
    parser.add_argument("--write", action="store_true", help=f"replace the section '{SECTION}' in docs/BENCHMARKS.md")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stores)")
    opts = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    info: dict[str, Any] = {"command": "python3 -m bench.hotpath" + "".join(" " + shlex.quote(a) for a in
                                                                             (argv or sys.argv[1:])),
                            "started": datetime.now(UTC), "workers": opts.workers, "length": opts.session_length,
                            "baseline": opts.baseline}
    load0, busy0, t0 = os.getloadavg()[0], machine_busy_seconds(), time.perf_counter()
    try:
        import uvloop
    except ImportError:
        targets = asyncio.run(amain(opts, info))
    else:
        targets = uvloop.run(amain(opts, info))
    info["seconds"] = time.perf_counter() - t0
    info["load"] = f"{load0:.2f} → {os.getloadavg()[0]:.2f}"
    capacity = info["seconds"] * (os.cpu_count() or 1)
    info["others"] = max(0.0, machine_busy_seconds() - busy0 - info.get("own_cpu", 0.0)) / capacity
    text = section(targets, QUICK if opts.quick else FULL, info)
    print(text)
    if opts.write:
        write_doc(text, SECTION)
        print(f"wrote the section '{SECTION}' of docs/BENCHMARKS.md", file=sys.stderr)


if __name__ == "__main__":
    main()
