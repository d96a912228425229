"""What a long agent run costs in prompt tokens: straight, through ctxproxy with summaries only, and with masking.

    python3 -m bench.cost [--write]

Replays one scripted 300-step run (``bench/costrun.py``: tool outputs of the
sizes real tools print) against a fake upstream that reports usage and counts
as cached the leading messages a request shares with the session's previous
one, four ways:

- **straight**: to the upstream directly, as if its window were unlimited;
- **summaries only**: through ctxproxy (128,000-token window, defaults) with
  masking off (``--keep-tool-outputs`` above the run's length);
- **masking + summaries**: through ctxproxy with its defaults;
- **masking at the threshold only**: the same without masking in batches
  below the threshold (``EngineSettings.mask_batch_share = None``), to show
  what the batches are for.

It reports the prompt tokens of every turn, the part read from the cache, the
summary calls and their prompt tokens, the reductions (answers with
``X-Ctxproxy-Compacted`` other than ``none``), and the share of requests
between reductions whose prompt began with the whole previous prompt (a
stable prefix). ``--write`` replaces the section ``## Cost of a long run
(issue 14)`` of docs/BENCHMARKS.md. Everything runs in this process, on
127.0.0.1, with a SQLite store in a temporary directory; about two minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp.test_utils import TestServer

from bench.costrun import STEPS, SYSTEM, TOOLS, USER_EVERY, Recorder, Step, instruction, script
from bench.latency import write_doc
from proxy.app import create_app
from proxy.keys import engine_key
from proxy.settings import Settings

WINDOW = 128_000
RUNS = {
    "straight": None,
    "summaries only": {"keep_tool_outputs": 10**6},
    "masking + summaries": {},
    "masking at the threshold only": {"batches": False},
}


@dataclasses.dataclass
class Result:
    name: str
    requests: int
    prompt: int
    cached: int
    summary_calls: int
    summary_prompt: int
    reductions: int
    stable: int
    between: int
    largest: int

    @property
    def total(self) -> int:
        return self.prompt + self.summary_prompt

    @property
    def billed(self) -> float:
        """Prompt tokens as billed when a cached one costs a tenth (Anthropic's reads; OpenAI's are 10-50 %)."""
        return self.total - 0.9 * self.cached


async def drive(url: str, steps: list[Step]) -> list[str]:
    """The agent: sends the run step by step, echoing each answer; returns each answer's compaction header."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": "Make the whole test suite pass."}]
    headers: list[str] = []
    async with aiohttp.ClientSession() as http:
        for n in range(STEPS + 1):
            if n and n % USER_EVERY == 0:
                messages.append({"role": "user", "content": instruction(n)})
            body = orjson.dumps({"model": "bench-model", "messages": messages, "tools": TOOLS})
            async with http.post(url, data=body, headers={"Authorization": "Bearer bench", "X-Session-Id": "cost",
                                                          "X-Bench-Step": str(n),
                                                          "Content-Type": "application/json"}) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise SystemExit(f"step {n}: {resp.status} {raw[:300]!r}")
                headers.append(resp.headers.get("X-Ctxproxy-Compacted", "none"))
            messages.append(orjson.loads(raw)["choices"][0]["message"])
            if n < STEPS:
                messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": steps[n].output})
    return headers


async def run(name: str, options: dict[str, Any] | None, steps: list[Step], tmp: Path) -> Result:
    fake = Recorder(steps)
    upstream = TestServer(fake.app(), host="127.0.0.1")
    await upstream.start_server()
    proxy: TestServer | None = None
    try:
        url = str(upstream.make_url("/v1/chat/completions"))
        if options is not None:
            settings = {key: value for key, value in options.items() if key != "batches"}
            app = create_app(Settings(upstream=str(upstream.make_url("/v1")), context_window=WINDOW,
                                      store=f"sqlite:///{tmp}/{name.replace(' ', '-')}.db", **settings))
            proxy = TestServer(app, host="127.0.0.1")
            await proxy.start_server()
            if options.get("batches") is False:
                engine = app[engine_key]
                engine.settings = dataclasses.replace(engine.settings, mask_batch_share=None)
            url = str(proxy.make_url("/v1/chat/completions"))
        headers = await drive(url, steps)
    finally:
        if proxy is not None:
            await proxy.close()
        await upstream.close()
    turns = fake.turns
    between = [i for i in range(1, len(turns)) if headers[i] == "none"]
    return Result(name, len(turns), sum(t.prompt for t in turns), sum(t.cached for t in turns), fake.summary_calls,
                  fake.summary_prompt, sum(1 for h in headers if h != "none"),
                  sum(1 for i in between if turns[i].stable), len(between), max(t.prompt for t in turns))


def report(results: dict[str, Result], seconds: float) -> str:
    straight, summaries, masked = results["straight"], results["summaries only"], results["masking + summaries"]
    rows = ["| run | requests | prompt tokens | cached | summary calls | summary prompt tokens | total | vs straight "
            "| vs summaries only | reductions | stable prefix between reductions | largest prompt | billed at 10 % "
            "for cached |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results.values():
        share = f"{r.stable / r.between:.1%} ({r.stable}/{r.between})" if r.between else "—"
        rows.append(f"| {r.name} | {r.requests} | {r.prompt:,} | {r.cached:,} | {r.summary_calls} | "
                    f"{r.summary_prompt:,} | {r.total:,} | {r.total / straight.total:.1%} | "
                    f"{r.total / summaries.total:.1%} | {r.reductions} | {share} | {r.largest:,} | {r.billed:,.0f} |")
    targets = [
        ("masking + summaries ≤ 50 % of straight's prompt tokens", masked.total / straight.total, 0.5, True),
        ("masking + summaries ≤ 80 % of summaries only", masked.total / summaries.total, 0.8, True),
        ("≥ 90 % of requests between reductions keep a stable prefix", masked.stable / max(1, masked.between), 0.9,
         False),
    ]
    lines = [f"- {text}: {value:.1%}, **{'met' if (value <= limit if below else value >= limit) else 'missed'}**"
             for text, value, limit, below in targets]
    return "\n".join([
        "## Cost of a long run (issue 14)", "",
        f"`python3 -m bench.cost --write`: one scripted {STEPS}-step agent run (bench/costrun.py), a "
        f"{WINDOW:,}-token window, a fake upstream counting prompt tokens with the proxy's tokenizer and, as cached, "
        "the leading messages shared with the session's previous request; totals include the summary calls' "
        f"prompts. {platform.python_version()}, {platform.machine()}, {seconds:.0f} s.", "",
        *rows, "", *lines, "",
        "Masking only at the threshold lets the view climb to the threshold between reductions, as summaries do, "
        "and saves little; masking in batches (once the outputs older than the last ten would free an eighth of "
        "the window) keeps it near the system prompt, the summary, the placeholders and the last ten outputs. "
        "Each batch changes the prompt once, after the region masked before: the requests that follow read "
        "the system prompt, the summary and that region from the cache.", ""])


async def main_async(write: bool) -> None:
    steps = script()
    started = time.perf_counter()
    results: dict[str, Result] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in RUNS.items():
            results[name] = await run(name, options, steps, Path(tmp))
    section = report(results, time.perf_counter() - started)
    print(section)
    if write:
        write_doc(section, section.splitlines()[0])  # the section, under its own heading


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="replace the section in docs/BENCHMARKS.md")
    asyncio.run(main_async(parser.parse_args().write))


if __name__ == "__main__":
    main()
