"""Gemini CLI's own compression answered from a ready checkpoint: how long its two calls take, and what reaches
the upstream meanwhile.

    python3 -m bench.clientcompress [--rounds N] [--write]

In one process (aiohttp servers on 127.0.0.1): the proxy over a SQLite file in a temp dir, and
``bench.fakeserver`` as its Gemini upstream, counting the requests it gets. A ~100k-token agent history
(``bench.latency.large_history``, written as Gemini CLI writes it: ``bench.routes.GEMINI``) goes through the
Gemini door once, the admin API compacts it (one summary call: the checkpoint is ready), then each round sends
Gemini CLI's two compression calls as it sends them (the oldest 70 % of the history under its compression
prompt, with the ask; then with the first answer and the check) and times each from send to the end of the
answer. ``--write`` replaces the section ``## Gemini CLI's compression answered (issue 20)`` of
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import tempfile
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.fakeserver import make_app
from bench.latency import large_history, write_doc
from bench.routes import GEMINI
from proxy.app import create_app
from proxy.clientcompact.texts import GEMINI_ASK, GEMINI_SYSTEM, GEMINI_VERIFY
from proxy.settings import Settings

HEADING = "## Gemini CLI's compression answered (issue 20)"
MODEL = "bench-model"
TOKEN = "bench-admin-token"
HEADERS = {"x-goog-api-key": "bench-gemini-key", "X-Session-Id": "bench-compress"}


def compression_body(history: list[dict[str, Any]], *tail: dict[str, Any]) -> bytes:
    system = {"role": "user", "parts": [{"text": GEMINI_SYSTEM + "\n\n(the rest of its prompt)"}]}
    return orjson.dumps({"contents": [*history, *tail], "systemInstruction": system,
                         "generationConfig": {"temperature": 1}})


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


async def measure(rounds: int) -> tuple[dict[str, list[float]], int, int]:
    """Milliseconds of each call kind, the upstream requests the compression calls caused, and the history's size."""
    upstream_requests = 0

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        nonlocal upstream_requests
        upstream_requests += 1
        return await handler(request)

    fake = make_app()
    fake.middlewares.append(count)
    with tempfile.TemporaryDirectory(prefix="ctxproxy-bench-") as tmp:
        upstream = TestServer(fake, host="127.0.0.1")
        await upstream.start_server()
        settings = Settings(gemini_upstream=str(upstream.make_url("")).rstrip("/"), store=f"sqlite:///{tmp}/f.db",
                            admin_token=TOKEN, context_window=1_000_000, precompact_threshold=1.0)
        proxy = TestServer(create_app(settings), host="127.0.0.1")
        await proxy.start_server()
        base = str(proxy.make_url("")).rstrip("/")
        messages = large_history(random.Random(20))
        contents = [GEMINI.item(m) for m in messages[1:]]
        system = {"parts": [{"text": messages[0]["content"]}]}
        url = f"{base}/v1beta/models/{MODEL}:generateContent"
        times: dict[str, list[float]] = {"ask": [], "check": []}
        try:
            async with aiohttp.ClientSession() as http:
                turn = orjson.dumps({"contents": contents, "systemInstruction": system})
                async with http.post(url, data=turn, headers=HEADERS) as resp:
                    if resp.status != 200:
                        raise SystemExit(f"the Gemini door answered {resp.status}: {await resp.text()}")
                async with http.get(f"{base}/admin/sessions", headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                    tenant = (await resp.json())[0]["tenant"]
                async with http.post(f"{base}/admin/sessions/{tenant}/bench-compress/compact?model={MODEL}",
                                     headers={"Authorization": f"Bearer {TOKEN}",
                                              "X-Upstream-Authorization": HEADERS["x-goog-api-key"]}) as resp:
                    outcome = (await resp.json())["outcome"]
                    if outcome != "ok":
                        raise SystemExit(f"the admin compaction did not make a checkpoint: {outcome}")
                before = upstream_requests
                history = contents[: int(len(contents) * 0.7) // 2 * 2]
                ask = {"role": "user", "parts": [{"text": f"Generate a new <state_snapshot>.\n\n{GEMINI_ASK}"}]}
                for _ in range(rounds):
                    started = time.perf_counter()
                    async with http.post(url, data=compression_body(history, ask), headers=HEADERS) as resp:
                        answer = await resp.json()
                    times["ask"].append((time.perf_counter() - started) * 1000)
                    snapshot = answer["candidates"][0]["content"]["parts"][0]["text"]
                    check = [{"role": "model", "parts": [{"text": snapshot}]},
                             {"role": "user", "parts": [{"text": GEMINI_VERIFY + " Otherwise, repeat it."}]}]
                    started = time.perf_counter()
                    async with http.post(url, data=compression_body(history, *check), headers=HEADERS) as resp:
                        await resp.read()
                    times["check"].append((time.perf_counter() - started) * 1000)
                caused = upstream_requests - before
        finally:
            await proxy.close()
            await upstream.close()
    return times, caused, len(contents)


def report(times: dict[str, list[float]], caused: int, items: int, rounds: int) -> str:
    rows = ["| call | n | p50 ms | p99 ms | max ms |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, label in (("ask", "1: generate the `<state_snapshot>`"), ("check", "2: critically evaluate it")):
        values = times[name]
        rows.append(f"| {label} | {len(values)} | {pct(values, 50):.1f} | {pct(values, 99):.1f} "
                    f"| {max(values):.1f} |")
    return "\n".join([
        HEADING, "",
        f"`python3 -m bench.clientcompress --rounds {rounds}`: a {items}-entry (~100k-token) Gemini history "
        "through the Gemini door, compacted once by the admin API, then Gemini CLI's two compression calls as it "
        "sends them (the oldest 70 % of the history), each timed from send to the end of its answer; the proxy "
        f"and the fake upstream in one process. Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
        *rows, "",
        f"Upstream requests the {2 * rounds} compression calls caused: {caused}. Target (issue 20): answered in "
        f"under 100 ms from a ready checkpoint with no upstream call: "
        f"{'met' if caused == 0 and max(max(v) for v in times.values()) < 100 else '**missed**'}.", "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--write", action="store_true", help=f"replace the section '{HEADING}'")
    opts = parser.parse_args()
    times, caused, items = asyncio.run(measure(opts.rounds))
    text = report(times, caused, items, opts.rounds)
    print(text)
    if opts.write:
        write_doc(text, HEADING)


if __name__ == "__main__":
    main()
