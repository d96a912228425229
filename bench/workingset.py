"""The files in hand after compaction: recorded agent sessions replayed through the engine, and how many of the last
three written files' exact current texts the last view holds, beside plain truncation (issue 33).

    python3 -m bench.workingset [--no-working-set] [--only NAME,...] [--corpus DIR] [--files]

Reads the real recorded sessions of ``../shared/corpus/sessions/*.json`` (beside the repository root; never copied
into it): each a list of Chat messages with probes derived from the recording, among them ``files_written`` (in the
order the recording first wrote them) and ``final_files`` (each file's text as the session's own calls and outputs
last show it). Each session is replayed offline and deterministically, as an agent sends it: one request before each
assistant message (the conversation so far) and a last one with the whole session, each through
``ContextEngine.prepare`` over a SQLite file in a temporary directory, in a window a third of the session's tokens
(``stats.tokens_o200k``), the background compaction awaited after each request, and a summary model that keeps
nothing (it answers one line), so that what survives is the proxy's own doing.

Reported per session: the last three paths of ``files_written`` that ``final_files`` holds, and how many of their
texts the **last view** holds exactly (as a substring of a message's text, of a tool call's arguments or of a string
in them, or of a numbered read's lines without their numbers), under plain **truncation** (the newest messages that
fit the window) and under the **engine**; beside them the summaries and masking batches made, the views sent over
the window and the last view's tokens. ``--no-working-set`` gives the working set no budget (the engine before it);
``--files`` lists each file. docs/BENCHMARKS.md ("The files in hand after compaction") has its numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proxy.context.checkpoint import CompactionResult
from proxy.context.engine import ContextEngine, EngineSettings, Trigger
from proxy.context.log.history import HistoryManager
from proxy.context.summary.summarizer import SummaryAnswer
from proxy.context.view.pace import SessionPace
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.store.base import SessionKey
from proxy.store.sqlite import SqliteFactLog

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus" / "sessions"
#: The window is this part of the session's tokens.
WINDOW_DIVISOR = 3
LAST_WRITTEN = 3
#: What the summary model answers: nothing of the conversation.
NOTHING = "Nothing to keep."
#: A line of a numbered read (Claude Code's ``Read``, ``cat -n``): its number, then an arrow or a tab.
NUMBERED = re.compile(r"^ *\d+(?:→|\t)", re.MULTILINE)


@dataclass(frozen=True)
class Replay:
    """One session's replay: the last three written files and which of them each last view holds exactly."""

    name: str
    messages: int
    window: int
    requests: int
    summaries: int
    masks: int
    over_window: int
    last_view: int
    files: tuple[str, ...]
    truncation: tuple[bool, ...]
    engine: tuple[bool, ...]


def last_written(probes: dict[str, Any]) -> list[str]:
    """The last ``LAST_WRITTEN`` paths of ``files_written`` (the order the recording first wrote them) whose final
    text the probes hold."""
    final = probes["final_files"]
    return [path for path in probes["files_written"] if path in final][-LAST_WRITTEN:]


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def view_texts(view: Sequence[dict[str, Any]]) -> list[str]:
    """The texts a view shows: its messages' strings, each call's arguments parsed, and numbered reads unnumbered."""
    texts: list[str] = []
    for message in view:
        found = list(strings(message.get("content")))
        for call in message.get("tool_calls") or ():
            arguments = call.get("function", {}).get("arguments")
            found.extend(strings(arguments))
            if isinstance(arguments, str):
                with contextlib.suppress(orjson.JSONDecodeError):
                    found.extend(strings(orjson.loads(arguments)))
        texts.extend(found)
        texts.extend(NUMBERED.sub("", text) for text in found if NUMBERED.search(text))
    return texts


def held(view: Sequence[dict[str, Any]], final: dict[str, str], files: Sequence[str]) -> tuple[bool, ...]:
    texts = view_texts(view)
    return tuple(any(final[path] in text for text in texts) for path in files)


def truncated(counter: TokenCounter, messages: Sequence[dict[str, Any]], window: int) -> list[dict[str, Any]]:
    """Plain truncation: the newest messages that fit ``window`` tokens."""
    total = 0
    kept = 0
    for message in reversed(messages):
        total += counter.message_tokens(CHAT, message)
        if total > window:
            break
        kept += 1
    return list(messages[len(messages) - kept:])


async def replay(path: Path, tmp: Path, share: float | None) -> Replay:
    """One session through the engine, request by request; ``share``: the working set's (None: the default)."""
    session = orjson.loads(path.read_bytes())
    messages: list[dict[str, Any]] = session["messages"]
    window = session["stats"]["tokens_o200k"] // WINDOW_DIVISOR
    files = last_written(session["probes"])
    final = session["probes"]["final_files"]
    made = {"summary": 0, "mask": 0}

    async def model(prompt: list[dict[str, Any]], max_tokens: int) -> SummaryAnswer:
        return SummaryAnswer(NOTHING)

    def observe(key: SessionKey, trigger: Trigger, result: CompactionResult, seconds: float) -> None:
        if result.outcome in ("ok", "fallback"):
            made[result.tier] = made.get(result.tier, 0) + 1

    settings = EngineSettings(context_window=window) if share is None else EngineSettings(
        context_window=window, working_set_share=share)
    counter = TokenCounter()
    history = HistoryManager(await SqliteFactLog.open(tmp / f"{path.stem}.db"), clock=lambda: 0.0)
    engine = ContextEngine(history, settings, clock=lambda: 0.0, observer=observe, counter=counter)
    engine.pace = SessionPace(lambda: 0.0)  # no wall clock: a background summary starts one step ahead, every run
    key = SessionKey("bench", path.stem)
    ends = [index for index, message in enumerate(messages) if message.get("role") == "assistant" and index > 0]
    hashes: list[str] = []
    over = last = 0
    view: list[dict[str, Any]] = []
    for end in [*ends, len(messages)]:
        hashes.extend(message_hash(message) for message in messages[len(hashes):end])
        sent = messages[:end]
        state = await engine.history.sync(key, sent, hashes)
        prepared = await engine.prepare(key, sent, hashes, state, dialect=CHAT, model="replay", tools=None,
                                        max_output=None, complete=model)
        if engine.background.running(key) is not None:
            await engine.background.join(key)
        over += prepared.estimate.tokens > window
        view, last = list(prepared.messages), prepared.estimate.tokens
    await engine.aclose()
    await engine.history.log.aclose()
    return Replay(path.stem, len(messages), window, len(ends) + 1, made["summary"] + made.get("fallback", 0),
                  made["mask"], over, last, tuple(files), held(truncated(counter, messages, window), final, files),
                  held(view, final, files))


def fraction(kept: int, total: int) -> str:
    return f"{kept}/{total}" + (f" ({kept / total:.0%})" if total else "")


def table(results: Sequence[Replay], label: str, list_files: bool) -> str:
    rows = [f"| session | messages | window | summaries | masking batches | views over the window | last view | "
            f"last {LAST_WRITTEN} written, exact: truncation | {label} |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        rows.append(f"| {r.name} | {r.messages} | {r.window:,} | {r.summaries} | {r.masks} | {r.over_window} | "
                    f"{r.last_view:,} | {fraction(sum(r.truncation), len(r.files))} | "
                    f"{fraction(sum(r.engine), len(r.files))} |")
    total = sum(len(r.files) for r in results)
    rows.append(f"| **all** | {sum(r.messages for r in results)} | | {sum(r.summaries for r in results)} | "
                f"{sum(r.masks for r in results)} | {sum(r.over_window for r in results)} | | "
                f"{fraction(sum(sum(r.truncation) for r in results), total)} | "
                f"{fraction(sum(sum(r.engine) for r in results), total)} |")
    if list_files:
        for r in results:
            for path, cut, kept in zip(r.files, r.truncation, r.engine, strict=True):
                rows.append(f"    {r.name} {path}: truncation {'exact' if cut else '-'}, {label} "
                            f"{'exact' if kept else '-'}")
    return "\n".join(rows)


async def run_all(paths: Sequence[Path], share: float | None) -> list[Replay]:
    with tempfile.TemporaryDirectory() as tmp:
        return [await replay(path, Path(tmp), share) for path in paths]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="the recorded sessions' directory")
    parser.add_argument("--only", default="", help="comma-separated session names")
    parser.add_argument("--no-working-set", action="store_true", help="the working set gets no budget")
    parser.add_argument("--files", action="store_true", help="list each file")
    args = parser.parse_args()
    started = time.perf_counter()
    wanted = {name for name in args.only.split(",") if name}
    paths = [path for path in sorted(args.corpus.glob("*.json")) if not wanted or path.stem in wanted]
    if not paths:
        parser.error(f"no sessions in {args.corpus}")
    label = "engine without the working set" if args.no_working_set else "engine"
    print(table(asyncio.run(run_all(paths, 0.0 if args.no_working_set else None)), label, args.files))
    print(f"{time.perf_counter() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
