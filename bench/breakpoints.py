"""What the proxy's cache breakpoints are worth at Anthropic: Claude-like runs replayed under the API's cache rule.

    python3 -m bench.breakpoints

Each run drives the proxy (in process, SQLite, default tiers) with a Claude-like client against the fake Messages
upstream of tests/fakemessages.py, then replays the requests the upstream received, in order, against a model of
Anthropic's prompt cache as its documentation describes it: an entry is written at each breakpoint (the prefix up
to that block); a breakpoint reads the longest entry found at a block boundary up to 20 blocks before it; a request
pays 1.25 times for what it wrote (up to its last breakpoint, past what it read), 0.1 times for what it read and 1
time for the rest. A block's tokens: its JSON over 4. No TTL: the requests come back to back.

"before" is the same requests without the proxy's breakpoint on the last masked item (the summary block's kept:
what the proxy sent before), "after" as sent; both from one run, so the comparison is exact, while the runs
themselves vary a little between invocations (when background summaries land). Clients: "Claude Code" (two system
breakpoints and one on its last message: room for one more) and "none" (a client that sets none).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.context.view.projection import SUMMARY_HEADER
from proxy.settings import Settings
from tests.fakemessages import FakeMessages, uncontrolled
from tests.fakescript import STEP, Script
from tests.test_compaction_e2e import prose

LOOKBACK = 20
EPHEMERAL = {"type": "ephemeral"}
#: (name, window, words per tool output, steps)
RUNS = (("16k, 200-word outputs", 16_000, 200, 100), ("16k, 700-word outputs", 16_000, 700, 60),
        ("32k, 300-word outputs", 32_000, 300, 120), ("32k, 1,000-word outputs", 32_000, 1000, 80),
        ("40k, 1,000-word outputs", 40_000, 1000, 40), ("64k, 600-word outputs", 64_000, 600, 120))


@dataclass
class Cache:
    """Anthropic's prompt cache as documented, and what the requests replayed against it paid."""

    entries: set[str]
    read: int = 0
    written: int = 0
    uncached: int = 0

    def request(self, body: dict[str, Any]) -> None:
        blocks = [*(body.get("tools") or []), *body["system"],
                  *(block for message in body["messages"] for block in message["content"])]
        digest, keys, ends, end = hashlib.sha256(), [], [], 0
        for block in blocks:
            plain = orjson.dumps(uncontrolled(block))
            digest.update(plain)
            keys.append(digest.hexdigest())
            end += len(plain) // 4
            ends.append(end)
        marked = [i for i, block in enumerate(blocks) if "cache_control" in block]
        read = max((ends[p] for b in marked for p in range(b, max(-1, b - LOOKBACK - 1), -1)
                    if keys[p] in self.entries), default=0)
        written = max(0, ends[marked[-1]] - read) if marked else 0
        self.entries.update(keys[b] for b in marked)
        self.read, self.written, self.uncached = self.read + read, self.written + written, \
            self.uncached + end - read - written

    @property
    def cost(self) -> float:
        return self.uncached + 1.25 * self.written + 0.1 * self.read


def without_masked_end(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the summary-only rule sent it: the proxy's breakpoints before the last message off, but the
    summary block's (the client marks only its last message)."""
    *earlier, last = body["messages"]
    out = [{**m, "content": [b if i == 0 and str(b.get("text", "")).startswith(SUMMARY_HEADER)
                             else {k: v for k, v in b.items() if k != "cache_control"}
                             for i, b in enumerate(m["content"])]} for m in earlier]
    return {**body, "messages": [*out, last]}


async def run(window: int, words: int, steps: int, claude_code: bool, store: str) -> list[dict[str, Any]]:
    """The upstream requests of one Claude-like run through the proxy."""
    fake = FakeMessages(Script(steps=steps + 5), window=window)
    upstream = TestServer(fake.app())
    await upstream.start_server()
    root = str(upstream.make_url("")).rstrip("/")
    client = TestClient(TestServer(create_app(Settings(upstream=root + "/v1", anthropic_upstream=root, store=store,
                                                       context_window=window))))
    await client.start_server()
    rng = random.Random(6)
    system = [{"type": "text", "text": f"You code, part {i}. " + prose(rng, 300),
               **({"cache_control": EPHEMERAL} if claude_code and i < 2 else {})} for i in range(3)]
    tools = [{"name": "Bash", "input_schema": {"type": "object", "properties": {}}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Go. " + prose(rng, 200)}]}]
    try:
        for _ in range(steps):
            *earlier, last = messages
            if claude_code:  # its one moving breakpoint, on the last block of the last message
                last = {**last, "content": [*last["content"][:-1], {**last["content"][-1], "cache_control": EPHEMERAL}]}
            body = {"model": "m", "max_tokens": 512, "system": system, "tools": tools, "messages": [*earlier, last]}
            resp = await client.post("/v1/messages", data=orjson.dumps(body),
                                      headers={"x-api-key": "sk-bench", "X-Session-Id": "bench"})
            content = orjson.loads(await resp.read())["content"]
            step = int(STEP.search(content[-1]["input"]["command"]).group(1))  # type: ignore[union-attr]
            output = [{"type": "text", "text": f"step-{step}\n" + prose(rng, words)}]
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": content[-1]["id"], "content": output}]}]
    finally:
        await client.close()
        await upstream.close()
    return [turn.body for turn in fake.turns()]


async def main() -> None:
    print("| run | client | read | written | uncached | cost before | cost after | after ÷ before |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for n, (name, window, words, steps) in enumerate(RUNS):
            for claude_code in (True, False):
                store = f"sqlite:///{Path(folder) / f'{n}-{claude_code}.db'}"
                bodies = await run(window, words, steps, claude_code, store)
                before, after = Cache(set()), Cache(set())
                for body in bodies:
                    before.request(without_masked_end(body))
                    after.request(body)
                print(f"| {name} | {'Claude Code' if claude_code else 'none'} | {before.read:,} → {after.read:,} | "
                      f"{before.written:,} → {after.written:,} | {before.uncached:,} → {after.uncached:,} | "
                      f"{before.cost:,.0f} | {after.cost:,.0f} | {after.cost / before.cost:.3f} |")


if __name__ == "__main__":
    asyncio.run(main())
