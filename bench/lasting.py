"""How long a compaction lasts: prefix changes and summary calls of a 60-step tool loop in a 16k window.

    python3 -m bench.lasting [--write]

Deterministic (no wall clock, no sockets): the context engine directly over a
SQLite file, an instant summary model answering a ~400-token summary, and
after each step the background compaction awaited, so that a run always makes
the same decisions. Four runs: tool outputs of about 1,000 and 2,500 tokens,
beside tool definitions (and instructions) of about 3,000 and 9,000 tokens,
the fixed part an agent such as Codex sends with every request.

Reported per run:

- **head changes**: views whose first ``HEAD`` items (the system prompt, the
  first user message or the summary, the first step) differ from the previous
  view's: what a summary, or masking reaching back to the start, costs the
  provider's prompt cache (everything after the tools is read again);
- **any changes**: views that do not begin with the whole previous view (a
  masking batch that reaches only the last steps counts here, not above);
- **summary calls**, **masking batches** (reductions that called no model)
  and the **largest prompt** sent, tools included.

``--write`` replaces the section ``## Compactions that last (issue 19)`` of
docs/BENCHMARKS.md.

``--priced`` runs instead the fixed runs of issue 34 (``bench/lastingcost.py``):
16k with 1k and 2.5k outputs (60 steps), 32k (150 steps) and 128k (300 steps)
of the scripted run of bench/costrun.py, priced at Anthropic's rates on a
simulated clock with idle gaps, beside the same runs sent directly; with
``--write`` it replaces the section ``## Prefix changes and cost at Anthropic's
prices (issue 34)``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench import lastingcost
from bench.latency import write_doc
from bench.toolloop import KEY, STEPS, SUMMARY, sized, tools_of
from proxy.context.checkpoint import CompactionResult
from proxy.context.engine import ContextEngine, EngineSettings, Trigger
from proxy.context.log.history import HistoryManager
from proxy.context.summary.summarizer import SummaryAnswer
from proxy.context.view.masking import KEEP_OUTPUTS_SHARE
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.store.base import SessionKey
from proxy.store.sqlite import SqliteFactLog

HEADING = "## Compactions that last (issue 19)"
WINDOW = 16_000
#: Items of the view's head whose change counts as a head change.
HEAD = 4
DEBUG = False
RUNS = ((1_000, 3_000), (2_500, 3_000), (1_000, 9_000), (2_500, 9_000))
@dataclass(frozen=True)
class Result:
    output: int
    fixed: int
    head_changes: int
    any_changes: int
    summary_calls: int
    masks: int
    largest: int


async def run(output: int, fixed: int, tmp: Path) -> Result:
    counter = TokenCounter()
    rng = random.Random(output * 31 + fixed)
    tools = tools_of(counter, fixed)
    calls = 0
    masks = 0

    async def model(messages: list[dict[str, Any]], max_tokens: int) -> SummaryAnswer:
        nonlocal calls
        calls += 1
        return SummaryAnswer(f"{SUMMARY}\nSummary {calls}.")  # each a new text, as a model's would be

    def observe(key: SessionKey, trigger: Trigger, result: CompactionResult, seconds: float) -> None:
        nonlocal masks
        masks += result.outcome == "ok" and result.tier == "mask"
        if DEBUG:
            print(trigger, result.outcome, result.tier, result.tokens_before, result.tokens_after, result.detail)

    history = HistoryManager(await SqliteFactLog.open(tmp / f"{output}-{fixed}.db"), clock=lambda: 0.0)
    engine = ContextEngine(history, EngineSettings(context_window=WINDOW, keep_tool_output_share=KEEP_OUTPUTS_SHARE),
                           clock=lambda: 0.0, observer=observe,
                           counter=counter)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Make the whole test suite pass."}]
    previous: list[dict[str, Any]] | None = None
    head_changes = any_changes = largest = 0
    for step in range(STEPS):
        hashes = [message_hash(m) for m in messages]
        state = await engine.history.sync(KEY, messages, hashes)
        prepared = await engine.prepare(KEY, messages, hashes, state, dialect=CHAT, model="m", tools=tools,
                                        max_output=None, complete=model)
        job = engine.background.running(KEY)
        if job is not None:
            await engine.background.join(KEY)
        view = [orjson.loads(orjson.dumps(m)) for m in prepared.messages]
        largest = max(largest, prepared.estimate.tokens)
        if previous is not None:
            head = min(HEAD, len(previous))
            head_changes += view[:head] != previous[:head]
            any_changes += view[: len(previous)] != previous
        previous = view
        call = {"id": f"call_{step}", "type": "function",
                "function": {"name": f"tool_{step % 8}", "arguments": orjson.dumps({"arg": f"step {step}"}).decode()}}
        messages += [{"role": "assistant", "content": f"Step {step}: looking further.", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{step}", "content": sized(counter, output, rng)}]
    await engine.aclose()
    await engine.history.log.aclose()
    return Result(output, counter.tools_tokens(tools), head_changes, any_changes, calls, masks, largest)


async def main_async(write: bool, label: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        results = [await run(output, fixed, Path(tmp)) for output, fixed in RUNS]
    rows = [f"| {label} | {r.output:,} | {r.fixed:,} | {r.head_changes} | {r.any_changes} | {r.summary_calls} | "
            f"{r.masks} | {r.largest:,} |" for r in results]
    return "\n".join(rows)


def section(before: str, after: str) -> str:
    return "\n".join([
        HEADING, "",
        f"`python3 -m bench.lasting --write`: a {STEPS}-step tool loop in a {WINDOW:,}-token window (defaults "
        "otherwise), the engine over SQLite with an instant summary model, background compactions awaited after "
        f"each step (deterministic). A head change is a view whose first {HEAD} items differ from the previous "
        "view's (a summary, or masking reaching the start); any change, a view that does not begin with the whole "
        "previous view. Before: 6c2b706, before issue 19; 19399d6: the fixed part in every threshold and the kept "
        "outputs a token budget (then opt-in); after: the tail budgeted in view tokens, keeping the masked step "
        "before an over-budget last one, and a summary asked for only when the checkpoint it would make frees a "
        "tenth (the calls whose answer was thrown away, 1k/9k row: 11 of 20 at 19399d6, 2 of 8 after).", "",
        "| code | output tokens | fixed tokens (tools) | head changes | any changes | summary calls | masking "
        "batches | largest prompt |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        before, after, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--before", type=Path, help="rows of a run of this file at the starting commit")
    parser.add_argument("--write", action="store_true", help="replace the section in docs/BENCHMARKS.md")
    parser.add_argument("--priced", action="store_true", help="the priced runs of issue 34 (bench/lastingcost.py)")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.priced:
        rows = lastingcost.rows(asyncio.run(lastingcost.measure()), args.label)
        render, heading = lastingcost.section, lastingcost.HEADING
    else:
        rows = asyncio.run(main_async(args.write, args.label))
        render, heading = section, HEADING
    print(rows)
    if args.write:
        before = args.before.read_text().strip() if args.before is not None else ""
        write_doc(render(before, rows), heading)
    print(f"{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
