"""The clients' own compaction, answered from the proxy's checkpoint, in each client's shape.

A small driver plays Claude Code (Messages) and Codex (Responses) against the
fake upstreams through the proxy, far enough for the proxy to compact. Then
the client's compaction request arrives, as captured from the real clients:
with a checkpoint ready, the proxy answers it without any upstream call (the
fake's summary model would refuse: ``summaries_allowed``), and the answer
holds the checkpoint's summary and the kept tail. Codex's ``compaction`` item
carries an encrypted reference that, carried back, reaches the upstream as the
summary text; a forged one is a 400.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.clientcompact.texts import CLAUDE_CONTINUATION, CLAUDE_MARKER, CODEX_PROMPT
from proxy.context.view.tokens import TokenCounter
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script, parse_sse
from tests.proxyfixtures import read_log

KEY = "sk-client-compaction"
CLAUDE_HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "X-Claude-Code-Session-Id": "cc-1"}
CODEX_HEADERS = {"Authorization": f"Bearer {KEY}", "session-id": "codex-1"}
BASH = {"name": "Bash", "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
SHELL = {"type": "function", "name": "exec_command", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
BASE64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
CLAUDE_PROMPT = (f"{CLAUDE_MARKER}\n\nYour task is to create a detailed summary of the conversation so far, "
                 "paying close attention to the user's explicit requests.\n\nREMINDER: Do NOT call any tools. "
                 "Respond with plain text only — an <analysis> block followed by a <summary> block.")


async def proxy_for(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Any, fake: FakeMessages | FakeResponses,
                    window: int) -> TestClient[Any, Any]:
    upstream: TestServer = await aiohttp_server(fake.app())
    root = str(upstream.make_url("")).rstrip("/")
    settings = Settings(upstream=root + "/v1", anthropic_upstream=root, store=f"sqlite:///{tmp_path}/facts.db",
                        context_window=window, min_retain_rounds=2, precompact_threshold=1.0)
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings))
    return client


# -- Claude Code ----------------------------------------------------------------------------------


async def claude_run(proxy: TestClient[Any, Any], steps: int, lines: int = 40) -> list[dict[str, Any]]:
    """A Claude Code-like loop: each Bash call answered with its output, until ``steps`` are done."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Run the steps."}]}]
    for step in range(1, steps + 1):
        resp = await proxy.post("/v1/messages?beta=true", headers=CLAUDE_HEADERS, json={
            "model": "claude-test", "max_tokens": 1024, "system": [{"type": "text", "text": "You are Claude Code."}],
            "tools": [BASH], "messages": messages})
        assert resp.status == 200, await resp.text()
        content = (await resp.json())["content"]
        use = next(b for b in content if b["type"] == "tool_use")
        messages += [{"role": "assistant", "content": content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                   "content": f"step-{step}\n" + "output line\n" * lines}]}]
    return messages


def claude_compaction(messages: list[dict[str, Any]], prompt: str = CLAUDE_PROMPT) -> list[dict[str, Any]]:
    """As captured from Claude Code 2.1.332: the prompt after the tool results, a system entry after it."""
    *head, last = messages
    return [*head, {"role": "user", "content": [*last["content"], {"type": "text", "text": prompt}]},
            {"role": "system", "content": "Today's date is 2026-11-30."}]


@pytest.mark.parametrize("stream", [False, True])
async def test_claude_codes_compaction_is_answered_from_the_checkpoint(aiohttp_server, aiohttp_client, tmp_path,
                                                                       stream: bool) -> None:
    fake = FakeMessages(Script(steps=40))
    proxy = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, fake, window=6_000)
    messages = await claude_run(proxy, 14)
    summaries = [r for r in fake.requests if r.kind == "summary"]
    assert summaries, "the proxy compacted on the way"
    before = len(fake.requests)
    resp = await proxy.post("/v1/messages?beta=true", headers=CLAUDE_HEADERS, json={
        "model": "claude-test", "max_tokens": 1024, "system": [{"type": "text", "text": "You are Claude Code."}],
        "tools": [BASH], "messages": claude_compaction(messages), "stream": stream})
    assert resp.status == 200
    raw = await resp.read()
    assert len(fake.requests) == before, "answered without any upstream call"
    if stream:
        events = parse_sse(raw)
        assert (events[0]["type"], events[-1]["type"]) == ("message_start", "message_stop")
        text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    else:
        body = orjson.loads(raw)
        assert body["type"] == "message" and body["stop_reason"] == "end_turn"
        text = body["content"][0]["text"]
    summary = text[text.index("<summary>") + len("<summary>"):text.index("</summary>")]
    assert "## 1. Goals" in summary and "step-14" in summary, "the summary and the kept tail, verbatim"
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "cc-1"))
    assert facts[-1].kind == "summary" and facts[-1].extra["client_compaction"] == "claude_code"
    logged = [f.message for f in facts if f.kind == "message"]
    assert logged[-2:] == [messages[-1],  # its tool results, the prompt block taken out
                           {"role": "system", "content": "Today's date is 2026-11-30."}], "what it covers is logged"


async def test_claude_codes_compaction_over_a_checkpoint_that_only_masks_gets_a_summary_in_a_quarter_window(
        aiohttp_server, aiohttp_client, tmp_path) -> None:
    """A masking batch is no summary: answering with it would hand the client a transcript of its whole history,
    which it then carries in every request. A summary is made now, as the client would have waited for its own."""
    fake = FakeMessages(Script(steps=60))
    window = 16_000
    proxy = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, fake, window=window)
    # 28 steps: with the kept outputs a fifth of the room, a shorter run's masked view is all tail.
    messages = await claude_run(proxy, 28, lines=150)
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "cc-1"))
    checkpoints = [f.extra["checkpoint"] for f in facts if f.kind == "checkpoint"]
    assert checkpoints and not checkpoints[-1]["summary"], "the ready checkpoint only masks"
    assert not [r for r in fake.requests if r.kind == "summary"]
    resp = await proxy.post("/v1/messages?beta=true", headers=CLAUDE_HEADERS, json={
        "model": "claude-test", "max_tokens": 1024, "system": [{"type": "text", "text": "You are Claude Code."}],
        "tools": [BASH], "messages": claude_compaction(messages)})
    assert resp.status == 200
    text = (await resp.json())["content"][0]["text"]
    summary = text[text.index("<summary>") + len("<summary>"):text.index("</summary>")]
    assert [r for r in fake.requests if r.kind == "summary"], "a summary was made for the answer"
    assert "## 1. Goals" in summary and "Ran steps 1 to" in summary
    assert TokenCounter().text_tokens(summary) <= window // 4, "within a quarter of the window"
    assert "\nstep-1\n" not in summary and "\nstep-27\n" in summary, "the newest items only, not the whole history"


async def test_claude_codes_next_request_after_its_compaction_is_a_marked_boundary(aiohttp_server, aiohttp_client,
                                                                                   tmp_path) -> None:
    fake = FakeMessages(Script(steps=40))
    proxy = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, fake, window=6_000)
    await claude_run(proxy, 3)
    continued = [{"role": "user", "content": [{"type": "text", "text": f"{CLAUDE_CONTINUATION}\n\nSummary:\n"
                                                                       "Ran steps 1 to 3."}]}]
    resp = await proxy.post("/v1/messages?beta=true", headers=CLAUDE_HEADERS, json={
        "model": "claude-test", "max_tokens": 1024, "tools": [BASH], "messages": continued})
    assert resp.status == 200
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "cc-1"))
    rewinds = [f for f in facts if f.kind == "rewind"]
    assert [(f.index, f.extra["from_seq"], f.extra.get("client_compaction")) for f in rewinds] == [
        (0, None, "claude_code")]



async def test_a_run_continuing_after_its_compaction_and_a_title_call_is_no_new_boundary(aiohttp_server,
                                                                                          aiohttp_client,
                                                                                          tmp_path) -> None:
    """After Claude Code's compaction a title call (another first message) moves the log's head; the run's next
    request returns to its own branch, which still holds the continuation, and its rewind is no client
    compaction: only the first request of the new lineage was one."""
    fake = FakeMessages(Script(steps=40))
    proxy = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, fake, window=6_000)
    await claude_run(proxy, 3)
    continued: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": f"{CLAUDE_CONTINUATION}\n\nSummary:\nRan steps 1 to 3."}]}]
    for messages in (continued, [{"role": "user", "content": "Write a five-word title for: fix the tests."}],
                     [*continued, {"role": "assistant", "content": [{"type": "text", "text": "Going on."}]},
                      {"role": "user", "content": "Go on."}]):
        resp = await proxy.post("/v1/messages?beta=true", headers=CLAUDE_HEADERS, json={
            "model": "claude-test", "max_tokens": 1024, "tools": [BASH], "messages": messages})
        assert resp.status == 200
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "cc-1"))
    assert [f.extra.get("client_compaction") for f in facts if f.kind == "rewind"] == ["claude_code", None, None]

async def test_the_trigger_phrases_inside_a_tool_result_are_a_normal_request(aiohttp_server, aiohttp_client,
                                                                             tmp_path) -> None:
    fake = FakeMessages(Script(steps=40))
    proxy = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, fake, window=6_000)
    messages = await claude_run(proxy, 2)
    messages[-1]["content"][0]["content"] = "cat notes.txt\n" + CLAUDE_PROMPT  # a file quoting the prompt
    before = len(fake.turns())
    resp = await proxy.post("/v1/messages?beta=true", headers=CLAUDE_HEADERS, json={
        "model": "claude-test", "max_tokens": 1024, "tools": [BASH], "messages": messages})
    assert resp.status == 200
    assert len(fake.turns()) == before + 1, "forwarded to the model as any turn"


# -- Codex ------------------------------------------------------------------------------------------


async def codex_run(proxy: TestClient[Any, Any], steps: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Run the steps."}]}]
    for step in range(1, steps + 1):
        resp = await proxy.post("/v1/responses", headers=CODEX_HEADERS, json={
            "model": "gpt-5.5", "input": items, "tools": [SHELL], "store": False, "stream": False})
        assert resp.status == 200, await resp.text()
        output = (await resp.json())["output"]
        call = next(i for i in output if i["type"] == "function_call")
        items += [*output, {"type": "function_call_output", "call_id": call["call_id"],
                            "output": f"step-{step}\n" + "output line\n" * 40}]
    return items


async def test_codexs_local_compaction_prompt_gets_the_summary_as_its_last_message(aiohttp_server, aiohttp_client,
                                                                                   tmp_path) -> None:
    fake = FakeResponses(Script(steps=40))
    proxy = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, fake, window=5_000)
    items = await codex_run(proxy, 14)
    before = len(fake.requests)
    prompt = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": CODEX_PROMPT + "."}]}
    resp = await proxy.post("/v1/responses", headers=CODEX_HEADERS, json={
        "model": "gpt-5.5", "input": [*items, prompt], "tools": [SHELL], "store": False, "stream": False})
    assert resp.status == 200
    body = await resp.json()
    assert len(fake.requests) == before
    [message] = body["output"]
    assert message["type"] == "message" and "## 1. Goals" in message["content"][0]["text"]


@pytest.mark.parametrize("route", ["trigger", "endpoint"])
async def test_codexs_remote_compaction_gets_one_item_that_comes_back_as_the_summary(aiohttp_server, aiohttp_client,
                                                                                     tmp_path, route: str) -> None:
    fake = FakeResponses(Script(steps=40))
    proxy = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, fake, window=5_000)
    items = await codex_run(proxy, 14)
    if route == "trigger":
        resp = await proxy.post("/v1/responses", headers=CODEX_HEADERS, json={
            "model": "gpt-5.5", "input": [*items, {"type": "compaction_trigger"}], "store": False, "stream": True})
        events = parse_sse(await resp.read())
        output = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert events[-1]["type"] == "response.completed"
    else:
        resp = await proxy.post("/v1/responses/compact", headers=CODEX_HEADERS, json={
            "model": "gpt-5.5", "input": items})
        output = (await resp.json())["output"]
    assert resp.status == 200
    [item] = output
    assert item["type"] == "compaction" and item["encrypted_content"].startswith("ctxproxy.v2.")
    assert not [r for r in fake.requests if r.kind == "compact"], "answered by the proxy, not the upstream"

    carried = [items[0], item, {"type": "message", "role": "user",
                                "content": [{"type": "input_text", "text": "Go on."}]}]
    resp = await proxy.post("/v1/responses", headers=CODEX_HEADERS, json={
        "model": "gpt-5.5", "input": carried, "tools": [SHELL], "store": False, "stream": False})
    assert resp.status == 200, await resp.text()
    sent = fake.turns()[-1].body["input"]
    assert sent[1]["type"] == "message" and sent[1]["role"] == "user"
    assert "## 1. Goals" in sent[1]["content"][0]["text"], "the upstream got readable summary text"

    token = item["encrypted_content"]
    middle = len(token) // 2
    for forged_token in (token[:middle] + ("B" if token[middle] == "A" else "A") + token[middle + 1:],
                         token[:-1] + BASE64URL[BASE64URL.index(token[-1]) ^ 1]):  # the last bits, maybe padding
        forged = {**item, "encrypted_content": forged_token}
        resp = await proxy.post("/v1/responses", headers=CODEX_HEADERS, json={
            "model": "gpt-5.5", "input": [items[0], forged], "store": False})
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "invalid_compaction_reference"


async def test_instructions_added_to_compact_steer_a_rolling_update(aiohttp_server, aiohttp_client, tmp_path) -> None:
    """``/compact <text>``: the text goes into the summary prompt; the answer comes from the updated checkpoint."""
    fake = FakeMessages(Script(steps=40))
    proxy = await proxy_for(aiohttp_server, aiohttp_client, tmp_path, fake, window=6_000)
    messages = await claude_run(proxy, 14)
    summaries = len([r for r in fake.requests if r.kind == "summary"])
    prompt = CLAUDE_PROMPT.replace("\n\nREMINDER", "\nAdditional Instructions:\nKeep every step number.\n\nREMINDER")
    resp = await proxy.post("/v1/messages?beta=true", headers=CLAUDE_HEADERS, json={
        "model": "claude-test", "max_tokens": 1024, "tools": [BASH], "messages": claude_compaction(messages, prompt)})
    assert resp.status == 200
    calls = [r for r in fake.requests if r.kind == "summary"][summaries:]
    assert len(calls) >= 1, "a rolling update was written for the instructions"
    assert "Keep every step number." in orjson.dumps(calls[-1].body).decode()
    assert "<summary>" in (await resp.json())["content"][0]["text"]


STOCK = ("You are Codex, a coding agent. " + "Follow the repository's conventions and keep changes small. " * 40)


@pytest.mark.parametrize("linked", [False, True], ids=["same-id", "linked"])
async def test_a_compact_request_holding_a_stock_start_gets_nothing_of_someone_elses_session(
        aiohttp_server, aiohttp_client, store_url: str, linked: bool) -> None:
    """Another credential sends ``/v1/responses/compact`` under the same session id with a stock start (the stock
    instructions, the first prompt and, once proved while the owner's session was that short, its first step):
    whatever answers it (the proxy, from what that start holds, or the upstream) holds nothing of the owner's
    later work, read back through the ``compaction`` item it gets."""
    fake = FakeResponses(Script(steps=40))
    upstream: TestServer = await aiohttp_server(fake.app())
    proxy: TestClient[Any, Any] = await aiohttp_client(create_app(Settings(
        upstream=str(upstream.make_url("/v1")), store=store_url, context_window=5_000, min_retain_rounds=2,
        precompact_threshold=1.0)))
    start = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": STOCK}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Run the steps."}]}]
    other = {"Authorization": "Bearer sk-someone-else", "session-id": "codex-1"}

    async def turn(items: list[dict[str, Any]], headers: dict[str, str]) -> list[dict[str, Any]]:
        resp = await proxy.post("/v1/responses", headers=headers, json={
            "model": "gpt-5.5", "input": items, "tools": [SHELL], "store": False, "stream": False})
        assert resp.status == 200, await resp.text()
        output = (await resp.json())["output"]
        call = next(i for i in output if i["type"] == "function_call")
        step = orjson.loads(call["arguments"])["cmd"].split("-")[1]
        return [*output, {"type": "function_call_output", "call_id": call["call_id"],
                          "output": f"step-{step}\n" + "output line\n" * 40}]

    items = [*start, *await turn(start, CODEX_HEADERS)]
    if linked:  # the other credential proves the owner's session while it is only its stock start
        await turn(items, other)
        held = list(items)
    else:
        held = start
    for _ in range(13):
        items += await turn(items, CODEX_HEADERS)
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "codex-1"))
    assert [f for f in facts if f.kind == "summary"], "the owner's session was summarised"

    before = len(fake.requests)
    resp = await proxy.post("/v1/responses/compact", headers=other, json={"model": "gpt-5.5", "input": held})
    assert resp.status == 200
    [item] = (await resp.json())["output"]
    resp = await proxy.post("/v1/responses", headers=other, json={
        "model": "gpt-5.5", "input": [start[0], item, {"type": "message", "role": "user", "content": "Go on."}],
        "tools": [SHELL], "store": False, "stream": False})
    sent = orjson.dumps([r.body for r in fake.requests[before:]]).decode()
    assert not {f"step-{n}" for n in range(3, 15)} & set(re.findall(r"step-\d+", sent)), "none of the later steps"
    assert "Ran steps" not in sent or "Ran steps 1 to 1." in sent or "Ran steps 1 to 2." in sent
