"""How long an agent's steps wait on compaction, with the summary written in the background and without.

Run: ``python3 -m bench.background [--steps 60] [--step-seconds 0.6] [--summary-seconds 3] [--thought-words 150]``

An agent sends a request, "thinks" ``--step-seconds``, sends the next; each step
adds a tool output and ``--thought-words`` of the model's own text (which masking
cannot free: with tool outputs alone, masking keeps the run under the trigger and
no summary is ever asked for). The fake upstream (in this process, an aiohttp server on
127.0.0.1) answers turns at once and takes ``--summary-seconds`` to write a
summary. The run goes twice through the proxy (a SQLite store in a temp dir):
with background compaction (``--precompact-threshold 0.6``, the default) and
without (``1.0``). It reports each run's slowest step as the agent saw it (time
from sending the request to the last byte of the answer), the steps that took
2 s or more, the summary calls, and the largest prompt the upstream received
against its window.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT
from proxy.settings import Settings
from tests.fakeupstream import is_summary_request

WINDOW = 16_000
TITLES = ("Goals", "Work completed", "Key decisions", "Files touched", "Errors", "Current state", "Next steps",
          "Identifiers")
SECTIONS = "\n".join(f"## {n}. {title}\nNone" for n, title in enumerate(TITLES, 1))
TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {}}}}]
WORDS = ("parser", "module", "config", "request", "handler", "buffer", "socket", "token", "commit", "build")


class Upstream:
    def __init__(self, summary_seconds: float, thought_words: int) -> None:
        self.summary_seconds = summary_seconds
        self.thought_words = thought_words
        self.rng = random.Random(2)
        self.summaries = 0
        self.largest = 0
        self.counter = TokenCounter()
        self.step = 0

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json(loads=orjson.loads)
        messages = body["messages"]
        if is_summary_request(messages):  # the proxy's summary call, in the client's own request's shape
            self.summaries += 1
            await asyncio.sleep(self.summary_seconds)  # a slow summary model
            return web.json_response({"choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": SECTIONS}}]})
        self.largest = max(self.largest, sum(self.counter.message_tokens(CHAT, m) for m in messages))
        self.step += 1
        call = {"id": f"c{self.step}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        thought = " ".join(self.rng.choice(WORDS) for _ in range(self.thought_words)) or None
        return web.json_response({"choices": [{"index": 0, "finish_reason": "tool_calls",
                                               "message": {"role": "assistant", "content": thought,
                                                           "tool_calls": [call]}}],
                                  "usage": {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1}})


async def run(precompact: float, steps: int, step_seconds: float, summary_seconds: float,
              thought_words: int) -> dict[str, Any]:
    fake = Upstream(summary_seconds, thought_words)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.chat)
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as tmp:
        async with TestServer(app) as upstream:
            settings = Settings(upstream=str(upstream.make_url("/v1")), store=f"sqlite:///{tmp}/facts.db",
                                context_window=WINDOW, precompact_threshold=precompact, min_retain_rounds=2)
            async with TestClient(TestServer(create_app(settings))) as proxy:
                messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                                  {"role": "user", "content": "Refactor the parser."}]
                waits = []
                for _ in range(steps):
                    started = time.perf_counter()
                    resp = await proxy.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-bench",
                                                                               "X-Session-Id": "bench"},
                                            data=orjson.dumps({"model": "m", "messages": messages, "tools": TOOLS}))
                    reply = (await resp.json())["choices"][0]["message"]
                    waits.append(time.perf_counter() - started)
                    output = " ".join(rng.choice(WORDS) for _ in range(300))
                    messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                                         "content": output}]
                    await asyncio.sleep(step_seconds)  # the agent runs the tool
    return {"precompact": precompact, "slowest": max(waits), "slow_steps": sum(w >= 2.0 for w in waits),
            "summaries": fake.summaries, "largest": fake.largest}


async def main_async(args: argparse.Namespace) -> None:
    print(f"{args.steps} steps of {args.step_seconds} s, summaries of {args.summary_seconds} s, window {WINDOW}, "
          f"{args.thought_words} words of text per step")
    print("| precompact threshold | slowest step (s) | steps ≥ 2 s | summary calls | largest prompt (tokens) |")
    print("| --- | --- | --- | --- | --- |")
    for precompact in (0.6, 1.0):
        r = await run(precompact, args.steps, args.step_seconds, args.summary_seconds, args.thought_words)
        print(f"| {r['precompact']} | {r['slowest']:.2f} | {r['slow_steps']} | {r['summaries']} | {r['largest']:,} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-seconds", type=float, default=0.6)
    parser.add_argument("--summary-seconds", type=float, default=3.0)
    parser.add_argument("--thought-words", type=int, default=150,
                        help="words of text in each assistant step (what masking cannot free)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
