"""The demo's scripted model: a Chat Completions upstream on a loopback port, deterministic, no key.

An agent turn is answered with the next step of ``script.STEPS`` after the
last tool call the conversation shows (its id names the step), so the answer
depends on what the proxy sent, not on how many requests came before; after the
last step, the closing text. A summary call (the proxy's summariser prompt
leading the request's last user turn, or its system message) is answered as a
real model answers it: text in the sections the prompt asks for, built from what
the request holds. One summary call (``FAILING_SUMMARY``) is answered with a
500, as an overloaded upstream might, so the proxy's model-free tier shows; the
summaries after it fold the range it left out back in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.context.summary.summaryprompt import SYSTEM_PROMPT
from proxy.demo.script import CONSTRAINT, FINAL, STEPS, TASK

MODEL = "ctxproxy-demo"
#: Which summary call (counting from 0) fails with a 500: the second compaction's first (each compaction
#: of the demo makes two: the range is summarised in two chunks).
FAILING_SUMMARY = 2
_MARK = SYSTEM_PROMPT[:40]
_CALL_ID = re.compile(r"^call_demo_(\d+)$")
_PATH = re.compile(r"\b(?:app|tests|config)/[\w./]+\.(?:py|yaml)\b")


@dataclass
class ScriptedModel:
    """The app and what it saw: the last agent turn's messages (what the model was shown), the summary calls."""

    summary_calls: int = 0
    turns: int = 0
    last_prompt: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.completions)
        return app

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json(loads=orjson.loads)
        messages: list[dict[str, Any]] = body.get("messages") or []
        if is_summary_call(messages):
            self.summary_calls += 1
            if self.summary_calls - 1 == FAILING_SUMMARY:
                return web.json_response({"error": {"message": "The model is overloaded, try again later.",
                                                    "type": "server_error", "param": None, "code": None}},
                                         status=500)
            return _completion(summary_of(messages), None, messages)
        self.turns += 1
        self.last_prompt = messages
        step = next_step(messages)
        if step >= len(STEPS):
            return _completion(FINAL, None, messages)
        tool, args = STEPS[step]
        call = {"id": f"call_demo_{step}", "type": "function",
                "function": {"name": tool, "arguments": orjson.dumps(args).decode()}}
        return _completion(thought(step, tool, args), call, messages)


def thought(step: int, tool: str, args: dict[str, Any]) -> str:
    """What the model says before a call, as models do: the plan so far and why this call (only a summary can
    shorten it, so summaries are needed as well as masking)."""
    target = args.get("path") or args.get("file_path") or args.get("command")
    return (f"Step {step + 1} of my plan: {tool} on {target}. So far I have looked at how the sync tool's passes "
            "filter and copy items, and where parse_args() is called from; its signature stays as it is, since "
            "other tools import it. The --dry-run flag belongs in app/cli.py, and the test in tests/test_cli.py "
            "should show that a dry run changes nothing. After this I will check the output against what I "
            "expect, note anything surprising, and go on with the next file or the test suite.")


def _text(content: object) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def is_summary_call(messages: list[dict[str, Any]]) -> bool:
    """The proxy's summary call, in either of its shapes (the canonical one, or the client's request reshaped)."""
    return bool(messages) and any(_text(m.get("content")).startswith(_MARK) for m in (messages[0], messages[-1])
                                  if m.get("role") in ("system", "user"))


def next_step(messages: list[dict[str, Any]]) -> int:
    """The step after the newest call the conversation shows (0 when it shows none)."""
    for message in reversed(messages):
        for call in reversed(message.get("tool_calls") or []):
            if match := _CALL_ID.match(str(call.get("id"))):
                return int(match.group(1)) + 1
    return 0


def summary_of(messages: list[dict[str, Any]]) -> str:
    """A structured summary of what the summary request holds, in the sections the prompt asks for."""
    shown = "\n".join(_text(m.get("content")) for m in messages)
    paths = sorted(set(_PATH.findall(shown)))
    steps = sorted({int(n) for n in re.findall(r"call_demo_(\d+)", shown)})
    done = f"Steps up to {steps[-1] + 1} of the plan run" if steps else "Explored the repository"
    sections = {
        "Goals and constraints": f"{TASK}\nConstraint: {CONSTRAINT}",
        "Work completed": f"{done}: read the app modules and ran the test suite.",
        "Key decisions": "The flag is added in parse_args() without changing its signature.",
        "Files touched": "\n".join(f"- {p}" for p in paths) or "None",
        "Errors": "tests/test_cli.py::test_dry_run failed until --dry-run existed.",
        "Current state": "Working through the plan.",
        "Next steps": "Run the whole suite and report.",
        "Identifiers": ", ".join(["parse_args", "DRY_RUN_HELP", *paths]),
    }
    return "\n".join(f"## {n}. {title}\n{text}" for n, (title, text) in enumerate(sections.items(), 1))


def _completion(text: str, call: dict[str, Any] | None, messages: list[dict[str, Any]]) -> web.Response:
    """A non-streamed ``chat.completion`` with usage (the prompt counted roughly: 4 bytes a token)."""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if call is not None:
        message["tool_calls"] = [call]
    prompt = len(orjson.dumps(messages)) // 4
    return web.json_response({
        "id": "chatcmpl-demo", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20}})
