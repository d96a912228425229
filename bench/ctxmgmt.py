"""Who compacts: the proxy, or the provider asked to (``context_management``, ``truncation``), over one scripted run.

    python3 -m bench.ctxmgmt [--write]

A 30-step tool run of the scripted Claude Code and Codex (tests/scripted.py)
through the proxy (a 3,000-token window, SQLite) to the fake upstreams that
implement the providers' own context management (tests/fakemessages.py,
tests/fakeresponses.py: the same servers the tests run). Per configuration: the
requests, the proxy's summary calls, the prompt tokens the clients sent, the
tokens the model read (the fake's count after its own edits, compaction or
truncation), the largest prompt it read, and the proxy's median overhead per
request (``X-Ctxproxy-Overhead-Ms``). Everything but the overhead is
deterministic. ``--write`` replaces the section ``## The providers' own context
management (issue 22)`` of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp.test_utils import TestClient, TestServer

from bench.latency import write_doc
from proxy.app import create_app
from proxy.constants import HEADER_OVERHEAD
from proxy.settings import Settings
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script
from tests.scripted import Claude, Codex

HEADING = "## The providers' own context management (issue 22)"
STEPS = 30
WINDOW = 3_000
TRIGGER = 1_500
THINKING = {"type": "adaptive"}
CLEAR_THINKING = {"type": "clear_thinking_20251015", "keep": "all"}
BETAS = "claude-code-20250219,context-management-2025-06-27,compact-2026-01-12"
#: (row name, the API, the request fields that ask the provider to manage the context).
RUNS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("Messages, clear_thinking only (the proxy compacts)", "messages",
     {"context_management": {"edits": [CLEAR_THINKING]}, "thinking": THINKING}),
    ("Messages, + compact_20260112", "messages",
     {"context_management": {"edits": [CLEAR_THINKING, {"type": "compact_20260112", "trigger": {
         "type": "input_tokens", "value": TRIGGER}}]}, "thinking": THINKING}),
    ("Messages, + clear_tool_uses_20250919 (keep 2)", "messages",
     {"context_management": {"edits": [CLEAR_THINKING, {"type": "clear_tool_uses_20250919", "trigger": {
         "type": "input_tokens", "value": TRIGGER}, "keep": {"type": "tool_uses", "value": 2}}]},
      "thinking": THINKING}),
    ("Responses, neither (the proxy compacts)", "responses", {}),
    ("Responses, context_management compaction", "responses",
     {"context_management": [{"type": "compaction", "compact_threshold": TRIGGER}]}),
    ("Responses, truncation auto", "responses", {"truncation": "auto"}),
)


@dataclass(frozen=True)
class Result:
    name: str
    requests: int
    summaries: int
    sent: int
    read: int
    largest: int
    overhead_ms: float


async def run(name: str, api: str, fields: dict[str, Any], tmp: Path) -> Result:
    fake: FakeMessages | FakeResponses = FakeMessages(Script(steps=STEPS)) if api == "messages" else FakeResponses(
        Script(steps=STEPS), window=WINDOW)
    upstream = TestServer(fake.app())
    await upstream.start_server()
    settings = Settings(upstream=str(upstream.make_url("/v1")), anthropic_upstream=str(upstream.make_url("")).rstrip(
        "/"), store=f"sqlite:///{tmp}/facts.db", context_window=WINDOW, precompact_threshold=1.0)
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(settings)))
    await client.start_server()
    agent = Claude(client, headers={"anthropic-beta": BETAS}) if api == "messages" else Codex(client)
    sent, overhead = 0, []
    try:
        for _ in range(STEPS + 1):
            body = orjson.loads(orjson.dumps(agent.body(**fields)))
            sent += sum(prompt_tokens(fake, body))
            overhead.append(float((await agent.step(**fields)).headers[HEADER_OVERHEAD]))
    finally:
        await client.close()
        await upstream.close()
    turns = fake.turns()
    return Result(name, len(turns), len([r for r in fake.requests if r.kind == "summary"]), sent,
                  sum(t.tokens or 0 for t in turns), max(t.tokens or 0 for t in turns), statistics.median(overhead))


def prompt_tokens(fake: FakeMessages | FakeResponses, body: dict[str, Any]) -> list[int]:
    """What the whole request holds, counted as the fake counts a prompt."""
    if isinstance(fake, FakeMessages):
        return fake.prompt_counts(body)[1]
    return [fake.window.count(part) for part in (body.get("tools"), body.get("instructions"), *body["input"])]


async def main_async() -> list[Result]:
    with tempfile.TemporaryDirectory() as tmp:
        results = []
        for number, (name, api, fields) in enumerate(RUNS):
            (Path(tmp) / str(number)).mkdir()
            results.append(await run(name, api, fields, Path(tmp) / str(number)))
        return results


def section(results: list[Result]) -> str:
    rows = [f"| {r.name} | {r.requests} | {r.summaries} | {r.sent:,} | {r.read:,} | {r.read / r.sent:.1%} | "
            f"{r.largest:,} | {r.overhead_ms:.2f} |" for r in results]
    return "\n".join([
        HEADING, "",
        f"`python3 -m bench.ctxmgmt --write`: a {STEPS}-step scripted run (tests/scripted.py) through the proxy "
        f"({WINDOW:,}-token window, SQLite) to the fakes that implement the providers' own context management "
        f"(triggers at {TRIGGER:,} tokens; the Responses fake's window is {WINDOW:,}). Tokens as the fakes count "
        "them (the serialised prompt, signatures included). A request that asks the provider to compact or clear "
        "goes as sent: no summary calls, the provider keeps it small. Clearing tool results alone does not keep this "
        "run under the proxy's window (the Messages fake has none here): a provider with that window would refuse "
        "it, and the proxy would rescue it reactively (tests/test_context_management.py).", "",
        "| run | requests | proxy summary calls | tokens sent | tokens the model read | read/sent | largest prompt "
        "read | proxy overhead p50 (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the section in docs/BENCHMARKS.md")
    args = parser.parse_args()
    started = time.perf_counter()
    results = asyncio.run(main_async())
    print(section(results))
    if args.write:
        write_doc(section(results), HEADING)
    print(f"{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
