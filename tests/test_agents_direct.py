"""The real Codex CLI and Claude Code straight at their fake upstreams, with no proxy in between.

This is the groundwork the proxy's Responses and Messages front doors are proven
with: each pinned agent completes a long tool-using run against its fake; with a
small window the same run ends in the agent's own context error (which is why
the proxy is needed, and proof that the fakes' windows bind the real clients);
and what each agent sends is pinned here, so docs/CLIENTS.md stays true when a
version is bumped.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from tests.agents import (
    CLAUDE_VERSION,
    CODEX_MODEL,
    CODEX_VERSION,
    AgentRun,
    codex_outputs,
    run_claude,
    run_codex,
    without_cache_control,
)
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script, final_text

STEPS = 25
PROMPT = "Run the scripted shell steps one at a time, then say that you are done."
#: Codex's first request is about 8k tokens and Claude Code's about 3k; each step adds about 280.
CODEX_SMALL_WINDOW = 9_000
CLAUDE_SMALL_WINDOW = 4_500
CODEX_CONTEXT_ERROR = ("Codex ran out of room in the model's context window. Start a new thread or clear earlier "
                       "history before retrying.")


async def codex(aiohttp_server: Any, tmp_path: Path, fake: FakeResponses) -> AgentRun:
    server = await aiohttp_server(fake.app())
    return await run_codex(str(server.make_url("/v1")), tmp_path, PROMPT)


async def claude(aiohttp_server: Any, tmp_path: Path, fake: FakeMessages) -> AgentRun:
    server = await aiohttp_server(fake.app())
    return await run_claude(str(server.make_url("")).rstrip("/"), tmp_path, PROMPT, max_turns=fake.script.steps + 5)


# -- Codex ---------------------------------------------------------------------------------------


async def test_codex_completes_twenty_five_tool_steps(aiohttp_server, tmp_path: Path) -> None:
    fake = FakeResponses(Script(steps=STEPS))
    run = await codex(aiohttp_server, tmp_path, fake)
    assert (run.returncode, run.errors) == (0, []), run.stderr
    assert run.final_text == final_text(STEPS)
    assert codex_outputs(run) == [f"step-{k}\n" for k in range(1, STEPS + 1)]
    assert [(r.method, r.path, r.kind, r.status) for r in fake.requests] == [
        ("POST", "/v1/responses", "turn", 200)] * (STEPS + 1)


@pytest.mark.parametrize("overflow", ["http", "event", "failed"])
async def test_codex_stops_with_a_context_error_when_the_window_is_small(aiohttp_server, tmp_path: Path,
                                                                       overflow: str) -> None:
    fake = FakeResponses(Script(steps=STEPS), window=CODEX_SMALL_WINDOW, overflow=overflow)
    run = await codex(aiohttp_server, tmp_path, fake)
    assert (run.returncode, run.final_text) == (1, None)
    assert run.errors == [CODEX_CONTEXT_ERROR, CODEX_CONTEXT_ERROR]  # the error event, then turn.failed
    *accepted, refused = fake.turns()
    assert len(accepted) >= 3
    assert all(r.tokens is not None and r.tokens <= CODEX_SMALL_WINDOW for r in accepted)
    assert refused.tokens is not None and refused.tokens > CODEX_SMALL_WINDOW
    assert refused.status == (400 if overflow == "http" else 200)
    assert codex_outputs(run) == [f"step-{k}\n" for k in range(1, len(accepted) + 1)]


async def test_codex_sends_its_whole_history_statelessly_on_every_turn(aiohttp_server, tmp_path: Path) -> None:
    """The facts docs/CLIENTS.md states for Codex."""
    fake = FakeResponses(Script(steps=3))
    run = await codex(aiohttp_server, tmp_path, fake)
    assert run.returncode == 0, run.stderr
    turns = fake.turns()
    first = turns[0]
    assert set(first.body) == {"model", "stream", "input", "tools", "tool_choice", "parallel_tool_calls",
                               "reasoning", "store", "include", "prompt_cache_key", "text", "client_metadata"}
    assert (first.body["model"], first.body["store"], first.body["stream"]) == (CODEX_MODEL, False, True)
    assert first.body["include"] == ["reasoning.encrypted_content"]
    assert [(t["type"], t.get("name")) for t in first.body["tools"]] == [
        ("function", "exec_command"), ("function", "write_stdin"), ("function", "request_user_input"),
        ("custom", "apply_patch"), ("function", "view_image"), ("function", "get_goal"),
        ("function", "create_goal"), ("function", "update_goal"), ("tool_search", None), ("web_search", None)]
    assert [(i["type"], i["role"]) for i in first.body["input"]] == [
        ("message", "developer"), ("message", "developer"), ("message", "user"), ("message", "user")]
    assert first.body["input"][-1]["content"] == [{"type": "input_text", "text": PROMPT}]
    headers = first.headers
    session = headers["session-id"]
    assert headers["thread-id"] == headers["x-client-request-id"] == first.body["prompt_cache_key"] == session
    assert headers["originator"] == "codex_exec"
    assert headers["User-Agent"].startswith(f"codex_exec/{CODEX_VERSION} ")
    assert headers["Authorization"] == "Bearer sk-ctxproxy-test"
    assert headers["x-codex-beta-features"] == "remote_compaction_v2"
    assert json.loads(headers["x-codex-turn-metadata"])["request_kind"] == "turn"
    assert "Content-Encoding" not in headers
    for previous, turn in itertools.pairwise(turns):
        grown = turn.body["input"]
        assert grown[:len(previous.body["input"])] == previous.body["input"]  # append-only, never rewritten
        assert [i["type"] for i in grown[len(previous.body["input"]):]] == [
            "reasoning", "function_call", "function_call_output"]
        assert turn.headers["session-id"] == session
    reasoning = turns[1].body["input"][4]
    assert set(reasoning) == {"type", "id", "summary", "content", "encrypted_content"}  # "content": null added
    assert reasoning["content"] is None


# -- Claude Code ---------------------------------------------------------------------------------


async def test_claude_completes_twenty_five_tool_steps(aiohttp_server, tmp_path: Path) -> None:
    fake = FakeMessages(Script(steps=STEPS))
    run = await claude(aiohttp_server, tmp_path, fake)
    assert (run.returncode, run.errors) == (0, []), run.stderr
    assert run.final_text == final_text(STEPS)
    assert run.events[-1]["num_turns"] == STEPS + 1
    assert [(r.method, r.path, r.query, r.kind, r.status) for r in fake.requests] == [
        ("POST", "/v1/messages", {"beta": "true"}, "turn", 200)] * (STEPS + 1)
    results = [b["content"] for b in fake.turns()[-1].body["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert results == [f"step-{STEPS}"]


@pytest.mark.parametrize("overflow", ["http", "event"])
async def test_claude_stops_with_prompt_too_long_when_the_window_is_small(aiohttp_server, tmp_path: Path,
                                                                        overflow: str) -> None:
    fake = FakeMessages(Script(steps=STEPS), window=CLAUDE_SMALL_WINDOW, overflow=overflow)
    run = await claude(aiohttp_server, tmp_path, fake)
    assert (run.returncode, run.final_text, run.errors) == (1, None, ["Prompt is too long"])
    result = run.events[-1]
    assert (result["terminal_reason"], result["api_error_status"]) == ("prompt_too_long", 400)
    turns = fake.turns()
    refused = [r for r in turns if r.tokens is not None and r.tokens > CLAUDE_SMALL_WINDOW]
    assert len(turns) - len(refused) >= 3
    if overflow == "http":
        assert [(r.status, r.body["stream"]) for r in refused] == [(400, True)]
    else:  # after an error event it retries once without streaming, and gets the 400
        assert [(r.status, r.body["stream"]) for r in refused] == [(200, True), (400, False)]


async def test_claude_sends_system_messages_and_a_moving_cache_breakpoint(aiohttp_server, tmp_path: Path) -> None:
    """The facts docs/CLIENTS.md states for Claude Code."""
    fake = FakeMessages(Script(steps=6))
    run = await claude(aiohttp_server, tmp_path, fake)
    assert run.returncode == 0, run.stderr
    turns = fake.turns()
    first = turns[0]
    assert set(first.body) == {"model", "messages", "system", "tools", "metadata", "max_tokens", "thinking",
                               "context_management", "output_config", "stream"}
    assert first.body["thinking"] == {"type": "adaptive", "display": "omitted"}
    assert first.body["context_management"] == {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    assert [t["name"] for t in first.body["tools"]] == ["DeferredToolPlaceholder", "Bash"]
    headers = first.headers
    session = headers["X-Claude-Code-Session-Id"]
    assert json.loads(first.body["metadata"]["user_id"])["session_id"] == session
    assert headers["anthropic-version"] == "2023-06-01"
    assert "claude-code-20250219" in headers["anthropic-beta"].split(",")
    assert (headers["x-app"], headers["x-api-key"]) == ("cli", "sk-ant-ctxproxy-test")
    assert headers["User-Agent"].startswith(f"claude-cli/{CLAUDE_VERSION} ")
    assert [m["role"] for m in first.body["messages"]] == ["user", "system"]
    assert first.body["messages"][0]["content"][-1] == {"type": "text", "text": PROMPT}
    for previous, turn in itertools.pairwise(turns):
        old, new = previous.body["messages"], turn.body["messages"]
        assert turn.headers["X-Claude-Code-Session-Id"] == session
        # the one cache breakpoint moves to the newest message; otherwise the history is append-only
        assert [i for i, m in enumerate(new) if "cache_control" in json.dumps(m)] == [len(new) - 1]
        assert without_cache_control(new[:len(old)]) == without_cache_control(old)
        assert new[:len(old)] != old
    roles = [m["role"] for m in turns[-1].body["messages"]]
    assert roles.count("system") == 2  # the environment, and a nudge after five silent tool steps
    nudge = roles.index("system", 2)
    assert roles[nudge - 1] == "user" and roles[nudge + 1] == "assistant"
