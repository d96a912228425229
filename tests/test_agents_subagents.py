"""The real Claude Code's sub-agent (its ``Agent`` tool, formerly ``Task``) through the proxy: its own conversation.

The parent runs the script's shell steps in a window that makes the proxy
compact it, then calls the ``Agent`` tool in the foreground; the sub-agent
(another system prompt, its own first message, the parent's session header plus
``x-claude-code-agent-id``) runs one shell step of its own and reports; the
parent ends with an answer quoting the report. The sub-agent must be answered
from its own conversation (never the parent's summary or checkpoint), the
parent must see the report as the sub-agent returned it, and the parent's log
must be the one lineage it would be without the sub-agent: no rewind, its
checkpoints all made from its own messages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.constants import HEADER_SESSION
from proxy.sessions import credential, tenant_of
from proxy.store.base import SessionKey
from tests.agents import AgentRun, run_claude, without_cache_control
from tests.fakemessages import FakeMessages, _blocks, _last_call
from tests.fakescript import SUMMARY_HEADINGS, Script, content_text, final_text
from tests.proxyfixtures import read_log, replay
from tests.test_agents_proxy import PROMPT, messages_reply, rig

STEPS = 8
WINDOW = 7_000
AGENT_HEADER = "x-claude-code-agent-id"
SUB_PROMPT = "SUBTASK-7: run `echo sub-1` once, then report what it printed."
SUB_ANSWER = "Sub-agent report: sub-1 was printed."


class AgentFake(FakeMessages):
    """``FakeMessages`` whose parent calls the ``Agent`` tool (in the foreground) where its script would end, then
    ends with a text quoting the tool's result; a sub-agent (``SUB_PROMPT`` in its first message) runs
    ``echo sub-1`` and answers ``SUB_ANSWER``. Which is which is read from the conversation, never a header."""

    def _turn_output(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
        if messages and SUB_PROMPT in content_text(messages[0].get("content")):
            command, output = _last_call(messages)
            if command is None:
                return [self._call("Bash", {"command": "echo sub-1", "description": "Run the sub-step"})], "tool_use"
            text = SUB_ANSWER if output is not None and "sub-1" in output else f"Unexpected output: {output!r}."
            return [{"type": "text", "text": text}], "end_turn"
        reported = agent_result(messages)
        if reported is not None:
            return [{"type": "text", "text": f"Done. The sub-agent said: {reported}"}], "end_turn"
        blocks, stop = super()._turn_output(body, messages)
        if blocks[-1].get("text") == final_text(self.script.steps):
            return [self._call("Agent", {"description": "Run the sub-step", "prompt": SUB_PROMPT,
                                         "subagent_type": "general-purpose", "run_in_background": False})], "tool_use"
        return blocks, stop

    def _call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"type": "tool_use", "id": f"toolu_{next(self._ids):06d}", "name": name, "input": arguments}


def agent_result(messages: list[dict[str, Any]]) -> str | None:
    """The text of the ``tool_result`` that answered an ``Agent`` call, if the conversation has one."""
    calls = {b["id"] for m in messages for b in _blocks(m) if b.get("type") == "tool_use" and b.get("name") == "Agent"}
    for message in messages:
        for block in _blocks(message):
            if block.get("type") == "tool_result" and block.get("tool_use_id") in calls:
                return content_text(block.get("content"))
    return None


@pytest.mark.parametrize("header", [True, False], ids=["header", "no-header"])
async def test_claude_codes_sub_agent_is_its_own_conversation_and_leaves_the_parents_log_alone(
        aiohttp_server, tmp_path: Path, header: bool) -> None:
    """``no-header``: the tap does not forward ``x-claude-code-agent-id``, as a client that names no sub-agent
    (Gemini CLI's) does: the sub-agent's own system prompt and first message tell it from its parent."""
    fake = AgentFake(Script(steps=STEPS), window=WINDOW)
    parts = await rig(aiohttp_server, tmp_path, fake, WINDOW, "known")
    if not header:
        parts.tap.drop = frozenset({AGENT_HEADER})
    run: AgentRun = await run_claude(parts.url, tmp_path, PROMPT, max_turns=STEPS + 5, tools="Bash,Agent")

    assert (run.returncode, run.errors) == (0, []), run.stderr
    assert run.final_text is not None and SUB_ANSWER in run.final_text, "the parent saw the sub-agent's report"
    sent = parts.tap.exchanges
    assert [x.status for x in sent] == [200] * len(sent)
    children = [x for x in sent if AGENT_HEADER in x.headers]
    parents = [x for x in sent if AGENT_HEADER not in x.headers]
    assert len(children) == 2 and len(parents) == STEPS + 2
    session = parents[0].headers["X-Claude-Code-Session-Id"]
    agent = children[0].headers[AGENT_HEADER]
    assert {x.headers["X-Claude-Code-Session-Id"] for x in sent} == {session}, "the sub-agent sends the parent's id"
    assert {x.response_headers[HEADER_SESSION] for x in parents} == {session}
    [own] = {x.response_headers[HEADER_SESSION] for x in children}
    assert own == f"{session}/{agent}" if header else own.startswith(f"{session}/auto-"), own

    # The sub-agent's turns reached the model as it sent them: its own messages, none of the parent's summary.
    sub_turns = [t for t in fake.turns() if SUB_PROMPT in content_text(t.body["messages"][0]["content"])]
    assert [without_cache_control(t.body["messages"]) for t in sub_turns] == [
        without_cache_control(x.json()["messages"]) for x in children]
    assert not any(heading in orjson.dumps(t.body).decode() for t in sub_turns for heading in SUMMARY_HEADINGS)
    summaries = [r for r in fake.requests if r.kind == "summary"]
    assert summaries and not any(SUB_PROMPT in orjson.dumps(r.body).decode() for r in summaries)

    tenant = tenant_of(credential(sent[0].headers))
    parent_log = await read_log(parts.store, SessionKey(tenant, session))
    child_log = await read_log(parts.store, SessionKey(tenant, own))
    # The parent's log is its one lineage, as without the sub-agent: messages and its own checkpoints, no rewind.
    assert {f.kind for f in parent_log} == {"message", "checkpoint", "summary"}
    call = next(f.seq for f in parent_log
                if f.kind == "message" and '"name":"Agent"' in orjson.dumps(f.message).decode())
    assert any(f.kind == "checkpoint" and f.seq < call for f in parent_log), "the parent was compacted before the call"
    assert [without_cache_control(m) for m in replay(parent_log)] == [
        without_cache_control(m) for m in parents[-1].json()["messages"] + messages_reply(parents[-1].response)]
    assert not any(SUB_PROMPT in orjson.dumps(f.message).decode() for f in parent_log if f.kind == "message"
                   and f.message.get("role") == "user" and f.index == 0)
    # The sub-agent's log is its own conversation, never compacted.
    assert {f.kind for f in child_log} == {"message"}
    assert [without_cache_control(m) for m in replay(child_log)] == [
        without_cache_control(m) for m in children[-1].json()["messages"] + messages_reply(children[-1].response)]
