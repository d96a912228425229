"""A fake OpenAI-compatible upstream: a real aiohttp server speaking the Chat Completions wire format.

Replies are scripted per test (``FakeUpstream.script``) or derived from the
conversation: a request whose last message is from the user, with tools
offered, gets a tool call; anything else gets text. Streams are cut into many
small SSE events, tool-call arguments included, the way OpenAI sends them.
Usage reports the prompt as a tokenizer counts it (``count``, the proxy's own
tokenizer, which the ``window`` check uses too), not as bytes ÷ 4: an overcount
there starts every compaction early and hides how often the proxy summarises.
With ``strict_roles`` it refuses what strict chat templates refuse (Mistral,
Gemma, Llama-2 style on vLLM), as vLLM answers them; with ``strict_fields``
(``StrictFields``) it refuses a request carrying a top-level field it does not
know, summary requests included, as Azure OpenAI does. A summary request is one
whose first message is the proxy's summariser prompt (its canonical call) or
whose last message is a user turn starting with it (a call shaped like the
client's request); it is answered streamed when it asks to be. Strict modes
refuse every request, summary calls included, as some upstreams do:
``refuse_max_tokens`` (an Azure reasoning deployment with a custom name) and
``require_stream``.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: (status, raw body bytes, content type) returned instead of a completion.
    error: tuple[int, bytes, str] | None = None
    #: Break the stream after this many events (connection reset mid-stream).
    cut_after: int | None = None
    #: Wait for this event before answering (a hung upstream).
    hang: asyncio.Event | None = None
    #: Stream this many events, then wait for ``hang`` (a model that stalls mid-answer).
    pause_after: int | None = None


OVERFLOW_BODIES = {
    "openai": (400, {"error": {
        "message": "This model's maximum context length is {window} tokens. However, your messages resulted in "
                   "{tokens} tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
    "anthropic": (400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": "prompt is too long: {tokens} tokens > {window} maximum"}}),
    "vllm": (400, {"object": "error", "message": "This model's maximum context length is {window} tokens. However, "
                   "you requested {tokens} tokens ({tokens} in the messages, 0 in the completion). Please reduce the "
                   "length of the messages or completion.", "type": "BadRequestError", "param": None, "code": 400}),
    "gemini": (400, {"error": {"code": 400, "message": "The input token count ({tokens}) exceeds the maximum number "
                               "of tokens allowed ({window}).", "status": "INVALID_ARGUMENT"}}),
}
ROLE_ERROR = {"object": "error", "message": "Conversation roles must alternate user/assistant/user/assistant/...",
              "type": "BadRequestError", "param": None, "code": 400}
SUMMARY_MARKER = "You maintain the working memory"
#: Azure OpenAI's answer to ``max_tokens`` sent to a reasoning deployment.
MAX_TOKENS_REFUSED = {"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                                           "Use 'max_completion_tokens' instead.", "type": "invalid_request_error",
                                "param": "max_tokens", "code": "unsupported_parameter"}}
STREAM_REQUIRED = {"error": {"message": "Stream must be set to true", "type": "invalid_request_error",
                             "param": "stream", "code": None}}
FACT = re.compile(r"FACT-[A-Za-z0-9]+")


#: Section headings as a summary model may shorten them (the proxy asks for the sections but requires none).
SECTION_TITLES = ("Goals", "Work completed", "Key decisions", "Files touched", "Errors", "Current state",
                  "Next steps", "Identifiers")


def full_summary(goals: str, identifiers: str = "None") -> str:
    """A summary with every section heading the proxy asks for, as a well-behaved summary model writes it."""
    body = {1: goals, len(SECTION_TITLES): identifiers}
    return "\n".join(f"## {n}. {title}\n{body.get(n, 'None')}" for n, title in enumerate(SECTION_TITLES, 1))


#: How a summary model may misbehave (``FakeUpstream.summary_mode``, ``Recorder.summary_style``): another format
#: (``bold``, ``numbered``, ``translated``, ``prose``), sections with nothing in them (``lazy``), a refusal, an HTTP
#: 500 (``error``), or no answer at all (``hang``).
MISBEHAVIOURS = ("bold", "numbered", "translated", "prose", "lazy", "refusal", "error", "hang")
#: One more misbehaviour, which each fake answers in its own API's shape: a one-line preamble and a call to the
#: first tool the summary request offers (the model going on with the agent's work instead of summing it up).
PREAMBLE_CALL = "preamble_call"
PREAMBLE = "Let me look at the files first."
GERMAN = ("Ziele", "Erledigte Arbeit", "Entscheidungen", "Geänderte Dateien", "Fehler", "Aktueller Stand",
          "Nächste Schritte", "Bezeichner")
_SECTION = re.compile(r"^#+\s*\d+\.\s*(.+)$", re.MULTILINE)


def restyle(style: str, summary: str) -> str:
    """``summary`` (in the proxy's ``## N. Title`` sections) as a model that ignores the format writes it."""
    sections = [(m.group(1), summary[m.end():next_start].strip()) for m, next_start in
                zip(_SECTION.finditer(summary), [*(m.start() for m in list(_SECTION.finditer(summary))[1:]), None],
                    strict=True)]
    if style == "bold":
        return "\n\n".join(f"**{title}**\n{body}" for title, body in sections)
    if style == "numbered":
        return "\n".join(f"{n}. {title}: {body}" for n, (title, body) in enumerate(sections, 1))
    if style == "translated":
        return "\n".join(f"## {german}\n{body}" for german, (_, body) in zip(GERMAN, sections, strict=False))
    if style == "prose":
        return " ".join(body for _, body in sections if body != "None")
    if style == "lazy":
        return "\n".join(f"## {n}. {title}\nNone" for n, (title, _) in enumerate(sections, 1))
    if style == "refusal":
        return "I'm sorry, but I can't help with that request."
    return summary


async def summary_fault(style: str) -> web.Response | None:
    """The answer a broken summary model gives instead of text (``error``: a 500; ``hang``: none, ever)."""
    if style == "error":
        return web.json_response({"error": {"message": "The server had an error while processing your request.",
                                            "type": "server_error", "param": None, "code": None}}, status=500)
    if style == "hang":
        await asyncio.Event().wait()  # until the server is closed at the end of the test
    return None


@dataclass(frozen=True)
class StrictFields:
    """An upstream that refuses any request with a top-level field it does not take, as Azure OpenAI does:
    only ``allowed`` ones (None: any), never a ``refused`` one."""

    allowed: frozenset[str] | None = None
    refused: frozenset[str] = frozenset()

    def unrecognised(self, body: dict[str, Any]) -> str | None:
        """The first field of ``body`` this upstream refuses, or None when it takes them all."""
        return next((name for name in body if name in self.refused
                     or (self.allowed is not None and name not in self.allowed)), None)

    @staticmethod
    def refusal(name: str) -> web.Response:
        """Azure OpenAI's answer to a request with an argument it does not know."""
        return web.json_response({"error": {"message": f"Unrecognized request argument supplied: {name}",
                                            "type": "invalid_request_error", "param": None, "code": None}},
                                 status=400)


#: What Azure OpenAI's Chat Completions takes (no ``prompt_cache_key``; ``stream_options`` not on every version).
AZURE_CHAT_FIELDS = frozenset({
    "model", "messages", "stream", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop",
    "presence_penalty", "frequency_penalty", "logit_bias", "user", "tools", "tool_choice", "parallel_tool_calls",
    "response_format", "seed", "logprobs", "top_logprobs", "reasoning_effort"})


def summary_response(text: str, finish_reason: str = "stop", model: str | None = None,
                     usage: tuple[int, int] = (1, 1)) -> web.Response:
    """A Chat Completions answer to a summary request; ``usage``: the prompt and completion tokens it reports."""
    prompt, completion = usage
    return web.json_response({"id": "sum", "object": "chat.completion", "model": model,
                              "choices": [{"index": 0, "finish_reason": finish_reason,
                                           "message": {"role": "assistant", "content": text}}],
                              "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                        "total_tokens": prompt + completion}})


def role_error(messages: list[dict[str, Any]]) -> str | None:
    """What a strict chat template objects to, or ``None`` when it accepts the conversation.

    A system message after the first other one, a first non-system message that
    is not the user's, or two user messages in a row.
    """
    roles = [m.get("role") for m in messages]
    rest = roles[next((i for i, r in enumerate(roles) if r not in ("system", "developer")), len(roles)):]
    if any(r in ("system", "developer") for r in rest):
        return "a system message after the first non-system one"
    if rest and rest[0] != "user":
        return f"the first non-system message is {rest[0]!r}, not 'user'"
    if any(a == b == "user" for a, b in itertools.pairwise(rest)):
        return "two user messages in a row"
    return None


def is_summary_request(messages: list[dict[str, Any]]) -> bool:
    """The proxy's summary call: its canonical shape (the summariser's system message first) or the client's
    request reshaped (the summariser's instructions leading the last user turn)."""
    first, last = messages[0], messages[-1]
    if first.get("role") == "system" and str(first.get("content", "")).startswith(SUMMARY_MARKER):
        return True
    content = last.get("content")
    text = content[0].get("text") if isinstance(content, list) and content and isinstance(content[0], dict) \
        else content
    return last.get("role") == "user" and isinstance(text, str) and text.startswith(SUMMARY_MARKER)


def output_reserve(body: dict[str, Any]) -> int:
    """The answer size the request reserves: OpenAI and vLLM refuse a prompt it does not fit beside."""
    value = body.get("max_completion_tokens") or body.get("max_tokens")
    return value if isinstance(value, int) else 0


def overflow_body(style: str, tokens: int, window: int) -> tuple[int, bytes]:
    status, template = OVERFLOW_BODIES[style]
    text = orjson.dumps(template).decode().replace("{tokens}", str(tokens)).replace("{window}", str(window))
    return status, text.encode()


class FakeUpstream:
    """``window``: refuse prompts over it, in ``overflow_style``. ``summary_mode``: how summary requests go."""

    def __init__(self) -> None:
        self.window: int | None = None
        self.overflow_style = "openai"
        self.overflow_in_stream = False
        self.summary_mode = "facts"
        self.summary_requests: list[dict[str, Any]] = []
        #: The text of each summary answered with one (the requests a failure mode refuses are left out).
        self.summary_answers: list[str] = []
        #: When set, summary requests wait for it (a slow summary model); ``summaries_answered`` counts the done.
        self.summary_gate: asyncio.Event | None = None
        self.summaries_answered = 0
        #: Set whenever a summary request arrives (before it waits at ``summary_gate``).
        self.summary_asked = asyncio.Event()
        #: The summary also keeps the FACT-… tokens of the request's tool descriptions, as a model repeating what it
        #: was shown of the agent's tools does.
        self.echo_tools = False
        self.prompt_tokens: list[int] = []
        self.refused = 0
        #: Refuse views a strict chat template rejects (``role_error``) with vLLM's 400.
        self.strict_roles = False
        self.role_errors: list[str] = []
        #: Refuse requests (summary requests too) carrying a field it does not take, as Azure OpenAI does.
        self.strict_fields: StrictFields | None = None
        #: The field each refused request was refused for.
        self.unrecognised: list[str] = []
        self._counter = TokenCounter()
        self.requests: list[dict[str, Any]] = []
        #: Each chat request's body as it arrived, byte for byte.
        self.bodies: list[bytes] = []
        #: Report this many prompt tokens as cached (``prompt_tokens_details.cached_tokens``); None: no details.
        self.cached_tokens: int | None = None
        self.headers: list[dict[str, str]] = []
        self.script: deque[Reply] = deque()
        self._ids = itertools.count(1)
        #: Set whenever a streaming request's connection closes before it finished.
        self.stream_aborted = asyncio.Event()
        #: Set when a stream reaches its ``pause_after`` point.
        self.paused = asyncio.Event()
        #: Refuse any request carrying ``max_tokens``, as an Azure reasoning deployment does.
        self.refuse_max_tokens = False
        #: Refuse any request without ``stream: true``.
        self.require_stream = False
        #: Each request refused by a strict mode: (what was refused, its body).
        self.strict_refusals: list[tuple[str, dict[str, Any]]] = []
        #: Each summary request's path with its query string, and its headers.
        self.summary_calls: list[tuple[str, dict[str, str]]] = []
        #: Answer naming this model whatever the request named (a gateway that routes by rules of its own).
        self.answer_model: str | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_route("*", "/v1/echo/{tail:.*}", self.echo)
        app.router.add_get("/v1/gzipped", self.gzipped)
        app.router.add_get("/v1/stream", self.stream_bytes)
        return app

    # -- chat ---------------------------------------------------------------------------------

    def next_reply(self, body: dict[str, Any]) -> Reply:
        if self.script:
            return self.script.popleft()
        n = next(self._ids)
        last = body["messages"][-1]
        if last.get("role") == "user" and body.get("tools"):
            name = body["tools"][0]["function"]["name"]
            return Reply(tool_calls=[{"id": f"call_{n}", "type": "function",
                                      "function": {"name": name, "arguments": orjson.dumps({"step": n}).decode()}}])
        return Reply(content=f"Reply number {n}: done with {last.get('role')}.")

    def count(self, body: dict[str, Any]) -> int:
        return sum(self._counter.message_tokens(CHAT, m) for m in body["messages"]) + self._counter.tools_tokens(
            body.get("tools"))

    async def summary(self, body: dict[str, Any]) -> web.Response:
        """A summariser that keeps every FACT-… token it is shown (or fails as told)."""
        self.summary_requests.append(body)
        self.summary_asked.set()
        if self.summary_mode == "fail":
            return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
        fault = await summary_fault(self.summary_mode)
        if fault is not None:
            return fault
        if self.summary_gate is not None:
            await self.summary_gate.wait()
        if self.summary_mode in ("tool_call", PREAMBLE_CALL):  # a model that calls the client's tool instead
            call = {"id": "call_summary", "type": "function",
                    "function": {"name": body["tools"][0]["function"]["name"], "arguments": "{}"}}
            content = PREAMBLE if self.summary_mode == PREAMBLE_CALL else None
            return web.json_response({"id": "sum", "object": "chat.completion", "model": body.get("model"),
                                      "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                                          "role": "assistant", "content": content, "tool_calls": [call]}}]})
        shown = body["messages"][-1]["content"]
        if self.echo_tools:
            shown += orjson.dumps(body.get("tools")).decode()
        facts = " ".join(sorted(set(FACT.findall(shown))))
        text = "" if self.summary_mode == "empty" else restyle(self.summary_mode, full_summary("Keep going.", facts))
        self.summaries_answered += 1
        self.summary_answers.append(text)
        usage = (self.count(body), self._counter.text_tokens(text))  # what a model would bill for it
        return summary_response(text, model=self.answer_model or body.get("model"), usage=usage)

    def strict_refusal(self, body: dict[str, Any]) -> web.Response | None:
        """The strict modes' answer to ``body``, or None when they let it through."""
        unknown = self.strict_fields.unrecognised(body) if self.strict_fields is not None else None
        if unknown is not None:
            self.unrecognised.append(unknown)
            return StrictFields.refusal(unknown)
        if self.refuse_max_tokens and "max_tokens" in body:
            self.strict_refusals.append(("max_tokens", body))
            return web.json_response(MAX_TOKENS_REFUSED, status=400)
        if self.require_stream and body.get("stream") is not True:
            self.strict_refusals.append(("stream", body))
            return web.json_response(STREAM_REQUIRED, status=400)
        return None

    async def chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw)
        refusal = self.strict_refusal(body)
        if refusal is not None:
            return refusal
        if is_summary_request(body["messages"]):
            self.summary_calls.append((request.path_qs, dict(request.headers)))
            answer = await self.summary(body)
            if body.get("stream") is True and answer.status == 200 and answer.content_type == "application/json":
                usage = (body.get("stream_options") or {}).get("include_usage") is True
                return await self._stream_completion(request, orjson.loads(answer.body),  # type: ignore[arg-type]
                                                     include_usage=usage)
            return answer
        self.requests.append(body)
        self.bodies.append(raw)
        self.headers.append(dict(request.headers))
        problem = role_error(body["messages"]) if self.strict_roles else None
        if problem is not None:
            self.role_errors.append(problem)
            return web.json_response(ROLE_ERROR, status=400)
        if self.window is not None:
            tokens = self.count(body)
            self.prompt_tokens.append(tokens)
            if tokens + output_reserve(body) > self.window:  # as OpenAI and vLLM: the answer must fit too
                self.refused += 1
                status, raw = overflow_body(self.overflow_style, tokens, self.window)
                if self.overflow_in_stream and body.get("stream"):  # OpenRouter: 200, then an error event
                    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                    await resp.prepare(request)
                    await resp.write(b": OPENROUTER PROCESSING\n\ndata: " + raw + b"\n\n")
                    await resp.write_eof()
                    return resp
                return web.Response(status=status, body=raw, content_type="application/json")
        reply = self.next_reply(body)
        if reply.hang is not None and reply.pause_after is None:
            await reply.hang.wait()
        if reply.error is not None:
            status, raw, ctype = reply.error
            return web.Response(status=status, body=raw, content_type=ctype)
        prompt = self.count(body)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, **reply.extra}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7}
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": min(prompt, self.cached_tokens)}
        if body.get("stream"):
            return await self._stream(request, body, message, usage, reply)
        return web.json_response({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
            "model": self.answer_model or body.get("model"), "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
            "usage": usage,
        })

    async def _stream(self, request: web.Request, body: dict[str, Any], message: dict[str, Any],
                      usage: dict[str, Any], reply: Reply) -> web.StreamResponse:
        include_usage = (body.get("stream_options") or {}).get("include_usage") is True
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.answer_model or body.get("model"), "system_fingerprint": "fp_fake"}
        if include_usage:
            base["usage"] = None
        events = [_delta(base, {"role": "assistant", "content": ""})]
        for key, value in message.items():
            if key in ("role", "content", "tool_calls"):
                continue
            events.append(_delta(base, {key: value}))
        for piece in _pieces(message.get("content") or ""):
            events.append(_delta(base, {"content": piece}))
        for i, call in enumerate(message.get("tool_calls") or []):
            head = {"index": i, "id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""}}
            events.append(_delta(base, {"tool_calls": [head]}))
            for piece in _pieces(call["function"]["arguments"]):
                events.append(_delta(base, {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        events.append({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]})
        if include_usage:
            events.append({**base, "choices": [], "usage": usage})
        try:
            for n, event in enumerate(events):
                if reply.cut_after is not None and n >= reply.cut_after:
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                if reply.pause_after is not None and n == reply.pause_after and reply.hang is not None:
                    self.paused.set()
                    await reply.hang.wait()
                await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.stream_aborted.set()
            raise
        return resp

    async def _stream_completion(self, request: web.Request, completion: dict[str, Any], *,
                                 include_usage: bool = False) -> web.StreamResponse:
        """A whole ``chat.completion`` (a summary's, its tool calls included) sent as a stream of small chunks (its
        usage last, when asked for), then ``[DONE]``."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        choice = completion["choices"][0]
        base = {"id": completion.get("id"), "object": "chat.completion.chunk", "model": completion.get("model")}
        calls = [_delta(base, {"tool_calls": [{"index": i, **call}]})
                 for i, call in enumerate(choice["message"].get("tool_calls") or [])]
        events = [_delta(base, {"role": "assistant", "content": ""}),
                  *(_delta(base, {"content": piece}) for piece in _pieces(choice["message"].get("content") or "")),
                  *calls, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
        if include_usage:
            events.append({**base, "choices": [], "usage": completion.get("usage")})
        for event in events:
            await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # -- pass-through targets -----------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({
            "method": request.method, "path": request.path, "query": dict(request.query),
            "headers": dict(request.headers), "body": body.decode("utf-8", "replace"),
        }, headers={"X-Upstream-Custom": "kept"})

    async def gzipped(self, request: web.Request) -> web.Response:
        return web.Response(body=gzip.compress(b'{"compressed": true}'),
                            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    async def stream_bytes(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        for i in range(5):
            await resp.write(f"part{i};".encode())
        await resp.write_eof()
        return resp


def _delta(base: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}


def _pieces(text: str, size: int = 5) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]
