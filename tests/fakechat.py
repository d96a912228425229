"""A fake Chat Completions upstream for the real Qwen Code, cline and mini-swe-agent: a real aiohttp server.

``POST /v1/chat/completions`` answers each turn of ``script`` with a call of the agent's shell tool
(``run_shell_command``, cline's ``run_commands``, mini-swe-agent's ``bash``) that runs the step, or the final
text, streamed as OpenAI streams it (a role chunk, content and tool-call argument deltas, a chunk with
``finish_reason``, a usage chunk when ``stream_options.include_usage`` asks, then ``[DONE]``) or as one
``chat.completion``. It checks what OpenAI
checks about history (every tool call of an assistant message is answered by a ``tool`` message after it, and
every ``tool`` message answers one) and refuses a prompt over ``window`` with OpenAI's 400
``context_length_exceeded``. A request whose system message, or last user message, starts with the proxy's
summariser prompt gets a summary; Qwen Code's own compression (its request ends asking for the
``<state_snapshot>``) is recorded as ``client_compaction``; a request offering no tools (its helper calls) gets a
short text and is recorded as ``helper``. Everything it receives is in ``requests``.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from aiohttp import web

from tests.fakescript import Recorder, Script, cached_prefix, content_text, is_summary_prompt, pieces
from tests.fakeupstream import overflow_body

#: Qwen Code's shell tool, the one called when none the fake knows is offered.
SHELL = "run_shell_command"
#: The shell tool of each agent the fake drives, by name: Qwen Code's, cline's (a list of commands) and
#: mini-swe-agent's.
SHELLS = {SHELL: lambda command: {"command": command},
          "run_commands": lambda command: {"commands": [command]},
          "bash": lambda command: {"command": command}}
#: How Qwen Code's compression request ends.
QWEN_COMPRESSION = "produce the <state_snapshot> XML"


class FakeChat(Recorder):
    """``script``: the run to drive. ``window``: refuse prompts over it."""

    def __init__(self, script: Script | None = None, window: int | None = None) -> None:
        super().__init__(script, window)
        self._ids = itertools.count(1)
        self._last_prompt: list[Any] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_route("*", "/{tail:.*}", self.other)
        return app

    async def other(self, request: web.Request) -> web.Response:
        self._record(request, await request.text(), "other", status=404)
        return web.json_response({"error": {"message": f"No route {request.method} {request.path}",
                                            "type": "invalid_request_error", "param": None, "code": None}},
                                 status=404)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json(loads=orjson.loads)
        messages: list[dict[str, Any]] = body.get("messages") or []
        first, last = (messages[0], messages[-1]) if messages else ({}, {})
        if (first.get("role") == "system" and is_summary_prompt(content_text(first.get("content")))) or (
                last.get("role") == "user" and is_summary_prompt(last.get("content"))):
            self._record(request, body, "summary")
            text = await self.summary(messages)
            return text if isinstance(text, web.Response) else await self._answer(request, body, text, None, 0, 0)
        if QWEN_COMPRESSION in content_text(last.get("content")):
            self._record(request, body, "client_compaction")
            return await self._answer(request, body, "<state_snapshot></state_snapshot>", None, 0, 0)
        if self.helper(body):
            self._record(request, body, "helper")
            return await self._answer(request, body, "Scripted steps", None, 0, 0)
        prompt = [body.get("tools"), *messages]
        counts = [self.window.count(part) for part in prompt]
        tokens = sum(counts)
        if self.window.refuses(tokens):
            assert self.window.limit is not None
            self._record(request, body, "turn", tokens=tokens, status=400)
            status, raw = overflow_body("openai", tokens, self.window.limit)
            return web.Response(status=status, body=raw, content_type="application/json")
        problem = check_history(messages)
        if problem is not None:
            self._record(request, body, "turn", tokens=tokens, status=400)
            return web.json_response({"error": {"message": problem, "type": "invalid_request_error",
                                                "param": "messages", "code": None}}, status=400)
        self._record(request, body, "turn", tokens=tokens)
        cached = cached_prefix(self._last_prompt, prompt, counts)
        self._last_prompt = prompt
        text, call = self.reply(body, messages)
        return await self._answer(request, body, text, call, tokens, cached)

    def helper(self, body: dict[str, Any]) -> bool:
        """An agent's helper call (a title, a summary of its own), not a turn of its loop: it offers no tools."""
        return not body.get("tools")

    def reply(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any] | None]:
        """The text of a turn's answer and its tool call: the next scripted step's shell call, or the final text."""
        command, output = last_call(messages)
        step = self.script.next_step(command, output)
        if isinstance(step, str):
            return step, None
        call = shell_call(body["tools"], self.script.command(step), f"call_{next(self._ids):06d}")
        return f"Running step {step}.", call

    async def _answer(self, request: web.Request, body: dict[str, Any], text: str, call: dict[str, Any] | None,
                      tokens: int, cached: int) -> web.StreamResponse:
        usage = {"prompt_tokens": tokens, "completion_tokens": 11, "total_tokens": tokens + 11,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        finish = "tool_calls" if call is not None else "stop"
        base = {"id": f"chatcmpl-{next(self._ids):06d}", "object": "chat.completion.chunk", "created": 0,
                "model": body.get("model")}
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if call is not None:
                message["tool_calls"] = [call]
            return web.json_response({**base, "object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "message": message, "finish_reason": finish}]})
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        deltas += [{"content": piece} for piece in pieces(text)]
        if call is not None:
            head = {"index": 0, "id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""}}
            deltas.append({"tool_calls": [head]})
            deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                       for piece in pieces(call["function"]["arguments"])]
        events = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**base, "choices": [], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in events:
            await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def check_history(messages: list[dict[str, Any]]) -> str | None:
    """What OpenAI refuses about tool calls and results in a conversation, or None."""
    asked: set[str] = set()
    for index, message in enumerate(messages):
        for call in message.get("tool_calls") or []:
            asked.add(call["id"])
            if not any(m.get("role") == "tool" and m.get("tool_call_id") == call["id"] for m in messages[index:]):
                return (f"An assistant message with 'tool_calls' must be followed by tool messages responding to "
                        f"each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                        f"{call['id']}")
        if message.get("role") == "tool" and message.get("tool_call_id") not in asked:
            return (f"Invalid parameter: messages with role 'tool' must be a response to a preceeding message with "
                    f"'tool_calls'. (messages.[{index}].role)")
    return None


def shell_call(tools: list[dict[str, Any]], command: str, call_id: str) -> dict[str, Any]:
    """A call of the first of ``tools`` the fake knows as a shell (Qwen Code's when none is offered) running
    ``command``."""
    names = [(t.get("function") or {}).get("name") for t in tools]
    name = next((n for n in names if n in SHELLS), SHELL)
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(SHELLS[name](command)).decode()}}


def last_call(messages: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """The command of the latest shell call and the output sent back for it."""
    for index in range(len(messages) - 1, -1, -1):
        calls = messages[index].get("tool_calls") or []
        if not calls:
            continue
        call = calls[-1]
        try:
            arguments = orjson.loads(call["function"]["arguments"])
            command = str(arguments.get("command") or arguments.get("commands"))
        except (orjson.JSONDecodeError, AttributeError):
            return str(call["function"]["arguments"]), None
        for later in messages[index + 1:]:
            if later.get("role") == "tool" and later.get("tool_call_id") == call["id"]:
                return command, content_text(later.get("content"))
        return command, None
    return None, None
