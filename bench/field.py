"""ctxproxy against the field: direct, a bare forwarder, ctxproxy and LiteLLM's proxy, side by side.

Run from the repository root: ``python3 -m bench.field [--quick] [--write]``.

One run, one machine, one fake upstream (``bench.fakeserver``, its own process), and
every target measured by this process (the client) in the same way:

- ``direct``: the client straight to the fake upstream, the zero;
- ``floor``: ``bench.floor``, a bare aiohttp forwarder (no parsing, no logging,
  the answer streamed through): the physical limit of a proxy on this stack;
- ``ctxproxy (sqlite)`` and ``ctxproxy (redis)``: ``python3 -m proxy serve … --context-window 1000000``
  (so that compaction, an LLM call, never triggers) with a SQLite file in a temp dir and
  with a private ``redis-server`` on a free port; ``ctxproxy (sqlite, 2 workers)`` is the
  same with ``--workers 2``;
- ``LiteLLM``: LiteLLM's proxy (``litellm[proxy]`` from PyPI, in ``bench/.venv-litellm``,
  installed with pip on the first run), a config mapping ``bench-model`` to
  ``openai/bench-model`` at the fake upstream, with telemetry, database, spend and error logs
  and logging callbacks off, and no master key (ctxproxy runs without client keys too). If
  it cannot be installed or started, the rest still runs and the report says why.

Workloads, in this order; targets alternate request by request (sequential workloads) or block
by block (concurrent ones), the first of each round rotating, so all see the same machine:

- ``memory``: 20,000 small requests over 1,000 sessions of 20 requests (64 sessions at a
  time) to the floor and each single-process ctxproxy, in blocks of 2,500; RSS (the process
  and its children, from /proc) at the start, after 5,000 and after 20,000 requests. LiteLLM
  is left out: at its rate this alone would take longer than the whole run; its RSS is read
  at the end of the run instead (after the number of requests stated);
- ``small``: sequential small requests (1 system + 1 user message of ~200 characters, growing
  by the echoed reply and one user message per request, a fresh session every 50);
- ``c16`` and ``c64``: the same at 16 and 64 concurrent sessions, each target in turn for
  blocks of a fixed time; throughput = requests completed ÷ time; 64 is saturation;
- ``large``: sequential ~100k-token bodies (bench.latency's ~300-message agent history growing
  by 2 messages per request); the session's first request is reported apart;
- ``stream``: ``stream: true`` small requests; time to the first body byte.

Everything is bounded: counts and block times are fixed, every wait has a deadline, and the
subprocesses are stopped in ``finally`` (and get SIGTERM if this process dies).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.fakeserver import REPLY
from bench.latency import (
    COMPACTED,
    CONTEXT_WINDOW,
    HEADERS,
    MS,
    ROOT,
    SMALL_SESSION_LEN,
    Child,
    Conversation,
    SmallConversations,
    cpu_model,
    large_history,
    pct,
    prose,
    quiet_gc,
    spawn,
    stop_on_sigterm,
    timed,
    tool_output,
    wait_http,
    write_doc,
)
from tests.redisproc import RedisProcess, free_port

SECTION = "## Against the field (issue 8)"
VENV = ROOT / "bench" / ".venv-litellm"
LITELLM_SPEC = "litellm[proxy]"
INSTALLED_MARK = VENV / ".bench-installed"
PIP_TIMEOUT = 1200.0
MODEL = "bench-model"


@dataclass(frozen=True)
class Sizes:
    warmup: int
    small: int
    c16_blocks: int
    c64_blocks: int
    block_seconds: float
    large: int
    stream: int
    mem_sessions: int
    mem_per_session: int
    mem_block: int
    mem_check: int

    @property
    def mem_total(self) -> int:
        return self.mem_sessions * self.mem_per_session


FULL = Sizes(warmup=100, small=1000, c16_blocks=4, c64_blocks=3, block_seconds=3.0, large=60, stream=400,
             mem_sessions=1000, mem_per_session=20, mem_block=2500, mem_check=5000)
QUICK = Sizes(warmup=20, small=150, c16_blocks=2, c64_blocks=2, block_seconds=1.0, large=12, stream=80,
              mem_sessions=150, mem_per_session=20, mem_block=750, mem_check=750)

#: Targets: (name, what, limit, unit). Checked for every ctxproxy target.
GOALS = (
    ("small_p50", "added p50, small requests", 1.0, "ms"),
    ("large_p50", "added p50, ~100k-token bodies", 3.0, "ms"),
    ("c16_p99", "added p99, 16 concurrent", 10.0, "ms"),
    ("vs_litellm", "req/s at 16 concurrent ÷ LiteLLM's", 10.0, "x"),
    ("vs_floor", "req/s at 16 concurrent ÷ the floor's", 0.4, "x"),
    ("ttfb_p50", "added p50, streaming time to first byte", 1.0, "ms"),
    ("rss_growth", "RSS growth, {check:,} → {total:,} requests", 10.0, "%"),
)


# -- targets --------------------------------------------------------------------------------------

@dataclass
class Target:
    key: str
    label: str
    base: str  #: the OpenAI base URL, ending in /v1
    child: Child | None = None
    health: str = ""
    broken: str = ""
    ctxproxy: bool = False
    lat: dict[str, list[float]] = field(default_factory=dict)
    wall: dict[str, float] = field(default_factory=dict)
    rss: dict[str, int] = field(default_factory=dict)
    served: int = 0

    @property
    def chat(self) -> str:
        return self.base + "/chat/completions"

    def sink(self, workload: str) -> list[float]:
        return self.lat.setdefault(workload, [])


def rss_tree(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants, in bytes (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    tree, frontier = {pid}, [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier and p not in tree]
        tree.update(kids)
        frontier = kids
    total = 0
    for p in tree:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            p, ppid = int(entry.name), int(fields[1])
            if p == pid or _descends(ppid, pid):
                total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _descends(ppid: int, ancestor: int, depth: int = 8) -> bool:
    for _ in range(depth):
        if ppid == ancestor:
            return True
        if ppid <= 1:
            return False
        try:
            ppid = int(Path(f"/proc/{ppid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (all cores), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


# -- LiteLLM --------------------------------------------------------------------------------------

def ensure_litellm(spec: str, say: Callable[[str], None], workdir: Path) -> tuple[Path | None, str]:
    """(the venv's python, LiteLLM's version) or (None, why not). Installs into bench/.venv-litellm once."""
    python = VENV / "bin" / "python"
    if not (INSTALLED_MARK.exists() and INSTALLED_MARK.read_text() == spec and python.exists()):
        say(f"installing {spec} into {VENV.relative_to(ROOT)} (first run only; takes a few minutes)")
        log = workdir / "pip-litellm.log"
        try:
            with open(log, "wb") as out:
                if not python.exists():
                    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, stdout=out,
                                   stderr=subprocess.STDOUT, timeout=300)
                subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", spec],
                               check=True, stdout=out, stderr=subprocess.STDOUT, timeout=PIP_TIMEOUT)
        except (subprocess.SubprocessError, OSError) as exc:
            why = f"exit status {exc.returncode}" if isinstance(exc, subprocess.CalledProcessError) else str(exc)
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
            return None, f"`pip install {spec}` failed ({why}): " + " / ".join(line.strip() for line in tail)
        INSTALLED_MARK.write_text(spec)
    try:
        version = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                                 check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"LiteLLM is installed in {VENV} but its version cannot be read: {exc}"
    return python, version


LITELLM_CONFIG = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream}
      api_key: sk-bench-dummy
litellm_settings:
  callbacks: []
  success_callback: []
  failure_callback: []
  service_callback: []
  turn_off_message_logging: true
  num_retries: 0
  request_timeout: 30
general_settings:
  dangerously_permit_weak_or_unset_master_key: true
  disable_spend_logs: true
  disable_error_logs: true
  background_health_checks: false
  store_model_in_db: false
router_settings:
  num_retries: 0
"""


def start_litellm(python: Path, upstream: str, workdir: Path) -> tuple[Child, int]:
    config = workdir / "litellm-config.yaml"
    config.write_text(LITELLM_CONFIG.format(model=MODEL, upstream=upstream))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LITELLM_", "OPENAI_", "DATABASE_", "REDIS_")) and k != "STORE_MODEL_IN_DB"}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY_DISABLED="true",
               LITELLM_DONT_SHOW_FEEDBACK_BOX="true")
    port = free_port()
    args = [str(python), str(VENV / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--num_workers", "1"]
    return spawn("litellm", args, workdir, env=env, cwd=workdir), port


# -- workloads ------------------------------------------------------------------------------------

def rotated(targets: list[Target], i: int) -> list[Target]:
    live = [t for t in targets if not t.broken]
    if not live:
        return []
    k = i % len(live)
    return live[k:] + live[:k]


class Runner:
    def __init__(self, http: aiohttp.ClientSession, targets: list[Target], sizes: Sizes, run: str,
                 say: Callable[[str], None]) -> None:
        self.http = http
        self.targets = targets
        self.sizes = sizes
        self.run = run
        self.say = say

    async def attempt(self, target: Target, workload: str, call: Awaitable[float], record: bool = True) -> None:
        try:
            elapsed = await call
        except Exception as exc:  # a target that fails is reported, not allowed to stop the others
            target.broken = f"failed during {workload}: {type(exc).__name__}: {str(exc)[:300]}"
            self.say(f"  {target.label}: {target.broken}")
            return
        target.served += 1
        if record:
            target.sink(workload).append(elapsed)

    async def sequential(self, workload: str, n: int, body: Callable[[Target, int], tuple[bytes, str]],
                         *, ttfb: bool = False, record: Callable[[int], bool] = lambda i: True) -> None:
        with quiet_gc():
            for i in range(n):
                for t in rotated(self.targets, i):
                    data, session = body(t, i)
                    await self.attempt(t, workload, timed(self.http, t.chat, data, session, ttfb=ttfb), record(i))

    async def check(self) -> None:
        """Each target answers as the upstream does, whole and streamed (so nobody is fast by doing nothing)."""
        whole = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "check"}]})
        stream = orjson.dumps({"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "check"}]})
        for t in rotated(self.targets, 0):
            try:
                async with self.http.post(t.chat, data=whole, headers=HEADERS) as resp:
                    answer = await resp.json(content_type=None)
                    if resp.status != 200 or answer["choices"][0]["message"]["content"] != REPLY["content"]:
                        raise RuntimeError(f"answered {resp.status}: {str(answer)[:200]}")
                async with self.http.post(t.chat, data=stream, headers=HEADERS) as resp:
                    text = await resp.read()
                    if resp.status != 200 or b"[DONE]" not in text or b"pass." not in text:
                        raise RuntimeError(f"stream answered {resp.status}: {text[:200]!r}")
            except Exception as exc:
                t.broken = f"wrong answer: {type(exc).__name__}: {str(exc)[:300]}"
                self.say(f"  {t.label}: {t.broken}")

    async def warmup(self) -> None:
        await self.check()
        convs = {t.key: SmallConversations(f"{self.run}-warm-{t.key}", 1) for t in self.targets}
        streams = {t.key: SmallConversations(f"{self.run}-warms-{t.key}", 2, stream=True) for t in self.targets}

        def small(t: Target, i: int) -> tuple[bytes, str]:
            conv = convs[t.key].next()
            return conv.body(), conv.session

        def streamed(t: Target, i: int) -> tuple[bytes, str]:
            conv = streams[t.key].next()
            return conv.body(), conv.session

        await self.sequential("warmup", self.sizes.warmup, small, record=lambda i: False)
        await self.sequential("warmup", 10, streamed, ttfb=True, record=lambda i: False)

    async def small(self) -> None:
        convs = {t.key: SmallConversations(f"{self.run}-small-{t.key}", 3) for t in self.targets}

        def body(t: Target, i: int) -> tuple[bytes, str]:
            conv = convs[t.key].next()
            return conv.body(), conv.session

        await self.sequential("small", self.sizes.small, body)

    async def stream(self) -> None:
        convs = {t.key: SmallConversations(f"{self.run}-stream-{t.key}", 4, stream=True) for t in self.targets}

        def body(t: Target, i: int) -> tuple[bytes, str]:
            conv = convs[t.key].next()
            return conv.body(), conv.session

        await self.sequential("stream", self.sizes.stream, body, ttfb=True)

    async def large(self) -> str:
        rng = random.Random(5)
        history = large_history(rng)
        convs = {t.key: Conversation(history, f"{self.run}-large-{t.key}") for t in self.targets}
        warm = 3
        steps = [(REPLY, {"role": "user", "content": tool_output(rng, rng.randint(250, 650))})
                 for _ in range(warm + self.sizes.large)]
        first = len(convs[self.targets[0].key].body())

        def cold(t: Target, i: int) -> tuple[bytes, str]:
            return convs[t.key].body(), convs[t.key].session

        await self.sequential("large-cold", 1, cold)

        def body(t: Target, i: int) -> tuple[bytes, str]:
            conv = convs[t.key]
            conv.step(*steps[i])
            return conv.body(), conv.session

        await self.sequential("large", warm + self.sizes.large, body, record=lambda i: i >= warm)
        last = len(convs[self.targets[0].key].body())
        return (f"{len(history)}→{len(history) + 2 * len(steps)} messages, {first / 1000:.0f}→{last / 1000:.0f} KB "
                f"(~{first // 4000}k→{last // 4000}k tokens at 4 bytes a token)")

    async def concurrent(self, workload: str, workers: int, blocks: int, length: int = SMALL_SESSION_LEN) -> None:
        """``workers`` sessions at a time, each target in turn for ``blocks`` blocks; a fresh session every
        ``length`` requests."""
        convs = {t.key: [SmallConversations(f"{self.run}-{workload}-{t.key}-{w}", 100 + w, length=length)
                         for w in range(workers)] for t in self.targets}
        with quiet_gc():
            for block in range(blocks):
                for t in rotated(self.targets, block):
                    sink = t.sink(workload)
                    deadline = time.perf_counter() + self.sizes.block_seconds

                    async def worker(c: SmallConversations, t: Target = t, sink: list[float] = sink,
                                     deadline: float = deadline) -> None:
                        while time.perf_counter() < deadline:
                            conv = c.next()
                            sink.append(await timed(self.http, t.chat, conv.body(), conv.session))
                            t.served += 1

                    t0 = time.perf_counter()
                    try:
                        async with asyncio.TaskGroup() as tg:
                            for c in convs[t.key]:
                                tg.create_task(worker(c))
                    except Exception as exc:
                        first = exc.exceptions[0] if isinstance(exc, ExceptionGroup) else exc
                        t.broken = f"failed during {workload}: {type(first).__name__}: {str(first)[:300]}"
                        self.say(f"  {t.label}: {t.broken}")
                        continue
                    t.wall[workload] = t.wall.get(workload, 0.0) + time.perf_counter() - t0

    async def memory(self, targets: list[Target]) -> None:
        """``mem_total`` requests over ``mem_sessions`` sessions, 64 at a time; RSS at the checkpoints."""
        sizes = self.sizes
        pool_rng = random.Random(7)
        pool = [prose(pool_rng, 200) for _ in range(64)]
        lanes = 64

        @dataclass
        class Lane:
            conv: Conversation | None = None
            used: int = 0

        state = {t.key: (deque(range(sizes.mem_sessions)), [Lane() for _ in range(lanes)]) for t in targets}
        done = dict.fromkeys(state, 0)
        for t in targets:
            if t.child is not None:
                t.rss["start"] = rss_tree(t.child.proc.pid)
        with quiet_gc():
            for block in range(sizes.mem_total // sizes.mem_block):
                for t in rotated(targets, block):
                    pending, lane_state = state[t.key]
                    tickets = [sizes.mem_block]

                    async def lane(ln: Lane, t: Target = t, pending: deque[int] = pending,
                                   tickets: list[int] = tickets) -> None:
                        while tickets[0] > 0:
                            if ln.conv is None or ln.used == sizes.mem_per_session:
                                if not pending:
                                    return
                                s = pending.popleft()
                                ln.conv = Conversation([{"role": "system", "content": pool[s % 64]},
                                                        {"role": "user", "content": pool[(s * 7 + 1) % 64]}],
                                                       f"{self.run}-mem-{t.key}-{s}")
                                ln.used = 0
                            elif ln.used:
                                ln.conv.step(REPLY, {"role": "user", "content": pool[(ln.used * 13) % 64]})
                            tickets[0] -= 1
                            ln.used += 1
                            await timed(self.http, t.chat, ln.conv.body(), ln.conv.session)
                            t.served += 1

                    t0 = time.perf_counter()
                    try:
                        async with asyncio.TaskGroup() as tg:
                            for ln in lane_state:
                                tg.create_task(lane(ln))
                    except Exception as exc:
                        first = exc.exceptions[0] if isinstance(exc, ExceptionGroup) else exc
                        t.broken = f"failed during memory: {type(first).__name__}: {str(first)[:300]}"
                        self.say(f"  {t.label}: {t.broken}")
                        continue
                    t.wall["memory"] = t.wall.get("memory", 0.0) + time.perf_counter() - t0
                    done[t.key] += sizes.mem_block - tickets[0]
                    if t.child is not None and done[t.key] in (sizes.mem_check, sizes.mem_total):
                        t.rss[str(done[t.key])] = rss_tree(t.child.proc.pid)
                self.say(f"  memory: block {block + 1}/{sizes.mem_total // sizes.mem_block}")


# -- report ---------------------------------------------------------------------------------------

WORKLOAD_LABELS = {
    "small": "small, sequential",
    "c16": "small, 16 concurrent",
    "large": "~100k tokens, sequential",
    "stream": "stream, time to first byte",
}


def _p(t: Target, workload: str, p: float) -> float | None:
    values = t.lat.get(workload)
    return pct(values, p) if values else None


def _absolute(t: Target, workload: str, p: float) -> float | None:
    v = _p(t, workload, p)
    return None if v is None else v * MS


def added(t: Target, direct: Target, workload: str, p: float) -> float | None:
    mine, zero = _p(t, workload, p), _p(direct, workload, p)
    return None if mine is None or zero is None else (mine - zero) * MS


def rate(t: Target, workload: str) -> float | None:
    wall = t.wall.get(workload)
    return len(t.lat.get(workload, [])) / wall if wall else None


def growth(t: Target, sizes: Sizes) -> float | None:
    a, b = t.rss.get(str(sizes.mem_check)), t.rss.get(str(sizes.mem_total))
    return None if not a or not b else (b - a) / a * 100


def _ms(v: float | None, sign: bool = True) -> str:
    return "—" if v is None else (f"{v:+.2f}" if sign else f"{v:.2f}")


def _mb(v: int | None) -> str:
    return "—" if not v else f"{v / 2**20:.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0.01:
        return "—"
    return f"{a / b:.2f}" if a / b < 10 else f"{a / b:.0f}"


def latency_table(targets: list[Target], direct: Target) -> str:
    rows = ["| target | " + " | ".join(WORKLOAD_LABELS.values()) + " |",
            "| --- |" + " ---: |" * len(WORKLOAD_LABELS)]
    cells = [f"{_ms(_absolute(direct, w, 50), False)} / {_ms(_absolute(direct, w, 99), False)}"
             for w in WORKLOAD_LABELS]
    rows.append("| direct (absolute ms, p50 / p99) | " + " | ".join(cells) + " |")
    for t in targets:
        if t is direct:
            continue
        cells = [f"{_ms(added(t, direct, w, 50))} / {_ms(added(t, direct, w, 99))}" for w in WORKLOAD_LABELS]
        rows.append(f"| {t.label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def capacity_table(targets: list[Target], sizes: Sizes) -> str:
    rows = [f"| target | req/s, 16 concurrent | req/s, 64 concurrent | RSS MB at start | RSS MB after "
            f"{sizes.mem_check:,} | RSS MB after {sizes.mem_total:,} | growth | RSS MB at the end (requests served) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for t in targets:
        g = growth(t, sizes)
        r16, r64 = rate(t, "c16"), rate(t, "c64")
        end = f"{_mb(t.rss.get('end'))} ({t.served:,})" if t.rss.get("end") else "—"
        rows.append(f"| {t.label} | {'—' if r16 is None else f'{r16:.0f}'} | {'—' if r64 is None else f'{r64:.0f}'} "
                    f"| {_mb(t.rss.get('start'))} | {_mb(t.rss.get(str(sizes.mem_check)))} "
                    f"| {_mb(t.rss.get(str(sizes.mem_total)))} | {'—' if g is None else f'{g:+.1f} %'} | {end} |")
    return "\n".join(rows)


def ratio_table(ours: list[Target], others: list[Target], direct: Target) -> str:
    rows = ["| ratio | added p50, small | added p99, 16 concurrent | added p50, ~100k tokens | added p50, TTFB "
            "| req/s, 16 concurrent | req/s, 64 concurrent | RSS at the end |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for other in others:
        for t in ours:
            end_a, end_b = t.rss.get("end"), other.rss.get("end")
            rows.append(
                f"| {t.label} ÷ {other.label} "
                f"| {_ratio(added(t, direct, 'small', 50), added(other, direct, 'small', 50))} "
                f"| {_ratio(added(t, direct, 'c16', 99), added(other, direct, 'c16', 99))} "
                f"| {_ratio(added(t, direct, 'large', 50), added(other, direct, 'large', 50))} "
                f"| {_ratio(added(t, direct, 'stream', 50), added(other, direct, 'stream', 50))} "
                f"| {_ratio(rate(t, 'c16'), rate(other, 'c16'))} | {_ratio(rate(t, 'c64'), rate(other, 'c64'))} "
                f"| {_ratio(float(end_a) if end_a else None, float(end_b) if end_b else None)} |")
    return "\n".join(rows)


def goal_values(t: Target, direct: Target, floor: Target | None, litellm: Target | None,
                sizes: Sizes) -> dict[str, float | None]:
    r16 = rate(t, "c16")
    lite = rate(litellm, "c16") if litellm is not None and not litellm.broken else None
    base = rate(floor, "c16") if floor is not None else None
    return {
        "small_p50": added(t, direct, "small", 50),
        "large_p50": added(t, direct, "large", 50),
        "c16_p99": added(t, direct, "c16", 99),
        "vs_litellm": None if r16 is None or not lite else r16 / lite,
        "vs_floor": None if r16 is None or not base else r16 / base,
        "ttfb_p50": added(t, direct, "stream", 50),
        "rss_growth": growth(t, sizes),
    }


def goal_cell(value: float | None, limit: float, unit: str) -> str:
    if value is None:
        return "not measured"
    higher_is_better = unit == "x"
    shown = f"{value:.2f} {unit}" if unit != "%" else f"{value:+.1f} %"
    if (value >= limit) if higher_is_better else (value <= limit):
        return f"{shown}: met"
    if higher_is_better:
        return f"{shown}: **missed** ({value / limit:.0%} of the target)"
    by = f"{value - limit:.2f} {unit}" if unit == "ms" else f"{value - limit:.1f} points"
    return f"{shown}: **missed** by {by} ({value / limit:.1f}x the limit)"


def goals_table(ours: list[Target], direct: Target, floor: Target | None, litellm: Target | None,
                sizes: Sizes) -> str:
    if not ours:
        return "(no ctxproxy target in this run)"
    rows = ["| target | limit | " + " | ".join(t.label for t in ours) + " |",
            "| --- | --- |" + " --- |" * len(ours)]
    vals = {t.key: goal_values(t, direct, floor, litellm, sizes) for t in ours}
    for name, what, limit, unit in GOALS:
        bound = f"≥ {limit:g}{unit}" if unit == "x" else f"≤ {limit:g} {unit}"
        what = what.format(check=sizes.mem_check, total=sizes.mem_total)
        rows.append(f"| {what} | {bound} | " + " | ".join(goal_cell(vals[t.key][name], limit, unit) for t in ours)
                    + " |")
    return "\n".join(rows)


@dataclass
class RunInfo:
    command: str
    started: datetime
    seconds: float
    load: list[float]
    others_share: float
    litellm: str
    sizes: Sizes
    large_note: str


def environment(info: RunInfo) -> str:
    try:
        import uvloop
        uv = f"uvloop {getattr(uvloop, '__version__', '?')}"
    except ImportError:
        uv = "asyncio"
    redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                           check=False).stdout.split(" ")[2:3]
    return (f"`nproc` {os.cpu_count()}, CPU {cpu_model()}, Python {platform.python_version()}, "
            f"aiohttp {aiohttp.__version__}, {uv}, Redis {''.join(redis).removeprefix('v=') or '?'}; "
            f"{info.litellm}")


def section(targets: list[Target], info: RunInfo) -> str:
    direct = next(t for t in targets if t.key == "direct")
    floor = next((t for t in targets if t.key == "floor"), None)
    litellm = next((t for t in targets if t.key == "litellm"), None)
    ours = [t for t in targets if t.ctxproxy]
    others = [t for t in (litellm, floor) if t is not None and not t.broken]
    sizes = info.sizes
    load = " → ".join(f"{a:.2f}" for a in info.load)
    shared = (f"**The machine was shared**: other processes (other engineers' test runs) used "
              f"{info.others_share:.0%} of its CPU time during the run. Targets alternate so that all see the "
              "same conditions, but absolute numbers are noisier and lower than on an idle machine."
              if info.others_share >= 0.05 else
              f"Other processes used {info.others_share:.0%} of the machine's CPU time during the run.")
    cold = [f"{t.label} {_ms(added(t, direct, 'large-cold', 50))}" for t in targets if t is not direct]
    broken = [f"- {t.label}: **not measured past the failure**: {t.broken}" for t in targets if t.broken]
    mem_targets = ", ".join(t.label for t in targets if t.rss.get("start"))
    return "\n".join([
        SECTION,
        "",
        f"Command: `{info.command}` (from the repository root). Run {info.started:%Y-%m-%d %H:%M} UTC, "
        f"took {info.seconds:.0f} s (LiteLLM's installation, on a first run, not counted).",
        "",
        f"Machine: {environment(info)}. 1-minute load average at start → end: {load}. {shared}",
        "",
        "One fake upstream (`bench/fakeserver.py`, its own process) and one client (this process, "
        "aiohttp, keep-alive); every target is its own process: **direct** (client → fake upstream, the "
        "zero), **floor** (`bench/floor.py`: a bare aiohttp forwarder, body read whole, answer streamed "
        "through, no parsing, no logging: the limit of this stack), **ctxproxy** (`python3 -m proxy serve "
        f"--context-window {CONTEXT_WINDOW}`, so compaction never triggers, logging an access line per request "
        "to a file as deployed) with SQLite, with Redis (a private `redis-server`) and with SQLite and "
        "`--workers 2`, and **LiteLLM**'s proxy (its own virtualenv, `openai/bench-model` at the fake "
        "upstream, telemetry, database, spend/error logs and callbacks off, no master key, its default "
        "uvicorn access log). Targets alternate request by request (sequential workloads) or in blocks of "
        f"{sizes.block_seconds:g} s each (concurrent: {sizes.c16_blocks} blocks at 16, {sizes.c64_blocks} at "
        "64), the first of each round rotating. Added = target - direct at the same percentile; "
        "latency is from send to the end of the body (first body byte for streams). "
        + (f"**{len(COMPACTED)} answers were compacted.**" if COMPACTED
           else "No ctxproxy answer was compacted."),
        "",
        "**Added latency** (ms, p50 / p99; first row: direct's own latency):",
        "",
        latency_table(targets, direct),
        "",
        f"**Throughput and memory.** Memory: {sizes.mem_total:,} small requests over {sizes.mem_sessions:,} "
        f"sessions of {sizes.mem_per_session} requests, 64 at a time, before every other workload, to "
        f"{mem_targets or 'no target'} (LiteLLM at its rate would need more than the whole run; its RSS is "
        "read at the end, after the requests stated). RSS is the process with its children (the 2-worker "
        "ctxproxy: parent and both workers).",
        "",
        capacity_table(targets, sizes),
        "",
        "**Ratios** (latency and RSS: lower is better for ctxproxy; req/s: higher is better):",
        "",
        ratio_table(ours, others, direct),
        "",
        "**Issue 8's targets**:",
        "",
        goals_table(ours, direct, floor, litellm, sizes),
        "",
        f"- ~100k tokens: {info.large_note}; the session's first request (ctxproxy logs all of it), added ms: "
        + ", ".join(cold) + ".",
        *broken,
        "",
    ])


# -- main -----------------------------------------------------------------------------------------

TARGET_KEYS = ("floor", "sqlite", "redis", "sqlite-w2", "litellm")


def workers_of(key: str) -> int:
    """The process count a target key names: ``redis-w2`` 2, ``floor`` 1."""
    _, sep, n = key.partition("-w")
    return int(n) if sep else 1


class Fleet:
    """The processes: fake upstream, targets, private Redis; all stopped by ``stop``."""

    def __init__(self, workdir: Path, say: Callable[[str], None]) -> None:
        self.workdir = workdir
        self.say = say
        self.children: list[Child] = []
        self.redis: RedisProcess | None = None

    def spawn(self, name: str, args: list[str], **kwargs: Any) -> Child:
        child = spawn(name, args, self.workdir, **kwargs)
        self.children.append(child)
        return child

    def start(self, keys: list[str], litellm_python: Path | None) -> tuple[Target, list[Target]]:
        """The fake upstream (as the ``direct`` target) and the other targets, started but maybe not ready yet."""
        up_port = free_port()
        root = f"http://127.0.0.1:{up_port}"
        fake = self.spawn("fakeupstream", [sys.executable, "-m", "bench.fakeserver", "--port", str(up_port)])
        direct = Target("direct", "direct", root + "/v1", fake, root + "/healthz")
        pending: list[Target] = []
        if litellm_python is not None:  # first: it takes the longest to start
            child, port = start_litellm(litellm_python, direct.base, self.workdir)
            self.children.append(child)
            pending.append(Target("litellm", "LiteLLM", f"http://127.0.0.1:{port}/v1", child,
                                  f"http://127.0.0.1:{port}/health/liveliness"))
        for key in keys:
            if key.split("-w")[0] in ("floor", "floor-log"):
                pending.append(self.floor(key, root))
        for key in keys:
            if key.split("-w")[0] in ("sqlite", "redis"):
                pending.append(self.ctxproxy(key, direct.base))
        return direct, pending

    def floor(self, key: str, root: str) -> Target:
        """``floor`` or ``floor-wN`` (N processes on one port, the floor for ``--workers N``); ``floor-log``:
        the floor with the log on the private Redis (``bench.floor --log``)."""
        workers = workers_of(key)
        port = free_port()
        log = ["--log", self.store_url("redis", key)] if key == "floor-log" else []
        child = self.spawn(key, [sys.executable, "-m", "bench.floor", "--port", str(port), "--upstream", root,
                                 "--workers", str(workers), *log])
        label = "floor + the log (redis)" if log else "floor" if workers == 1 else f"floor ({workers} processes)"
        return Target(key, label, f"http://127.0.0.1:{port}/v1", child, f"http://127.0.0.1:{port}/healthz")

    def store_url(self, store: str, key: str) -> str:
        """The private ``redis-server`` the Redis targets share (started on first use), or a SQLite file of
        the target's own."""
        if store == "redis":
            if self.redis is None:
                self.redis = RedisProcess(free_port(), self.workdir / "redis")
                self.redis.start()
            return self.redis.url
        return f"sqlite:///{self.workdir / f'facts-{key}.db'}"

    def ctxproxy(self, key: str, upstream: str, wrapper: list[str] | None = None, tag: str = "") -> Target:
        """``sqlite``, ``redis``, ``sqlite-wN`` or ``redis-wN`` (``--workers N``); the Redis targets share one
        private ``redis-server``; ``wrapper`` goes before the command (a profiler); ``tag`` tells apart two
        targets of one key (its key becomes ``key.tag``, its label says it)."""
        store, workers = key.split("-w")[0], workers_of(key)
        key = f"{key}.{tag}" if tag else key
        url = self.store_url(store, key)
        port = free_port()
        extra = ["--workers", str(workers)] if workers > 1 else []
        args = [*(wrapper or []), sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--store", url,
                "--port", str(port), "--host", "127.0.0.1", "--context-window", str(CONTEXT_WINDOW), *extra]
        child = self.spawn(f"ctxproxy-{key}", args)
        label = f"ctxproxy ({store})" if workers == 1 else f"ctxproxy ({store}, {workers} workers)"
        label = f"{label}, {tag}" if tag else label
        return Target(key, label, f"http://127.0.0.1:{port}/v1", child, f"http://127.0.0.1:{port}/healthz",
                      ctxproxy=True)

    def close(self, keep: bool) -> None:
        """``stop``, then remove the temp dir unless ``keep``."""
        self.stop()
        if keep:
            self.say(f"kept {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stop(self) -> None:
        for child in self.children:
            child.stop()
        if self.redis is not None:
            self.redis.stop()


#: Table order.
ORDER = {"direct": 0, "floor": 1, "sqlite": 2, "redis": 3, "sqlite-w2": 4, "litellm": 5}


async def measure(http: aiohttp.ClientSession, targets: list[Target], sizes: Sizes, info: dict[str, Any],
                  say: Callable[[str], None]) -> None:
    runner = Runner(http, targets, sizes, f"field-{os.getpid()}-{int(time.time())}", say)
    phases: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("warmup", runner.warmup),
        ("memory", lambda: runner.memory([t for t in targets if t.key in ("floor", "sqlite", "redis")])),
        ("small", runner.small),
        ("c16", lambda: runner.concurrent("c16", 16, sizes.c16_blocks)),
        ("c64", lambda: runner.concurrent("c64", 64, sizes.c64_blocks)),
        ("large", runner.large),
        ("stream", runner.stream),
    ]
    for name, phase in phases:
        t0 = time.perf_counter()
        out = await phase()
        if name == "large":
            info["large_note"] = out
        for t in targets:
            if t.child is not None and not t.broken and not t.child.alive():
                t.broken = f"exited during {name}; see its log"
        say(f"{name}: {time.perf_counter() - t0:.1f} s")
    for t in targets:
        if t.child is not None and t.key != "direct" and t.child.alive():
            t.rss["end"] = rss_tree(t.child.proc.pid)


async def amain(opts: argparse.Namespace, info: dict[str, Any]) -> list[Target]:
    sizes = QUICK if opts.quick else FULL
    keys = [k.strip() for k in opts.targets.split(",") if k.strip()]
    for k in keys:
        if k not in TARGET_KEYS:
            raise SystemExit(f"unknown target {k!r}; choose from {', '.join(TARGET_KEYS)}")

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="ctxproxy-field-", dir="/tmp"))
    fleet = Fleet(workdir, say)
    info["litellm"] = "LiteLLM not measured (left out with --targets)"
    try:
        litellm_python: Path | None = None
        if "litellm" in keys:
            t0 = time.perf_counter()
            litellm_python, version = ensure_litellm(opts.litellm_spec, say, workdir)
            info["install_seconds"] = time.perf_counter() - t0
            info["litellm"] = f"LiteLLM {version}" if litellm_python else f"**LiteLLM missing**: {version}"
        direct, pending = fleet.start(keys, litellm_python)
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                         skip_auto_headers=("User-Agent",)) as http:
            assert direct.child is not None
            await wait_http(http, direct.health, direct.child)
            for t in pending:
                assert t.child is not None
                try:
                    await wait_http(http, t.health, t.child, timeout=180.0 if t.key == "litellm" else 30.0)
                except (RuntimeError, TimeoutError) as exc:
                    t.broken = f"did not start: {str(exc)[:500]}"
                    say(f"{t.label}: {t.broken}")
            targets = sorted([direct, *pending], key=lambda t: ORDER[t.key])
            await measure(http, targets, sizes, info, say)
            info["own_cpu"] = cpu_seconds(os.getpid())
    finally:
        fleet.close(opts.keep)
    return targets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m bench.field", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (under 2 minutes instead of ~10)")
    parser.add_argument("--write", action="store_true", help=f"replace the section '{SECTION}' in docs/BENCHMARKS.md")
    parser.add_argument("--targets", default=",".join(TARGET_KEYS),
                        help=f"comma-separated subset of: {', '.join(TARGET_KEYS)} (direct always runs)")
    parser.add_argument("--litellm-spec", default=LITELLM_SPEC, help="what pip installs into bench/.venv-litellm")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stores, LiteLLM config)")
    opts = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    command = "python3 -m bench.field" + "".join(" " + shlex.quote(a) for a in (argv or sys.argv[1:]))
    started = datetime.now(UTC)
    load = [os.getloadavg()[0]]
    busy0, t0 = machine_busy_seconds(), time.perf_counter()
    info: dict[str, Any] = {"large_note": "not measured"}
    try:
        import uvloop
    except ImportError:
        targets = asyncio.run(amain(opts, info))
    else:
        targets = uvloop.run(amain(opts, info))
    seconds = time.perf_counter() - t0
    load.append(os.getloadavg()[0])
    busy = machine_busy_seconds() - busy0
    capacity = seconds * (os.cpu_count() or 1)
    others = max(0.0, busy - info.get("own_cpu", 0.0)) / capacity if capacity else 0.0
    install = info.get("install_seconds", 0.0)
    run = RunInfo(command, started, seconds - install, load, others, info["litellm"], QUICK if opts.quick else FULL,
                  info["large_note"])
    text = section(targets, run)
    print(text)
    if opts.write:
        write_doc(text, SECTION)
        print(f"wrote the section '{SECTION}' of docs/BENCHMARKS.md", file=sys.stderr)


if __name__ == "__main__":
    main()
