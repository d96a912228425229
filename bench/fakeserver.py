"""A fast fake OpenAI upstream for benchmarks: fixed answers, no parsing beyond what is needed.

Run: ``python3 -m bench.fakeserver --port N`` (prints ``ready`` on stdout once listening).

``POST /v1/chat/completions`` reads the body whole (so keep-alive stays clean)
and looks for ``"stream":true`` in the raw bytes instead of parsing JSON, so its
cost does not grow with the conversation beyond reading it. Non-streaming
requests get one fixed completion; streaming ones get a short SSE stream, the
first event flushed on its own (so time-to-first-byte means something), then the
rest, then, if ``"include_usage":true`` was asked for, a usage-only chunk, then
``[DONE]`` (``"stream": true`` with a space, as the OpenAI SDK writes it, counts
too). Runs on uvloop when it is installed. Stops on SIGTERM/SIGINT, and by
itself when its parent process dies.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

import orjson
from aiohttp import web

#: The assistant message every answer carries; the benchmark client echoes it back as the next step.
REPLY = {"role": "assistant", "content": "Done. I applied the change and the tests pass."}
USAGE = {"prompt_tokens": 1000, "completion_tokens": 12, "total_tokens": 1012}

COMPLETION = orjson.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": "bench-model",
    "system_fingerprint": "fp_bench",
    "choices": [{"index": 0, "message": REPLY, "logprobs": None, "finish_reason": "stop"}],
    "usage": USAGE,
})

_BASE = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000, "model": "bench-model",
         "system_fingerprint": "fp_bench"}


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _delta(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return _event({**_BASE, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})


FIRST_EVENT = _delta({"role": "assistant", "content": ""})
_words = REPLY["content"].split(" ")
REST_EVENTS = b"".join(
    [_delta({"content": w if i == 0 else " " + w}) for i, w in enumerate(_words)] + [_delta({}, "stop")]
)
USAGE_EVENT = _event({**_BASE, "choices": [], "usage": USAGE})
DONE_EVENT = b"data: [DONE]\n\n"


def _flag(body: bytes, name: bytes) -> bool:
    """``"name":true`` in compact JSON or ``"name": true`` as json.dumps writes it (the OpenAI SDK's spacing)."""
    return b'"' + name + b'":true' in body or b'"' + name + b'": true' in body


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    if not _flag(body, b"stream"):
        return web.Response(body=COMPLETION, content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    await resp.write(FIRST_EVENT)
    tail = REST_EVENTS + (USAGE_EVENT if _flag(body, b"include_usage") else b"") + DONE_EVENT
    await resp.write(tail)
    await resp.write_eof()
    return resp


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/healthz", healthz)
    return app


async def serve(host: str, port: int, app: web.Application | None = None) -> None:
    """Serve ``app`` (default: the fake upstream) until SIGTERM/SIGINT or until the parent process dies."""
    runner = web.AppRunner(app if app is not None else make_app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    print("ready", flush=True)
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except TimeoutError:
                if os.getppid() != parent:  # orphaned: the benchmark died without stopping us
                    break
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.host, args.port))
    else:
        uvloop.run(serve(args.host, args.port))
    sys.exit(0)


if __name__ == "__main__":
    main()
