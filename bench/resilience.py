"""What a summary model that does not behave costs a run: the artifact trail it loses, the fold it makes slow.

    python3 -m bench.resilience [--write]

Two deterministic figures (no wall-clock measurement of the proxy itself):

- **Artifact coverage**: a 60-step tool loop in a 12k window (odd steps write a
  file, even steps run a command; ~560-token outputs), through the context
  engine over a SQLite file, with a lazy summary model that writes every section
  heading and "None" under each. Reported: the share of the run's written paths
  and commands (those made before the last request) that the last view names.
- **Fold latency**: a manual compaction in a 16k window whose summarised part
  is about 5,400 tokens, with a summary model that takes ``--call-seconds`` per
  call (an asyncio sleep: the model's time, not the proxy's). Reported: the
  summary calls made, the tokens each was sent, and the compaction's seconds.

``--write`` replaces the section ``## Summaries that fail (issue 18)`` of
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.latency import write_doc
from proxy.context.engine import ContextEngine, EngineSettings
from proxy.context.log.history import HistoryManager
from proxy.context.summary.summarizer import SECTIONS, SummaryAnswer
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.store.base import SessionKey
from proxy.store.sqlite import SqliteFactLog

WORDS = "the parser reads a config file then the handler retries the request when the socket closes early".split()
LAZY = "\n".join(f"## {n}. {title.split(':')[0]}\nNone" for n, title in enumerate(SECTIONS, 1))
KEY = SessionKey("bench", "resilience")
#: This file run at 8035563, before issue 18 (no artifact trail; chunks by characters / 3 against half the window).
BEFORE = ("Before issue 18 (this file run at 8035563): artifact coverage 17% (10 of 59; 9 summary calls); the fold "
          "took 2 calls of 4,027 and 1,611 tokens, 2.01 s.")
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
         for name in ("write_file", "run_shell_command")]


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def engine_over(path: Path, **settings: Any) -> ContextEngine:
    history = HistoryManager(await SqliteFactLog.open(path), clock=time.time)
    return ContextEngine(history, EngineSettings(**{"precompact_threshold": 1.0, **settings}))


async def coverage() -> tuple[float, int, int, int]:
    """(share named, named, made, summary calls) for the lazy-summariser run."""
    rng = random.Random(1)
    calls = 0

    async def lazy(messages: list[dict[str, Any]], max_tokens: int) -> SummaryAnswer:
        nonlocal calls
        calls += 1
        return SummaryAnswer(LAZY)

    with tempfile.TemporaryDirectory() as tmp:
        engine = await engine_over(Path(tmp) / "facts.db", context_window=12_000, keep_tool_outputs=1_000,
                                   mask_batch_share=None)  # no masking: the summary path alone
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                          {"role": "user", "content": "Port the parser, one module at a time."}]
        made: list[str] = []
        view: list[dict[str, Any]] = []
        for step in range(1, 61):
            hashes = [message_hash(m) for m in messages]
            state = await engine.history.sync(KEY, messages, hashes)
            prepared = await engine.prepare(KEY, messages, hashes, state, dialect=CHAT, model="m", tools=TOOLS,
                                            max_output=None, complete=lazy)
            view = prepared.messages
            if step % 2:
                name, arguments = "write_file", {"file_path": f"src/parser/mod_{step}.py", "content": "pass\n"}
            else:
                name, arguments = "run_shell_command", {"command": f"pytest tests/test_mod_{step}.py -q"}
            made.append(next(iter(arguments.values())))
            call = {"id": f"call_{step}", "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": f"call_{step}", "content": prose(rng, 420)}]
        await engine.aclose()
        await engine.history.log.aclose()
    shown = orjson.dumps(view).decode()
    before_last = made[:-1]  # the last call came in the reply to the last request
    named = sum(orjson.dumps(name).decode()[1:-1] in shown for name in before_last)
    return named / len(before_last), named, len(before_last), calls


async def fold(call_seconds: float) -> tuple[int, list[int], float]:
    """(summary calls, tokens sent in each, seconds) for a manual compaction of a ~5.4k-token part in 16k."""
    rng = random.Random(2)
    counter = TokenCounter()
    sent: list[int] = []

    async def model(messages: list[dict[str, Any]], max_tokens: int) -> SummaryAnswer:
        sent.append(sum(counter.text_tokens(str(m.get("content") or "")) for m in messages))
        await asyncio.sleep(call_seconds)
        return SummaryAnswer(LAZY)

    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Port the parser."}]
    for step in range(1, 19):
        messages += [{"role": "assistant", "content": f"Reading part {step}."},
                     {"role": "user", "content": prose(rng, 300)}]
    hashes = [message_hash(m) for m in messages]
    with tempfile.TemporaryDirectory() as tmp:
        engine = await engine_over(Path(tmp) / "facts.db", context_window=16_000, min_retain_rounds=2)
        await engine.history.sync(KEY, messages, hashes)
        started = time.perf_counter()
        result, _ = await engine.compact(KEY, messages, hashes, trigger="manual", dialect=CHAT, model="m",
                                         complete=model, window=16_000)
        seconds = time.perf_counter() - started
        await engine.aclose()
        await engine.history.log.aclose()
    assert result.outcome == "ok", result
    return len(sent), sent, seconds


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--call-seconds", type=float, default=1.0)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    share, named, made, calls = await coverage()
    count, sizes, seconds = await fold(args.call_seconds)
    lines = [
        "## Summaries that fail (issue 18)",
        "",
        f"`python3 -m bench.resilience` ({platform.python_version()}, {platform.machine()}).",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| artifact coverage, lazy summariser, 60 steps in 12k | {share:.0%} ({named} of {made} paths and "
        f"commands in the last view; {calls} summary calls) |",
        f"| fold of ~5.4k tokens in 16k, {args.call_seconds:g} s per call | {count} call(s) of "
        f"{', '.join(f'{n:,}' for n in sizes)} tokens, {seconds:.2f} s |",
        "",
        BEFORE,
        "",
    ]
    print("\n".join(lines))
    if args.write:
        write_doc("\n".join(lines), "## Summaries that fail (issue 18)")


if __name__ == "__main__":
    asyncio.run(main())
