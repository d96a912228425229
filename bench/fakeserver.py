"""A fast fake upstream for benchmarks, in four APIs: fixed answers, no parsing beyond what is needed.

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

``POST /v1/responses`` (OpenAI Responses API) and ``POST /v1/messages``
(Anthropic Messages; serve it as the Anthropic upstream, whose base has no
``/v1``) answer the same way with the same text: one output message, or its
event stream. A proxy may hold back a stream's preamble (``response.created``,
``message_start``) until an event that commits the answer, so that an overflow
error can still be retried unseen; the first write therefore ends with the
first such event (``response.output_item.added``, ``content_block_start``), and
time to first byte means the same thing direct and through such a proxy.

``POST /v1beta/models/{model}:generateContent`` (Gemini API; serve it as the
Gemini upstream) answers one response object; ``:streamGenerateContent``
(``alt=sse``) its chunks, the first flushed alone, the last with ``finishReason``.
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


#: The Responses output item every answer carries, as the client sends it back.
RESPONSES_REPLY = {"type": "message", "id": "msg_bench", "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": REPLY["content"], "annotations": []}]}
#: The Messages assistant turn every answer carries, as the client sends it back.
MESSAGES_REPLY = {"role": "assistant", "content": [{"type": "text", "text": REPLY["content"]}]}
_RESPONSES_USAGE = {"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 12,
                    "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 1012}
_MESSAGES_USAGE = {"input_tokens": 1000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                   "output_tokens": 12}


def _named(events: list[dict[str, Any]]) -> bytes:
    """Server-sent events named by their ``type``, as both OpenAI's Responses API and Anthropic send them."""
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)


def _response(status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "resp_bench", "object": "response", "created_at": 1700000000, "status": status,
            "model": "bench-model", "output": output, "error": None, "incomplete_details": None,
            "usage": _RESPONSES_USAGE if status == "completed" else None}


RESPONSE = orjson.dumps(_response("completed", [RESPONSES_REPLY]))


def _responses_stream() -> tuple[bytes, bytes]:
    item = {**RESPONSES_REPLY, "status": "in_progress", "content": []}
    at = {"output_index": 0, "item_id": RESPONSES_REPLY["id"], "content_index": 0}
    part = {"type": "output_text", "text": "", "annotations": []}
    first = [{"type": "response.created", "response": _response("in_progress", [])},
             {"type": "response.in_progress", "response": _response("in_progress", [])},
             {"type": "response.output_item.added", "output_index": 0, "item": item}]
    rest = [{"type": "response.content_part.added", **at, "part": part},
            *({"type": "response.output_text.delta", **at, "delta": w if i == 0 else " " + w}
              for i, w in enumerate(_words)),
            {"type": "response.output_text.done", **at, "text": REPLY["content"]},
            {"type": "response.content_part.done", **at, "part": RESPONSES_REPLY["content"][0]},
            {"type": "response.output_item.done", "output_index": 0, "item": RESPONSES_REPLY},
            {"type": "response.completed", "response": _response("completed", [RESPONSES_REPLY])}]
    numbered = [{**e, "sequence_number": n} for n, e in enumerate(first + rest)]
    return _named(numbered[:len(first)]), _named(numbered[len(first):])


RESPONSES_FIRST, RESPONSES_REST = _responses_stream()
MESSAGE = orjson.dumps({"id": "msg_bench", "type": "message", "role": "assistant", "model": "bench-model",
                        "content": MESSAGES_REPLY["content"], "stop_reason": "end_turn", "stop_sequence": None,
                        "usage": _MESSAGES_USAGE})
MESSAGES_FIRST = _named([
    {"type": "message_start", "message": {"id": "msg_bench", "type": "message", "role": "assistant",
                                          "model": "bench-model", "content": [], "stop_reason": None,
                                          "stop_sequence": None, "usage": {**_MESSAGES_USAGE, "output_tokens": 1}}},
    {"type": "ping"},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
])
MESSAGES_REST = _named([
    *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w if i == 0 else " " + w}}
      for i, w in enumerate(_words)),
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
     "usage": {"output_tokens": 12}},
    {"type": "message_stop"},
])


async def _answer(request: web.Request, whole: bytes, first: bytes, rest: bytes) -> web.StreamResponse:
    """``whole`` as JSON, or with ``"stream":true`` the stream in two writes: ``first`` flushed, then ``rest``."""
    body = await request.read()
    if not _flag(body, b"stream"):
        return web.Response(body=whole, content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    await resp.write(first)
    await resp.write(rest)
    await resp.write_eof()
    return resp


async def responses(request: web.Request) -> web.StreamResponse:
    return await _answer(request, RESPONSE, RESPONSES_FIRST, RESPONSES_REST)


async def messages(request: web.Request) -> web.StreamResponse:
    return await _answer(request, MESSAGE, MESSAGES_FIRST, MESSAGES_REST)


#: The Gemini model turn every answer carries, as Gemini CLI sends it back (the streamed texts joined).
GEMINI_REPLY = {"role": "model", "parts": [{"text": REPLY["content"]}]}
_GEMINI_USAGE = {"promptTokenCount": 1000, "candidatesTokenCount": 12, "totalTokenCount": 1012}


def _gemini_chunk(text: str, last: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
    chunk: dict[str, Any] = {"candidates": [candidate], "modelVersion": "bench-model", "responseId": "resp_bench"}
    if last:
        candidate["finishReason"] = "STOP"
        chunk["usageMetadata"] = _GEMINI_USAGE
    return chunk


GEMINI_RESPONSE = orjson.dumps(_gemini_chunk(REPLY["content"], True))
GEMINI_FIRST = _event(_gemini_chunk(_words[0], False))
GEMINI_REST = b"".join(_event(_gemini_chunk(" " + w, i == len(_words) - 2)) for i, w in enumerate(_words[1:]))


async def gemini(request: web.Request) -> web.StreamResponse:
    await request.read()
    if not request.match_info["call"].endswith(":streamGenerateContent"):
        return web.Response(body=GEMINI_RESPONSE, content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(GEMINI_FIRST)
    await resp.write(GEMINI_REST)
    await resp.write_eof()
    return resp


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1beta/models/{call}", gemini)
    app.router.add_get("/healthz", healthz)
    return app


async def serve(host: str, port: int, app: web.Application | None = None, *, reuse_port: bool = False) -> None:
    """Serve ``app`` (default: the fake upstream) until SIGTERM/SIGINT or until the parent process dies;
    ``reuse_port``: beside other processes on the same port (``SO_REUSEPORT``)."""
    runner = web.AppRunner(app if app is not None else make_app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_port=reuse_port or None)
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
