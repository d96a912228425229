"""Scripted stand-ins for Codex and Claude Code, for tests that need exact control over each request.

The real agents (tests/agents.py) prove the front doors end to end; these send
what they send (a Responses request with instructions, a shell tool and
``prompt_cache_key``; a Messages request with ``system`` blocks, a Bash tool,
``metadata.user_id`` and ``?beta=true``), one step at a time, and read each
answer back as the agent would: the reply's items are appended to the
conversation, and every tool call is answered with the step's output, padded so
that a handful of steps outgrow a small window. ``rig`` runs the proxy (a SQLite
file in ``tmp_path``) in front of the fake upstreams (tests/fakeresponses.py,
tests/fakemessages.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.settings import Settings
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import parse_sse

KEY = "sk-scripted"
#: What each tool output carries besides the step's marker: steps must add up fast.
PADDING = "\n" + "ok " * 150
INSTRUCTIONS = "You are a coding agent. Run the steps you are given."
SHELL = {"type": "function", "name": "shell", "description": "Runs a shell command.", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                        "required": ["command"]}}
BASH = {"name": "Bash", "description": "Runs a bash command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
TASK = "Run the scripted shell steps one at a time, then say that you are done."


async def rig(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path, openai: FakeResponses | FakeMessages,
              anthropic: FakeResponses | FakeMessages | None = None, **overrides: Any) -> TestClient[Any, Any]:
    """The proxy over ``openai`` (``--upstream``) and ``anthropic`` (``--anthropic-upstream``, default the same), on
    a SQLite file in ``tmp_path`` unless ``overrides`` name a ``store``."""
    first: TestServer = await aiohttp_server(openai.app())
    second: TestServer = first if anthropic is None else await aiohttp_server(anthropic.app())
    # Background compaction off unless a test turns it on, as in tests/proxyfixtures.py's make_proxy.
    settings = Settings(upstream=str(first.make_url("/v1")), anthropic_upstream=str(second.make_url("")).rstrip("/"),
                        **{"store": f"sqlite:///{tmp_path}/facts.db", "precompact_threshold": 1.0, **overrides})
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings))
    return client


def echo(command: str) -> str:
    """What ``echo step-K`` prints, padded."""
    return command.removeprefix("echo ") + PADDING


@dataclass
class Codex:
    """A Responses API client: ``input`` grows by each reply and the output of each call."""

    client: TestClient[Any, Any]
    session: str = "codex-run"
    headers: dict[str, str] = field(default_factory=dict)
    items: list[dict[str, Any]] = field(default_factory=lambda: [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]}])
    path: str = "/v1/responses"
    #: What the shell prints for a command.
    output: Callable[[str], str] = echo

    def body(self, **extra: Any) -> dict[str, Any]:
        return {"model": "gpt-5.5", "instructions": INSTRUCTIONS, "input": self.items, "tools": [SHELL],
                "tool_choice": "auto", "parallel_tool_calls": False, "store": False, "stream": True,
                "include": ["reasoning.encrypted_content"], "prompt_cache_key": self.session, **extra}

    async def step(self, **extra: Any) -> Any:
        """One request; the reply's items and the call's output join the conversation. Returns the response."""
        headers = {"Authorization": f"Bearer {KEY}", "session_id": self.session, **self.headers}
        resp = await self.client.post(self.path, data=orjson.dumps(self.body(**extra)), headers=headers)
        raw = await resp.read()
        assert resp.status == 200, raw
        body = orjson.loads(raw) if resp.content_type == "application/json" else None
        reply = body["output"] if body is not None else [
            e["item"] for e in parse_sse(raw) if e["type"] == "response.output_item.done"]
        self.items.extend(reply)
        for item in reply:
            if item["type"] == "function_call":
                command = orjson.loads(item["arguments"])["command"][-1]
                self.items.append({"type": "function_call_output", "call_id": item["call_id"],
                                   "output": self.output(command)})
        return resp


@dataclass
class Claude:
    """A Messages API client: ``messages`` grows by each reply and a ``tool_result`` for each ``tool_use``."""

    client: TestClient[Any, Any]
    session: str = "claude-run"
    headers: dict[str, str] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=lambda: [{"role": "user", "content": TASK}])
    #: What the shell prints for a command.
    output: Callable[[str], str] = echo

    def body(self, **extra: Any) -> dict[str, Any]:
        return {"model": "claude-opus-5-5", "max_tokens": 4096, "stream": True, "messages": self.messages,
                "system": [{"type": "text", "text": INSTRUCTIONS}], "tools": [BASH],
                "metadata": {"user_id": orjson.dumps({"session_id": self.session}).decode()}, **extra}

    def request_headers(self) -> dict[str, str]:
        return {"x-api-key": KEY, "anthropic-version": "2023-06-01", "X-Claude-Code-Session-Id": self.session,
                **self.headers}

    async def step(self, **extra: Any) -> Any:
        resp = await self.client.post("/v1/messages?beta=true", data=orjson.dumps(self.body(**extra)),
                                      headers=self.request_headers())
        raw = await resp.read()
        assert resp.status == 200, raw
        content = orjson.loads(raw)["content"] if resp.content_type == "application/json" else blocks_of(raw)
        self.messages.append({"role": "assistant", "content": content})
        results = [{"type": "tool_result", "tool_use_id": b["id"], "content": self.output(b["input"]["command"])}
                   for b in content if b["type"] == "tool_use"]
        if results:
            self.messages.append({"role": "user", "content": results})
        return resp


def blocks_of(raw: bytes) -> list[dict[str, Any]]:
    """The content blocks of a streamed Messages answer, assembled from its content-block events."""
    blocks: dict[int, dict[str, Any]] = {}
    arguments: dict[int, str] = {}
    for event in parse_sse(raw):
        if event["type"] == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif event["type"] == "content_block_delta":
            index, delta = event["index"], event["delta"]
            if delta["type"] == "input_json_delta":
                arguments[index] = arguments.get(index, "") + delta["partial_json"]
            elif delta["type"] == "compaction_delta":
                blocks[index]["content"] = delta["content"]
            else:
                name = {"thinking_delta": "thinking", "signature_delta": "signature", "text_delta": "text"}[
                    delta["type"]]
                blocks[index][name] += delta[name]
    for index, text in arguments.items():
        blocks[index]["input"] = orjson.loads(text)
    return [blocks[i] for i in sorted(blocks)]
