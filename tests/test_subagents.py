"""A sub-agent is a conversation of its own, on every door and both stores, with or without a sub-agent header.

A parent runs until the proxy has compacted it (its log holds a checkpoint); a
sub-agent then works two steps under the parent's session (its own system
prompt and first message), carrying a sub-agent header (Claude Code's, Codex's) or none (Gemini
CLI's sub-agents send none; under ``ctxproxy run`` they carry the parent's
``X-Session-Id``); the parent goes on. The sub-agent must reach the model with
what it sent (never the parent's checkpoint or summary), be logged as a session
of its own, and leave the parent's log as the same parent's log is without it:
the same entries, no rewind.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.constants import HEADER_COMPACTED, HEADER_SESSION
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey, StoredFact
from tests.fakechat import SHELL, FakeChat
from tests.fakegemini import FakeGemini
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import SUMMARY_HEADINGS, Recorder, Script
from tests.proxyfixtures import ProxyFactory, read_log, replay
from tests.scripted import INSTRUCTIONS, KEY, TASK, Claude, Codex, echo
from tests.test_gemini import SYSTEM, TOOLS

SESSION = "run-5"
AGENT = "explore"
CHILD_TASK = "Look around the repository first, then report."
#: The sub-agent's own system prompt (each sub-agent of Claude Code, Gemini CLI, Qwen Code… has its own).
CHILD_SYSTEM = "You are a read-only explorer. Report what you find."
WINDOW = 4_000
MODEL = "gemini-test"
CHAT_TOOLS = [{"type": "function", "function": {"name": SHELL, "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
#: The sub-agent header each door's client sends (Chat and Gemini clients send none: the header is any door's).
HEADERS = {"chat": "x-claude-code-agent-id", "responses": "x-openai-subagent", "messages": "x-claude-code-agent-id",
           "gemini": "x-claude-code-agent-id"}


@dataclass
class ChatAgent:
    """A Chat Completions client: ``messages`` grows by each reply and the output of each call."""

    client: TestClient[Any, Any]
    session: str
    headers: dict[str, str] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=lambda: [
        {"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": TASK}])

    async def step(self) -> Any:
        resp = await self.client.post("/v1/chat/completions", data=orjson.dumps(
            {"model": "gpt-4o", "messages": self.messages, "tools": CHAT_TOOLS}), headers={
            "Authorization": f"Bearer {KEY}", HEADER_SESSION: self.session, **self.headers})
        assert resp.status == 200, await resp.text()
        message = (await resp.json())["choices"][0]["message"]
        self.messages.append(message)
        for call in message.get("tool_calls") or []:
            command = orjson.loads(call["function"]["arguments"])["command"]
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": echo(command)})
        return resp


@dataclass
class GeminiAgent:
    """A Gemini API client: ``contents`` grows by each reply and the output of each call."""

    client: TestClient[Any, Any]
    session: str
    headers: dict[str, str] = field(default_factory=dict)
    contents: list[dict[str, Any]] = field(default_factory=lambda: [{"role": "user", "parts": [{"text": TASK}]}])
    system: dict[str, Any] = field(default_factory=lambda: SYSTEM)

    async def step(self) -> Any:
        resp = await self.client.post(f"/v1beta/models/{MODEL}:generateContent", json={
            "contents": self.contents, "systemInstruction": self.system, "tools": TOOLS}, headers={
            "x-goog-api-key": KEY, HEADER_SESSION: self.session, **self.headers})
        assert resp.status == 200, await resp.text()
        content = (await resp.json())["candidates"][0]["content"]
        self.contents.append(content)
        for part in content["parts"]:
            if "functionCall" in part:
                call = part["functionCall"]
                output = {"output": echo(call["args"]["command"])}
                self.contents.append({"role": "user", "parts": [{"functionResponse": {
                    "id": call.get("id"), "name": call["name"], "response": output}}]})
        return resp


Agent = ChatAgent | GeminiAgent | Codex | Claude
#: Per door: its fake upstream, a client (proxy, session, headers) of it, the client's conversation, and the items
#: field of a request.
DOORS: dict[str, tuple[Callable[[], Recorder], Callable[..., Agent], Callable[[Any], list[Any]], str]] = {
    "chat": (lambda: FakeChat(Script(steps=60)), ChatAgent, lambda a: a.messages, "messages"),
    "responses": (lambda: FakeResponses(Script(steps=60)), Codex, lambda a: a.items, "input"),
    "messages": (lambda: FakeMessages(Script(steps=60)), Claude, lambda a: a.messages, "messages"),
    "gemini": (lambda: FakeGemini(Script(steps=60)), GeminiAgent, lambda a: a.contents, "contents"),
}


def child_of(door: str, proxy: TestClient[Any, Any], headers: dict[str, str]) -> Agent:
    """The sub-agent: the parent's session and client, its own first message."""
    agent = DOORS[door][1](proxy, SESSION, headers)
    first = items_of(door, agent)[-1]
    if door == "responses":
        first["content"] = [{"type": "input_text", "text": CHILD_TASK}]
    elif door == "gemini":
        first["parts"] = [{"text": CHILD_TASK}]
    else:
        first["content"] = CHILD_TASK
    if isinstance(agent, ChatAgent):
        agent.messages[0]["content"] = CHILD_SYSTEM
    elif isinstance(agent, GeminiAgent):
        agent.system = {"parts": [{"text": CHILD_SYSTEM}]}
    return agent


async def child_step(agent: Agent) -> Any:
    """A step of the sub-agent, under its own system prompt."""
    if isinstance(agent, Codex):
        return await agent.step(instructions=CHILD_SYSTEM)
    if isinstance(agent, Claude):
        return await agent.step(system=[{"type": "text", "text": CHILD_SYSTEM}])
    return await agent.step()


def items_of(door: str, agent: Agent) -> list[Any]:
    return DOORS[door][2](agent)


async def proxy_on(aiohttp_server: Any, aiohttp_client: Any, store_url: str,
                   fake: Recorder) -> TestClient[Any, Any]:
    """The proxy (a window the parent outgrows in a few steps) over ``fake`` for every door."""
    server: TestServer = await aiohttp_server(fake.app())  # type: ignore[attr-defined]
    root = str(server.make_url("")).rstrip("/")
    settings = Settings(upstream=root + "/v1", anthropic_upstream=root, gemini_upstream=root, store=store_url,
                        context_window=WINDOW, precompact_threshold=1.0, min_retain_rounds=1)
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings))
    return client


async def parent_run(door: str, proxy: TestClient[Any, Any]) -> tuple[Agent, int]:
    """The parent's steps until the proxy compacted it (and one more); returns it and the steps it took."""
    parent = DOORS[door][1](proxy, SESSION, {})
    for steps in range(1, 40):
        if (await parent.step()).headers[HEADER_COMPACTED] != "none":
            await parent.step()
            return parent, steps + 1
    raise AssertionError("the parent never compacted")


def shape(facts: list[StoredFact]) -> list[tuple[Any, ...]]:
    """A log's entries as the parent's own steps make them (message ids and signatures aside, which the fake
    numbers across sessions): kind, position, source, and what each checkpoint keeps."""
    return [(f.kind, f.index, f.source, f.extra["checkpoint"].get("retain_start_idx") if f.kind == "checkpoint"
             else None) for f in facts]


@pytest.mark.parametrize("header", [True, False], ids=["header", "no-header"])
@pytest.mark.parametrize("door", list(DOORS))
async def test_a_sub_agent_under_its_parents_session_is_a_conversation_of_its_own(
        aiohttp_server, aiohttp_client, tmp_path, store_url: str, door: str, header: bool) -> None:
    fake = DOORS[door][0]()
    proxy = await proxy_on(aiohttp_server, aiohttp_client, store_url, fake)
    parent, steps = await parent_run(door, proxy)
    child = child_of(door, proxy, {HEADERS[door]: AGENT} if header else {})
    sessions: set[str] = set()
    for _ in range(2):
        sending = copy.deepcopy(items_of(door, child))
        resp = await child_step(child)
        sessions.add(resp.headers[HEADER_SESSION])
        upstream = fake.turns()[-1].body[DOORS[door][3]]
        assert upstream == sending, "the sub-agent reached the model with what it sent"
        assert not any(h in orjson.dumps(upstream).decode() for h in SUMMARY_HEADINGS), "no summary of the parent's"
    assert (await parent.step()).headers[HEADER_SESSION] == SESSION
    [own] = sessions
    if header:
        assert own == f"{SESSION}/{AGENT}"
    else:
        assert own.startswith(f"{SESSION}/auto-"), own

    store = proxy.app[store_key]
    facts = await read_log(store, SessionKey(tenant_of(KEY), SESSION))
    assert "rewind" not in {f.kind for f in facts}, "the parent's head never moved to the sub-agent"
    assert replay(facts) == items_of(door, parent)[:-1]
    child_log = await read_log(store, SessionKey(tenant_of(KEY), own))
    assert {f.kind for f in child_log} == {"message"}
    assert replay(child_log) == items_of(door, child)[:-1]

    # The same parent alone, in a proxy of its own: the same log.
    alone_fake = DOORS[door][0]()
    alone_proxy = await proxy_on(aiohttp_server, aiohttp_client, f"sqlite:///{tmp_path}/alone.db", alone_fake)
    alone, alone_steps = await parent_run(door, alone_proxy)
    await alone.step()
    assert alone_steps == steps
    alone_facts = await read_log(alone_proxy.app[store_key], SessionKey(tenant_of(KEY), SESSION))
    assert shape(facts) == shape(alone_facts)


async def test_a_run_whose_first_request_was_a_side_call_is_the_session_not_a_sub_agent(
        make_proxy: ProxyFactory) -> None:
    """Claude Code's first request is its quota probe (one user line, no system prompt); the run after it opens
    otherwise and shares none of its messages, yet it is the session's conversation (a lone exchange is no parent),
    not a sub-agent split off to ``<session>/<fingerprint>``."""
    proxy = await make_proxy()
    store = proxy.app[store_key]

    async def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
        resp = await proxy.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}",
                                                                  HEADER_SESSION: SESSION},
                                json={"model": "gpt-4o", "messages": messages})
        assert resp.status == 200 and resp.headers[HEADER_SESSION] == SESSION
        return dict((await resp.json())["choices"][0]["message"])

    await chat([{"role": "user", "content": "quota"}])
    run: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful engineer."},
                                 {"role": "user", "content": TASK}]
    for step in range(2):
        run.append(await chat(run))
        run.append({"role": "user", "content": f"Go on with step {step}."})
    await chat(run)
    sessions = sorted([info.session async for info in store.sessions()])
    assert sessions == [SESSION]
    assert replay(await read_log(store, SessionKey(tenant_of(KEY), SESSION)))[:len(run)] == run


#: A title call on the parent's first message, per door: its own system prompt, no tools (Claude Code's, opencode's).
TITLES: dict[str, tuple[str, dict[str, Any]]] = {
    "gemini": (f"/v1beta/models/{MODEL}:generateContent", {
        "contents": [{"role": "user", "parts": [{"text": TASK}]}],
        "systemInstruction": {"parts": [{"text": "Write a five-word title."}]}}),
    "messages": ("/v1/messages", {
        "model": "claude-opus-5-5", "max_tokens": 64, "system": [{"type": "text", "text": "Write a five-word title."}],
        "messages": [{"role": "user", "content": TASK}]}),
}


@pytest.mark.parametrize("door", list(TITLES))
async def test_a_sub_agent_right_after_a_title_call_is_still_a_conversation_of_its_own(
        aiohttp_server, aiohttp_client, store_url: str, door: str) -> None:
    """A title call just before a sub-agent (no header) starts moves the log's head to a lone exchange on the
    parent's first message; the session still holds the parent's conversation, so the sub-agent is split off
    to a session of its own, not logged over the parent's as a rewind."""
    fake = DOORS[door][0]()
    proxy = await proxy_on(aiohttp_server, aiohttp_client, store_url, fake)
    await parent_run(door, proxy)
    path, title = TITLES[door]
    resp = await proxy.post(path, json=title, headers={"x-goog-api-key": KEY, "x-api-key": KEY,
                                                       "anthropic-version": "2023-06-01", HEADER_SESSION: SESSION})
    assert resp.status == 200, await resp.text()
    child = child_of(door, proxy, {})
    assert (await child_step(child)).headers[HEADER_SESSION].startswith(f"{SESSION}/auto-")
