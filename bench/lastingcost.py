"""Prefix changes and cost at Anthropic's prices of the fixed runs of issue 34 (``python3 -m bench.lasting --priced``).

Four runs, each through the context engine (as bench/lasting.py drives it:
SQLite, an instant summary model, background compactions awaited after each
step, deterministic) and sent directly (the whole conversation every step, as
if the window were unlimited):

- 16k window, 60 steps of ~1,000-token and of ~2,500-token tool outputs beside
  ~3,000 tokens of tool definitions (bench/lasting.py's first two runs);
- 32k window, the first 150 steps of bench/costrun.py's scripted run (outputs
  of the sizes real tools print, a new instruction every 60 steps);
- 128k window, all 300 steps of it.

Every request is priced as Anthropic bills a prompt cached up to its end:
the leading messages it shares with the previous request are read at 0.1 times the
input price, the rest written at 1.25 times; the answer is output. The clock is
simulated: a request every 20 s, and every 25th after an idle gap of 6 min,
past the 5-minute cache life, so that request writes its whole prompt (a cold
write: no compaction's doing, counted apart). Summary calls are billed as
uncached input and output.

Reported per run: **prefix changes** (views that do not begin with the whole
previous view), **summary calls**, the largest prompt, the **cost** and its
ratio to the direct run's, and the **re-write factor**: the issue's
"cache-creation tokens over peak context", with the peak context the
conversation's (what the direct run sends last, which a warm cache writes once,
token by token) and the writes after an idle gap (the TTL's, nobody's doing)
left out of both sides: warm cache writes over the direct run's warm writes.
1.0: no token was written twice. Over the proxied run's own peak (its largest
prompt, as ``proxy.savings`` divided per session before this issue) no run
longer than its window could come near 1.0: 60 outputs of 2,500 tokens are
150,000 tokens to write once, past a peak of 12,800. ``proxy.savings`` now
divides as here: by the client's largest request, less the writes after a gap.

The engine's pace runs on the same simulated clock, so it sees the gaps as a
cold cache (``proxy.context.view.worth``; the default ``--cache-ttl`` of 300 s).
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.costrun import SYSTEM, TOOLS, USER_EVERY, instruction, script
from bench.toolloop import KEY, STEPS, SUMMARY, sized, tools_of
from proxy.context.engine import ContextEngine, EngineSettings
from proxy.context.log.history import HistoryManager
from proxy.context.summary.summarizer import SummaryAnswer
from proxy.context.view.pace import DEFAULT_CACHE_TTL, SessionPace
from proxy.context.view.tokens import TokenCounter
from proxy.context.view.worth import READ_RATE, WRITE_RATE
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.store.sqlite import SqliteFactLog

HEADING = "## Prefix changes and cost at Anthropic's prices (issue 34)"
#: Dollars per token: Claude Sonnet's input and output (fixed here, so that the bench's figures do not move with
#: the bundled model map); cache writes and reads at Anthropic's rates, the engine's own (``worth``).
INPUT, OUTPUT = 3e-6, 15e-6
WRITE, READ = WRITE_RATE * INPUT, READ_RATE * INPUT
#: Seconds between requests, the idle gap before every GAP_EVERY-th one, and the cache's life (the default
#: ``--cache-ttl``, which the engine is run with).
PACE, GAP, GAP_EVERY, TTL = 20.0, 360.0, 25, DEFAULT_CACHE_TTL


@dataclass(frozen=True)
class Run:
    name: str
    window: int
    system: str
    tools: list[dict[str, Any]]
    #: Per step: the assistant's words, the tool called, its arguments, the output; and the user instructions by step.
    steps: list[tuple[str, str, str, str]]
    instructions: dict[int, str] = field(default_factory=dict)


@dataclass
class Bill:
    """What one way of sending a run costs, request by request."""

    requests: int = 0
    changes: int = 0
    summary_calls: int = 0
    largest: int = 0
    warm_writes: int = 0
    cold_writes: int = 0
    reads: int = 0
    dollars: float = 0.0
    _previous: list[Any] = field(default_factory=list)
    _last: float | None = None

    def request(self, now: float, prompt: list[Any], counts: list[int], output: int) -> None:
        """Price one request: its shared leading items read, the rest written (all of it when the cache is cold)."""
        shared = 0
        while shared < min(len(prompt), len(self._previous)) and prompt[shared] == self._previous[shared]:
            shared += 1
        if self._previous and shared < len(self._previous):
            self.changes += 1
        cold = self._last is None or now - self._last > TTL
        read = 0 if cold else sum(counts[:shared])
        written = sum(counts) - read
        if cold:
            self.cold_writes += written
        else:
            self.warm_writes += written
        self.reads += read
        self.dollars += read * READ + written * WRITE + output * OUTPUT
        self.requests += 1
        self.largest = max(self.largest, sum(counts))
        self._previous, self._last = prompt, now


@dataclass(frozen=True)
class Result:
    run: Run
    proxied: Bill
    direct: Bill

    @property
    def ratio(self) -> float:
        return self.proxied.dollars / self.direct.dollars

    @property
    def rewrite(self) -> float:
        return self.proxied.warm_writes / self.direct.warm_writes


def runs() -> list[Run]:
    counter = TokenCounter()
    fixed = []
    for output in (1_000, 2_500):
        rng = random_for(output)
        steps = [(f"Step {n}: looking further.", f"tool_{n % 8}", orjson.dumps({"arg": f"step {n}"}).decode(),
                  sized(counter, output, rng)) for n in range(STEPS)]
        fixed.append(Run(f"16k, {output:,}-token outputs", 16_000, "You are a coding agent.",
                         tools_of(counter, 3_000), steps))
    scripted = [(s.thought, s.tool, s.arguments, s.output) for s in script()]
    said = {n: instruction(n) for n in range(USER_EVERY, len(scripted), USER_EVERY)}
    return [*fixed, Run("32k, scripted", 32_000, SYSTEM, TOOLS, scripted[:150], said),
            Run("128k, scripted", 128_000, SYSTEM, TOOLS, scripted, said)]


def random_for(output: int) -> random.Random:
    """bench/lasting.py's seed for the run with these outputs and 3,000 tokens of tools."""
    return random.Random(output * 31 + 3_000)


def clock_at(step: int) -> float:
    """Simulated seconds at ``step``: PACE apart, GAP before every GAP_EVERY-th step."""
    return step * PACE + (step // GAP_EVERY) * GAP


async def send(run: Run, tmp: Path, proxied: bool) -> Bill:
    counter = TokenCounter(maxsize=200_000)
    bill = Bill()
    now = [0.0]

    async def model(messages: list[dict[str, Any]], max_tokens: int) -> SummaryAnswer:
        bill.summary_calls += 1
        answer = f"{SUMMARY}\nSummary {bill.summary_calls}."
        bill.dollars += (sum(counter.message_tokens(CHAT, m) for m in messages) * INPUT
                         + counter.text_tokens(answer) * OUTPUT)
        return SummaryAnswer(answer)

    engine: ContextEngine | None = None
    if proxied:
        history = HistoryManager(await SqliteFactLog.open(tmp / f"{run.window}-{len(run.steps)}-{id(run)}.db"),
                                 clock=lambda: now[0])
        engine = ContextEngine(history, EngineSettings(context_window=run.window), clock=lambda: now[0],
                               counter=counter)
        # The pace the engine learns (steps apart, summaries' length) on the simulated clock too: deterministic.
        engine.pace = SessionPace(lambda: now[0])
    messages: list[dict[str, Any]] = [{"role": "system", "content": run.system},
                                      {"role": "user", "content": "Make the whole test suite pass."}]
    tools_tokens = counter.tools_tokens(run.tools)
    for step, (thought, tool, arguments, output) in enumerate(run.steps):
        now[0] = clock_at(step)
        if step in run.instructions:
            messages.append({"role": "user", "content": run.instructions[step]})
        view: list[Any] = messages
        if engine is not None:
            hashes = [message_hash(m) for m in messages]
            state = await engine.history.sync(KEY, messages, hashes)
            prepared = await engine.prepare(KEY, messages, hashes, state, dialect=CHAT, model="m",
                                            tools=run.tools, max_output=None, complete=model)
            if engine.background.running(KEY) is not None:
                await engine.background.join(KEY)
            view = [orjson.loads(orjson.dumps(m)) for m in prepared.messages]
        call = {"id": f"call_{step}", "type": "function", "function": {"name": tool, "arguments": arguments}}
        answer = {"role": "assistant", "content": thought, "tool_calls": [call]}
        bill.request(now[0], [run.tools, *view], [tools_tokens, *(counter.message_tokens(CHAT, m) for m in view)],
                     counter.message_tokens(CHAT, answer))
        messages = [*messages, answer, {"role": "tool", "tool_call_id": f"call_{step}", "content": output}]
    if engine is not None:
        await engine.aclose()
        await engine.history.log.aclose()
    return bill


async def measure() -> list[Result]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs():
            results.append(Result(run, await send(run, Path(tmp), True), await send(run, Path(tmp), False)))
    return results


def rows(results: list[Result], label: str) -> str:
    return "\n".join(
        f"| {label} | {r.run.name} | {len(r.run.steps)} | {r.proxied.changes} | {r.proxied.summary_calls} | "
        f"{r.proxied.largest:,} | ${r.proxied.dollars:.2f} | ${r.direct.dollars:.2f} | {r.ratio:.2f} | "
        f"{r.rewrite:.2f} |" for r in results)


def section(before: str, after: str) -> str:
    return "\n".join([
        HEADING, "",
        "`python3 -m bench.lasting --priced --write` (bench/lastingcost.py): the engine over SQLite with an instant "
        "summary model, background compactions awaited after each step (deterministic), beside the same run sent "
        "directly. Priced as Anthropic bills a prompt cached to its end: input $3/M, the leading messages shared "
        "with the previous request read at 0.1 times, the rest written at 1.25 times, output $15/M; summary calls as "
        f"uncached input and output. Simulated clock: a request every {PACE:.0f} s, and every {GAP_EVERY}th after "
        f"{GAP / 60:.0f} min idle (past the {TTL / 60:.0f}-minute cache life: that request writes its whole prompt, "
        "no compaction's doing). A prefix change is a view that does not begin with the whole previous view. "
        "Re-write factor: warm cache writes over the direct run's, which writes every token once (the issue's "
        "\"cache-creation tokens ÷ peak context\" with the peak the conversation's, and the writes after a gap, "
        "the TTL's doing, left out of both; 1.0: no token written twice). Targets: prefix changes ≤ 1 per 5 steps, "
        "cost ≤ 0.45 of direct at 32k, re-write factor ≤ 1.2. Before: 194065a; 6f4f872: a masking batch waits for "
        "five of the session's typical outputs; after: cache-aware timing (proxy/context/view/worth.py: a reduction "
        "that nothing forces waits mid-burst, lands after an idle gap when the trigger would come before the next one, "
        "and a ready background summary waits alike) and batches that land deep (the kept outputs at most a fifth "
        "of the room beside the tools). At 16k with 2.5k outputs one change per five steps is out of reach "
        "without cutting the outputs: after a reduction the view holds 3.3k of tools, the masked region and the "
        "newest output, and the third output after it passes the trigger, so a change comes every third step "
        "however reductions are timed. Clipping every output to 1,400 tokens once as it enters the view (measured "
        "by clipping the run's outputs) gave 11 changes and 0.23 of the direct cost, taking 44 % of every output "
        "from the request that asked for it; those 20 changes rewrite almost nothing (factor 1.05), so the outputs "
        "stay whole (docs/COMPACTION.md, \"When a reduction is worth its cache write\").", "",
        "| code | run | steps | prefix changes | summary calls | largest prompt | cost | direct | cost ÷ direct "
        "| re-write factor |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        before, after, ""])
