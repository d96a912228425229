"""What one request costs as its session grows: the whole proxy in process, requests profiled at 50, 200 and 800 steps.

    python3 -m bench.steps [--steps 50,200,800] [--profiled 10] [--scenarios plain,title,probe]

The project's standard: per-request work grows with what is new, not with the
whole history. A chat tool loop (``--output`` words of tool output a step, a
``--window`` of 32k: masking batches and summaries come and go) runs through
ctxproxy over a SQLite file, against the tests' fake upstream in a process of
its own; the ``--profiled`` requests ending at each of ``--steps`` run under
cProfile, which sees the proxy's whole work (the offload pool is kept out of
it: everything runs on the loop). Reported per request: the proxy's time
(``front_door``'s handler, under the profiler: for comparing, not absolute),
Python function calls, chain hashes (``proxy.context.log.chain``) and item
hashes (the dialect's). Call counts are deterministic; the request's body
grows with the history, so parsing it does too, and nothing else should.

Scenarios: ``plain``, the loop alone; ``title``, a title call (a system prompt
of its own and the run's first user message, no tools) before each step: a
conversation of its own under the run's session id; ``probe``, the run's first
two messages without tools before each step, a side call that stays in the run's
log and leaves its head on a branch of its own. After each step the
background summary, if one started, is awaited: every run makes the same
decisions. Prints a Markdown table; it writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy import offload
from proxy.app import create_app
from proxy.keys import engine_key
from proxy.settings import Settings
from tests.redisproc import free_ports

WORDS = "config parser handler request retry socket buffer stream token index commit branch merge".split()
TOOLS = [{"type": "function", "function": {"name": "run", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}}}}]
#: The fake upstream: a tool call for every request that offers tools, a short text for any other.
UPSTREAM = r'''
import sys, orjson
from aiohttp import web
from tests.fakeupstream import FakeUpstream, Reply
class Loop(FakeUpstream):
    def next_reply(self, body):
        n = next(self._ids)
        if not body.get("tools"):
            return Reply(content=f"Title {n}")
        return Reply(tool_calls=[{"id": f"call_{n}", "type": "function",
                                  "function": {"name": "run", "arguments": orjson.dumps({"step": n}).decode()}}])
web.run_app(Loop().app(), port=int(sys.argv[1]), print=lambda *a: print("ready", flush=True))
'''
SCENARIOS = ("plain", "title", "probe")


@dataclass(frozen=True)
class Row:
    scenario: str
    steps: int
    messages: int
    ms: float
    calls: int
    chain_hashes: int
    item_hashes: int


def side_call(scenario: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    if scenario == "title":
        return [{"role": "system", "content": "Write a five-word title for the conversation."}, messages[1]]
    return messages[:2] if scenario == "probe" else None


def per_request(profile: cProfile.Profile, n: int) -> tuple[float, int, int, int]:
    """The handler's time, the function calls, chain hashes and item hashes of ``n`` profiled requests, each ÷ n."""
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    handler = sum(v[3] for (path, _, name), v in stats.items() if path.endswith("frontdoor.py") and name == "handle")
    calls = sum(v[1] for v in stats.values())
    chains = sum(v[1] for (path, _, name), v in stats.items() if path.endswith("chain.py") and name == "chain_hash")
    items = sum(v[1] for (path, _, name), v in stats.items() if "/proxy/dialects/" in path and name == "hash")
    return handler * 1000 / n, calls // n, chains // n, items // n


async def run(scenario: str, marks: list[int], profiled: int, window: int, output: int) -> list[Row]:
    port, proxy_port = free_ports(2)
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(port)], stdout=subprocess.PIPE)
    assert upstream.stdout is not None
    upstream.stdout.readline()
    rng = random.Random(1)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(Settings(upstream=f"http://127.0.0.1:{port}/v1", store=f"sqlite:///{tmp}/facts.db",
                                  context_window=window, log_level="WARNING"))
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", proxy_port).start()
        url = f"http://127.0.0.1:{proxy_port}/v1/chat/completions"
        headers = {"X-Session-Id": f"steps-{scenario}", "Content-Type": "application/json"}
        engine = app[engine_key]
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                          {"role": "user", "content": "Make the whole test suite pass."}]
        profile: cProfile.Profile | None = None
        try:
            async with aiohttp.ClientSession() as http:
                for step in range(1, max(marks) + 1):
                    side = side_call(scenario, messages) if step > 1 else None
                    if side is not None:
                        async with http.post(url, data=orjson.dumps({"model": "gpt-4o", "messages": side}),
                                             headers=headers) as resp:
                            assert resp.status == 200, await resp.text()
                    body = orjson.dumps({"model": "gpt-4o", "messages": messages, "tools": TOOLS})
                    mark = next((m for m in marks if m - profiled < step <= m), None)
                    if mark is not None:
                        profile = profile or cProfile.Profile()
                        profile.enable()
                    async with http.post(url, data=body, headers=headers) as resp:
                        reply = await resp.json()
                    if profile is not None:
                        profile.disable()
                    for key in list(engine.background._jobs):
                        await engine.background.join(key)
                    call = reply["choices"][0]["message"]
                    messages += [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"],
                                        "content": f"step {step}: " + " ".join(rng.choice(WORDS)
                                                                              for _ in range(output))}]
                    if profile is not None and step == mark:
                        rows.append(Row(scenario, step, len(messages) - 2, *per_request(profile, profiled)))
                        profile = None
        finally:
            await runner.cleanup()
            upstream.terminate()
            upstream.wait()
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| scenario | steps | messages | ms a request (profiled) | function calls | chain hashes | item hashes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r.scenario} | {r.steps} | {r.messages} | {r.ms:.2f} | {r.calls:,} | {r.chain_hashes:,} | "
              f"{r.item_hashes:,} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="50,200,800", help="where to profile, comma-separated")
    parser.add_argument("--profiled", type=int, default=10, help="requests profiled, ending at each of --steps")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--window", type=int, default=32_000)
    parser.add_argument("--output", type=int, default=300, help="words of tool output a step")
    opts = parser.parse_args()
    offload.LARGE_BYTES = 1 << 62  # everything on the loop, where the profiler sees it
    marks = sorted(int(s) for s in opts.steps.split(","))
    rows = [row for scenario in opts.scenarios.split(",")
            for row in asyncio.run(run(scenario, marks, opts.profiled, opts.window, opts.output))]
    print(table(rows))


if __name__ == "__main__":
    main()
