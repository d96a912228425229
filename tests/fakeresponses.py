"""A fake OpenAI Responses API upstream for the real Codex CLI (and pi): a real aiohttp server.

``POST /v1/responses`` answers each turn of ``script`` (a reasoning item with
``encrypted_content``, then a call to the shell tool the request offers, or the
final message), streamed as the API streams it: ``response.created``,
``response.in_progress``, per item ``response.output_item.added``, its deltas and
``response.output_item.done``, then ``response.completed`` with ``usage``; no
``[DONE]``. It checks what the real API checks about history sent back with
``store: false`` (every reasoning item is one it issued, byte for byte, and is
followed by its item; calls and outputs pair up; not with ``previous_response_id``,
whose history it does not keep) and refuses a prompt over
``window`` in one of the API's three overflow shapes (``overflow``: ``http``,
``event`` or ``failed``). The proxy's summary calls are answered on
``/v1/chat/completions`` and on ``/v1/responses`` alike; ``/v1/responses/compact``
and a turn ending in ``compaction_trigger`` get one ``compaction`` item; a
summary call shaped like the client's request (the summariser's prompt leading
the last user message) is answered too. As the ChatGPT Codex backend does,
``require_stream`` refuses every request without ``stream: true`` and
``reject_max_output_tokens`` every one carrying ``max_output_tokens``. With
``strict_fields`` (``tests.fakeupstream.StrictFields``) a request carrying a
top-level field it does not take gets Azure OpenAI's 400 (recorded as
``refused``). It implements the API's own context management: with
``context_management: [{"type": "compaction", "compact_threshold": N}]`` a prompt
over ``N`` is answered with an encrypted ``compaction`` item before the turn's
items, a later request is read from its last compaction item on, and one
carrying a compaction item the fake did not issue, byte for byte, is refused;
with ``truncation: "auto"`` a prompt over ``window`` loses its oldest items
(those that lost their partner too) until it fits, instead of being refused
(``truncated`` counts them). The tokens recorded are the prompt as the model
reads it. Every answer, summaries on either route included, is billed as the
tokenizer counts its prompt and what the model wrote (``written``), its usage kept
with its record (``Recorded.usage``). Everything it receives is in ``requests``.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import time
from typing import Any

import orjson
from aiohttp import web

from tests.fakescript import (
    Recorded,
    Recorder,
    Script,
    cached_prefix,
    content_text,
    is_summary_prompt,
    pieces,
    sse,
)
from tests.fakeupstream import PREAMBLE, PREAMBLE_CALL, StrictFields

OVERFLOW_ERROR = {"type": "invalid_request_error", "code": "context_length_exceeded", "param": "input",
                  "message": "Your input exceeds the context window of this model. Please adjust your input and try "
                             "again."}
#: Codex's own compaction prompt (codex-rs core/templates/compact), which a proxy-driven run must never send.
CLIENT_COMPACTION = "You are performing a CONTEXT CHECKPOINT COMPACTION"
#: The ChatGPT Codex backend's answers to what it refuses.
STREAM_REQUIRED = {"detail": "Stream must be set to true"}
MAX_OUTPUT_REFUSED = {"detail": "Unsupported parameter: max_output_tokens"}


class FakeResponses(Recorder):
    """``script``: the run to drive. ``window``: refuse prompts over it. ``overflow``: in which shape."""

    def __init__(self, script: Script | None = None, window: int | None = None, overflow: str = "http") -> None:
        super().__init__(script, window, overflow)
        self._ids = itertools.count(1)
        #: encrypted_content of every reasoning item handed out, so one sent back can be checked.
        self._issued: set[str] = set()
        self._last_input: dict[str, list[Any]] = {}
        #: Refuse requests carrying a field it does not take, as Azure OpenAI does.
        self.strict_fields: StrictFields | None = None
        self.require_stream = False
        self.reject_max_output_tokens = False
        #: encrypted_content of every compaction item handed out by server-side compaction.
        self._compactions: set[str] = set()
        #: Items ``truncation: "auto"`` dropped, over all requests.
        self.truncated = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1/responses/compact", self.compact)
        app.router.add_post("/v1/chat/completions", self.chat_summary)
        app.router.add_route("*", "/{tail:.*}", self.other)
        return app

    # -- routes ---------------------------------------------------------------------------------

    async def other(self, request: web.Request) -> web.Response:
        """Anything else (``GET /v1/responses`` asking for a websocket included) is recorded and refused."""
        websocket = request.headers.get("Upgrade", "").lower() == "websocket"
        self._record(request, await request.text(), "websocket" if websocket else "other",
                     status=426 if websocket else 404)
        if websocket:
            return web.Response(status=426, text="Upgrade Required")
        return web.json_response({"error": {"type": "invalid_request_error", "code": "not_found", "param": None,
                                            "message": f"No route {request.method} {request.path}"}}, status=404)

    def _refusal(self, request: web.Request, body: dict[str, Any]) -> web.Response | None:
        """Azure's 400 for a field ``strict_fields`` does not take (recorded as ``refused``), else None."""
        unknown = self.strict_fields.unrecognised(body) if self.strict_fields is not None else None
        if unknown is None:
            return None
        self._record(request, body, "refused", status=400)
        return StrictFields.refusal(unknown)

    async def chat_summary(self, request: web.Request) -> web.Response:
        body = await request.json(loads=orjson.loads)
        if (refused := self._refusal(request, body)) is not None:
            return refused
        messages = body.get("messages") or []
        if not messages or not is_summary_prompt(messages[0].get("content")):
            self._record(request, body, "other", status=404)
            return web.json_response({"error": {"type": "invalid_request_error", "message": "summaries only"}},
                                     status=404)
        record = self._record(request, body, "summary")
        text = await self.summary(messages[1:])
        if isinstance(text, web.Response):
            return text
        prompt = self.window.count(body.get("tools")) + sum(self.window.count(m) for m in messages)
        completion = self.window.counter.text_tokens(text)
        record.usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return web.json_response({"id": "chatcmpl-summary", "object": "chat.completion", "model": body.get("model"),
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": text}}],
                                  "usage": record.usage})

    async def compact(self, request: web.Request) -> web.Response:
        body = await request.json(loads=orjson.loads)
        record = self._record(request, body, "compact")
        output = [self._compaction_item()]
        prompt = [body.get("tools"), body.get("instructions"), *(body.get("input") or [])]
        return web.json_response({"output": output, "usage": self._usage(record, output, self.window.count(*prompt))})

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json(loads=orjson.loads)
        if (refused := self._refusal(request, body)) is not None:
            return refused
        items: list[dict[str, Any]] = body.get("input") or []
        summary = is_summary_prompt(body.get("instructions")) or is_summary_prompt(_last_user_text(items)) or (
            bool(items) and is_summary_prompt(items[0].get("content")))
        refused = STREAM_REQUIRED if self.require_stream and body.get("stream") is not True else \
            MAX_OUTPUT_REFUSED if self.reject_max_output_tokens and "max_output_tokens" in body else None
        if refused is not None:
            self._record(request, body, "summary" if summary else "turn", status=400)
            return web.json_response(refused, status=400)
        prompt, counts = self.prompt_counts(body)
        tokens = sum(counts)
        key = str(body.get("prompt_cache_key"))
        if summary:
            record = self._record(request, body, "summary")
            if self.summary_style == PREAMBLE_CALL:
                n = next(self._ids)
                call = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "status": "completed",
                        "name": body["tools"][0]["name"], "arguments": "{}"}
                return await self._answer(request, body, record, [self._message(PREAMBLE), call], tokens,
                                          self._cached(key, prompt, counts))
            text = await self.summary(items)
            if isinstance(text, web.Response):
                return text
            return await self._answer(request, body, record, [self._message(text)], tokens,
                                      self._cached(key, prompt, counts))
        if items and items[-1].get("type") == "compaction_trigger":
            record = self._record(request, body, "compact")
            return await self._answer(request, body, record, [self._compaction_item()], tokens,
                                      self._cached(key, prompt, counts))
        if self.window.refuses(tokens):
            in_stream = self.overflow != "http" and bool(body.get("stream"))
            self._record(request, body, "turn", tokens=tokens, status=200 if in_stream else 400)
            return await self._overflow(request, body)
        # With previous_response_id the history lives upstream: outputs answer calls this request does not carry.
        problem = None if body.get("previous_response_id") else self._check_history(items)
        if problem is None and compact_threshold(body) is not None:
            problem = next((f"The encrypted content for item {i.get('id')} could not be verified." for i in items
                            if i.get("type") == "compaction" and i.get("encrypted_content") not in self._compactions),
                           None)
        if problem is not None:
            self._record(request, body, "turn", tokens=tokens, status=400)
            return web.json_response({"error": {"type": "invalid_request_error", "code": None, "param": "input",
                                                "message": problem}}, status=400)
        kind = "client_compaction" if _last_user_text(items).startswith(CLIENT_COMPACTION) else "turn"
        record = self._record(request, body, kind, tokens=tokens)
        cached = self._cached(key, prompt, counts)
        self._last_input[key] = prompt
        output = [self._message("Checkpoint written.")] if kind != "turn" else self._turn_output(body, items)
        threshold = compact_threshold(body)
        if kind == "turn" and threshold is not None and tokens > threshold:
            compaction = self._compaction_item()
            self._compactions.add(compaction["encrypted_content"])
            output = [compaction, *output]
        return await self._answer(request, body, record, output, tokens, cached)

    def prompt_counts(self, body: dict[str, Any]) -> tuple[list[Any], list[int]]:
        """The prompt as the model reads it (tools, instructions, input from ``_as_read``) and each part's tokens."""
        prompt = [body.get("tools"), body.get("instructions"), *self._as_read(body, body.get("input") or [])]
        return prompt, [self.window.count(part) for part in prompt]

    def _cached(self, key: str, prompt: list[Any], counts: list[int]) -> int:
        """What the prompt cache serves of ``prompt``: the prefix it shares with the last turn under ``key``, in
        128-token blocks from 1,024 tokens on, as OpenAI bills it."""
        cached = cached_prefix(self._last_input.get(key, []), prompt, counts)
        return cached // 128 * 128 if cached >= 1024 else 0

    # -- the script -----------------------------------------------------------------------------

    def _turn_output(self, body: dict[str, Any], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        command, output = _last_call(items)
        step = self.script.next_step(command, output)
        if isinstance(step, str):
            return [self._reasoning("Wrapping up."), self._message(step)]
        call = _shell_call(body.get("tools") or [], self.script.command(step))
        if call is None:
            return [self._message("No shell tool was offered.")]
        n = next(self._ids)
        return [self._reasoning(f"Step {step} next."),
                {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "status": "completed", **call}]

    def _reasoning(self, summary: str) -> dict[str, Any]:
        n = next(self._ids)
        secret = base64.b64encode(hashlib.sha256(f"{n}:{summary}".encode()).digest() * 4).decode()
        self._issued.add(secret)
        return {"type": "reasoning", "id": f"rs_{n}", "summary": [{"type": "summary_text", "text": summary}],
                "encrypted_content": secret}

    def _message(self, text: str) -> dict[str, Any]:
        return {"type": "message", "id": f"msg_{next(self._ids)}", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}

    def _as_read(self, body: dict[str, Any], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The input as the model reads it: from the last compaction item it issued on, and with ``truncation:
        "auto"`` the oldest items dropped until it fits the window (an item left without its partner goes too)."""
        marks = [i for i, item in enumerate(items) if item.get("type") == "compaction"
                 and item.get("encrypted_content") in self._compactions]
        seen = items[marks[-1]:] if marks else items
        if body.get("truncation") != "auto":
            return seen
        fixed, whole = self.window.count(body.get("tools"), body.get("instructions")), len(seen)
        while len(seen) > 1 and self.window.refuses(fixed + self.window.count(*seen)):
            seen = seen[1:]
            while len(seen) > 1 and seen[0].get("type") in ("function_call_output", "reasoning"):
                seen = seen[1:]
        self.truncated += whole - len(seen)
        return seen

    def _compaction_item(self) -> dict[str, Any]:
        return {"type": "compaction", "id": f"cmp_{next(self._ids)}",
                "encrypted_content": base64.b64encode(f"compaction-{next(self._ids)}".encode()).decode()}

    def _check_history(self, items: list[dict[str, Any]]) -> str | None:
        """What the real API refuses in history sent back with ``store: false``; ``None`` when it is fine."""
        calls = {i.get("call_id") for i in items if i.get("type") == "function_call"}
        outputs = {i.get("call_id") for i in items if i.get("type") == "function_call_output"}
        for index, item in enumerate(items):
            if item.get("type") != "reasoning":
                continue
            if item.get("encrypted_content") not in self._issued:
                return f"The encrypted content for item {item.get('id')} could not be verified."
            following = items[index + 1] if index + 1 < len(items) else {}
            if following.get("type") not in ("function_call", "message"):
                return (f"Item '{item.get('id')}' of type 'reasoning' was provided without its required following "
                        "item.")
        if missing := sorted(str(c) for c in outputs - calls):
            return f"No tool call found for function call output with call_id {missing[0]}."
        if missing := sorted(str(c) for c in calls - outputs):
            return f"No tool output found for function call {missing[0]}."
        return None

    # -- the wire -------------------------------------------------------------------------------

    @staticmethod
    def _response(body: dict[str, Any], rid: str, status: str, output: list[dict[str, Any]],
                  **extra: Any) -> dict[str, Any]:
        return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status,
                "model": body.get("model"), "output": output, "error": None, "incomplete_details": None,
                "store": body.get("store", True), **extra}

    def _usage(self, record: Recorded, output: list[dict[str, Any]], tokens: int, cached: int = 0) -> dict[str, Any]:
        """What the answer ``output`` to a prompt of ``tokens`` is billed, as the tokenizer counts what the model
        wrote (``written``); kept with the request's record."""
        reasoning = sum(self.window.counter.text_tokens(written(i)) for i in output if i["type"] == "reasoning")
        out = reasoning + sum(self.window.counter.text_tokens(written(i)) for i in output if i["type"] != "reasoning")
        record.usage = {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": out,
                        "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": tokens + out}
        return record.usage

    async def _answer(self, request: web.Request, body: dict[str, Any], record: Recorded,
                      output: list[dict[str, Any]], tokens: int, cached: int) -> web.StreamResponse:
        usage = self._usage(record, output, tokens, cached)
        rid = f"resp_{next(self._ids)}"
        done = self._response(body, rid, "completed", output, usage=usage)
        if not body.get("stream"):
            return web.json_response(done)
        started = self._response(body, rid, "in_progress", [])
        events: list[dict[str, Any]] = [{"type": "response.created", "response": started},
                                        {"type": "response.in_progress", "response": started}]
        for index, item in enumerate(output):
            events.extend(_item_events(index, item))
        events.append({"type": "response.completed", "response": done})
        return await _stream(request, events)

    async def _overflow(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if self.overflow == "http" or not body.get("stream"):
            return web.json_response({"error": OVERFLOW_ERROR}, status=400)
        rid = f"resp_{next(self._ids)}"
        created = {"type": "response.created", "response": self._response(body, rid, "in_progress", [])}
        if self.overflow == "event":
            return await _stream(request, [created, {"type": "error", "error": OVERFLOW_ERROR}])
        failed = self._response(body, rid, "failed", [], error={"code": OVERFLOW_ERROR["code"],
                                                           "message": OVERFLOW_ERROR["message"]})
        return await _stream(request, [created, {"type": "response.failed", "response": failed}])


def compact_threshold(body: dict[str, Any]) -> int | None:
    """The ``compact_threshold`` of a request's server-side compaction, when it asks for one."""
    management = body.get("context_management")
    for entry in management if isinstance(management, list) else []:
        if isinstance(entry, dict) and entry.get("type") == "compaction":
            return int(entry.get("compact_threshold") or 0)
    return None


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    """``output_item.added``, the item's deltas, ``output_item.done``: encrypted content only in the last one."""
    at = {"output_index": index, "item_id": item["id"]}
    started = {**item, "status": "in_progress"}
    events: list[dict[str, Any]] = []
    if item["type"] == "reasoning":
        started = {**started, "summary": [], "encrypted_content": None}
        for s, part in enumerate(item["summary"]):
            events.append({"type": "response.reasoning_summary_part.added", **at, "summary_index": s,
                           "part": {"type": "summary_text", "text": ""}})
            events += [{"type": "response.reasoning_summary_text.delta", **at, "summary_index": s, "delta": d}
                       for d in pieces(part["text"])]
            events.append({"type": "response.reasoning_summary_text.done", **at, "summary_index": s,
                           "text": part["text"]})
            events.append({"type": "response.reasoning_summary_part.done", **at, "summary_index": s, "part": part})
    elif item["type"] == "message":
        started = {**started, "content": []}
        part = item["content"][0]
        events.append({"type": "response.content_part.added", **at, "content_index": 0,
                       "part": {**part, "text": ""}})
        events += [{"type": "response.output_text.delta", **at, "content_index": 0, "delta": d}
                   for d in pieces(part["text"])]
        events.append({"type": "response.output_text.done", **at, "content_index": 0, "text": part["text"]})
        events.append({"type": "response.content_part.done", **at, "content_index": 0, "part": part})
    elif item["type"] == "function_call":
        started = {**started, "arguments": ""}
        events += [{"type": "response.function_call_arguments.delta", **at, "delta": d}
                   for d in pieces(item["arguments"])]
        events.append({"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"]})
    return [{"type": "response.output_item.added", "output_index": index, "item": started}, *events,
            {"type": "response.output_item.done", "output_index": index, "item": item}]


async def _stream(request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for number, event in enumerate(events):
        await resp.write(sse({**event, "sequence_number": number}))
    await resp.write_eof()
    return resp


def _shell_call(tools: list[dict[str, Any]], command: str) -> dict[str, str] | None:
    """A call to the shell tool the request offers, in that tool's argument shape."""
    names = {t.get("name") for t in tools if t.get("type") == "function"}
    if "exec_command" in names:  # Codex's unified exec tool
        return {"name": "exec_command", "arguments": orjson.dumps({"cmd": command}).decode()}
    if "shell" in names:
        return {"name": "shell", "arguments": orjson.dumps({"command": ["bash", "-lc", command]}).decode()}
    if "bash" in names:  # pi's
        return {"name": "bash", "arguments": orjson.dumps({"command": command}).decode()}
    return None


def written(item: dict[str, Any]) -> str:
    """What the model wrote of an output item: a message's text, a reasoning item's summary, a call's name and
    arguments, a compaction item's (encrypted) summary."""
    if item["type"] == "message":
        return content_text(item["content"])
    if item["type"] == "reasoning":
        return content_text(item["summary"])
    if item["type"] == "function_call":
        return f"{item['name']}{item['arguments']}"
    return str(item.get("encrypted_content") or "")


def _last_call(items: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """The command of the latest function call and the output sent back for it."""
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if item.get("type") != "function_call":
            continue
        command = str(item.get("arguments"))
        for later in items[index + 1:]:
            if later.get("type") == "function_call_output" and later.get("call_id") == item.get("call_id"):
                return command, content_text(later.get("output"))
        return command, None
    return None, None


def _last_user_text(items: list[dict[str, Any]]) -> str:
    for item in reversed(items):
        if item.get("type", "message") == "message" and item.get("role") == "user":
            return content_text(item.get("content"))
    return ""

