"""The working set end to end: after a compaction, the view the upstream gets holds the file's exact current text,
labelled with its path and the log entry it is current as of, through the Chat door and the Messages door."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.fakemessages import FakeMessages
from tests.fakescript import Script
from tests.fakeupstream import FakeUpstream
from tests.proxyfixtures import MASKING_OFF, read_log
from tests.scripted import KEY, Claude, rig
from tests.test_compaction_e2e import WINDOW, prose, send, tool_call

PATH = "/repo/src/app.py"
WRITTEN = "import sys\n\n\ndef main() -> int:\n    print('hello')\n    return 0\n\n\nsys.exit(main())\n"
CURRENT = WRITTEN.replace("print('hello')", "print('hello, world')")
WRITE = {"file_path": PATH, "content": WRITTEN}
EDIT = {"file_path": PATH, "old_string": "print('hello')", "new_string": "print('hello, world')"}


def section(seq: int) -> bytes:
    """The file as the view must carry it, JSON-escaped as it travels."""
    return orjson.dumps(f"### {PATH} (current as of log entry {seq})\n```\n{CURRENT}```")[1:-1]


async def seq_of(proxy: Any, key: str, session: str, call_id: str) -> int:
    """The seq of the log entry holding the result of ``call_id``."""
    facts = await read_log(proxy.app[store_key] if hasattr(proxy, "app") else proxy.server.app[store_key],
                           SessionKey(tenant_of(key), session))
    return next(f.seq for f in facts if f.kind == "message" and call_id in orjson.dumps(f.message).decode()
                and f.message.get("role") in ("tool", "user"))


async def test_the_chat_door_carries_the_files_exact_text_past_a_compaction(make_proxy, fake: FakeUpstream) -> None:
    proxy = await make_proxy(context_window=WINDOW, **MASKING_OFF)
    fake.window = WINDOW
    rng = random.Random(3)
    calls = [{"id": "w1", "type": "function", "function": {"name": "Write", "arguments": orjson.dumps(WRITE).decode()}},
             {"id": "e1", "type": "function", "function": {"name": "Edit", "arguments": orjson.dumps(EDIT).decode()}}]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the greeting."},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "w1", "content": f"File created successfully at: {PATH}"},
        {"role": "tool", "tool_call_id": "e1", "content": f"The file {PATH} has been updated."}]
    for step in range(40):
        fake.script.append(tool_call(step))
        _, reply = await send(proxy, messages, "ws-chat", stream=False)
        messages.append(reply)
        messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": prose(rng, 450)})
    assert fake.summary_requests, "a compaction happened"
    last = orjson.dumps(fake.requests[-1]["messages"])
    assert b'"tool_call_id":"e1"' not in last, "the edit left the view"
    assert section(await seq_of(proxy, "sk-e2e", "ws-chat", '"e1"')) in last


async def test_the_messages_door_carries_the_files_exact_text_past_a_compaction(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    fake = FakeMessages(Script(steps=30))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=4000)
    claude = Claude(proxy, session="ws-messages")
    claude.messages += [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_w1", "name": "Write", "input": WRITE},
            {"type": "tool_use", "id": "toolu_e1", "name": "Edit", "input": EDIT},
            {"type": "tool_use", "id": "toolu_s0", "name": "Bash", "input": {"command": "echo step-0"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_w1", "content": f"File created successfully at: {PATH}"},
            {"type": "tool_result", "tool_use_id": "toolu_e1", "content": f"The file {PATH} has been updated."},
            {"type": "tool_result", "tool_use_id": "toolu_s0", "content": "step-0"}]}]
    for _ in range(30):
        await claude.step()
        if claude.messages[-1]["role"] == "assistant":
            break
    assert any(r.kind == "summary" for r in fake.requests), "a compaction happened"
    last = orjson.dumps(fake.turns()[-1].body["messages"])
    assert b"toolu_e1" not in last, "the edit left the view"
    assert section(await seq_of(proxy, KEY, "ws-messages", "toolu_e1")) in last
