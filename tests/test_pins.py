"""Pins: the agent's instruction files and the text the user marks stay verbatim in every view, within a budget.

The shapes are the pinned clients' own: Claude Code 2.1.332 sends ``CLAUDE.md``
in a ``<system-reminder>`` text block of the first user message, Codex 0.171.0
sends ``AGENTS.md`` as a user message of its own (both captured from the real
binaries against the fake upstreams with an instruction file in the work
directory).
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from proxy.app import create_app
from proxy.context.checkpoint import Checkpoint
from proxy.context.keep.instructionfiles import read_path
from proxy.context.keep.pins import HEADING, USER, carry, found, render
from proxy.context.keep.userwords import carry as carry_words
from proxy.context.view.budget import ContextBudgetPolicy
from proxy.context.view.masking import Masker
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT, GEMINI, MESSAGES, RESPONSES
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script
from tests.proxyfixtures import read_log
from tests.test_compaction_e2e import prose

MEASURE = ContextBudgetPolicy()
WORK = "/tmp/pytest-of-root/pytest-267/test_cap0/work"
CLAUDE_MD = "# Rules\n\nAlways answer in German.\nUse spaces."
AGENTS_MD = "# Rules\n\nAlways answer in French.\nUse tabs.\n"
#: Claude Code 2.1.332's first user message, as it sent it with ``CLAUDE.md`` in its work directory.
CLAUDE_FIRST = {"role": "user", "content": [
    {"type": "text", "text": "<system-reminder>\nCodebase and user instructions are shown below. Be sure to adhere to "
     "these instructions. IMPORTANT: These instructions OVERRIDE any default behavior and you MUST follow them "
     f"exactly as written.\n\nContents of {WORK}/CLAUDE.md (project instructions, checked into the codebase):\n\n"
     f"{CLAUDE_MD}\n</system-reminder>"},
    {"type": "text", "text": "<system-reminder>\nAttribution for git commits and pull requests you create from here "
     "on.\n</system-reminder>\n"},
    {"type": "text", "text": "Run the scripted steps."}]}
#: Codex 0.171.0's instructions message, as it sent it with ``AGENTS.md`` in its work directory.
CODEX_AGENTS = {"type": "message", "id": "msg_01a2431f-4557-74a3-bf60-041548235e07", "role": "user", "content": [
    {"type": "input_text", "text": f"# AGENTS.md instructions for {WORK}\n\n<INSTRUCTIONS>\n{AGENTS_MD}\n"
     "</INSTRUCTIONS>"},
    {"type": "input_text", "text": f"<environment_context>\n  <cwd>{WORK}</cwd>\n  <shell>bash</shell>\n"
     "</environment_context>"}]}


def read_call(name: str, arguments: dict[str, Any], output: str, call_id: str = "t1") -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": name, "input": arguments}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": output}]}]


# -- what is pinned ---------------------------------------------------------------------------------


def test_claude_codes_claude_md_reminder_is_pinned_under_its_path() -> None:
    assert found(MESSAGES, [CLAUDE_FIRST], 0) == [(f"{WORK}/CLAUDE.md", CLAUDE_MD)]


def test_two_instruction_files_in_one_reminder_are_two_pins() -> None:
    text = ("<system-reminder>\nCodebase and user instructions are shown below.\n\n"
            "Contents of /home/u/.claude/CLAUDE.md (user's private global instructions for all projects):\n\n"
            "Be terse.\n\nContents of /w/CLAUDE.local.md (user's private project instructions, not checked in):"
            "\n\nNo emoji.\n</system-reminder>")
    assert found(MESSAGES, [{"role": "user", "content": text}], 0) == [
        ("/home/u/.claude/CLAUDE.md", "Be terse."), ("/w/CLAUDE.local.md", "No emoji.")]


def test_a_user_who_types_contents_of_pins_nothing() -> None:
    message = {"role": "user", "content": "Contents of notes.txt (mine):\n\nbuy milk"}
    assert found(MESSAGES, [message], 0) == []


def test_codexs_agents_md_message_is_pinned_under_its_path() -> None:
    assert found(RESPONSES, [CODEX_AGENTS], 0) == [(f"{WORK}/AGENTS.md", AGENTS_MD)]


def test_a_read_tool_reading_an_instruction_file_is_pinned_and_never_masked() -> None:
    text = "     1\t# Agents\n     2\tRun make lint before each commit.\n" + "     3\tfiller line\n" * 300
    messages = [{"role": "user", "content": "go"}, *read_call("Read", {"file_path": "/w/AGENTS.md"}, text)]
    assert found(MESSAGES, messages, 2) == [("/w/AGENTS.md", text)]
    masker = Masker(TokenCounter())
    assert masker.item(MESSAGES, messages, 2, [], []) is messages[2], "the read's output stays verbatim in the tail"
    other = [{"role": "user", "content": "go"}, *read_call("Read", {"file_path": "/w/README.md"}, text)]
    assert found(MESSAGES, other, 2) == []
    assert masker.item(MESSAGES, other, 2, [], []) is not other[2], "any other file's output is masked as before"


def test_a_gemini_read_of_an_instruction_file_is_pinned_beside_a_response_with_no_text_but_not_a_cancelled_one(
        ) -> None:
    """Gemini CLI answers an image read with ``{}``: beside it the ids and outputs of the turn no longer paired
    one to one, and the instruction file read with it went unpinned. A read cancelled after it ran (its ``error``
    beside its ``output``) is no file's text."""
    def turn(response: dict[str, str]) -> list[dict[str, Any]]:
        def fc(call_id: str, path: str) -> dict[str, Any]:
            return {"functionCall": {"id": call_id, "name": "read_file", "args": {"file_path": path}}}

        def fr(call_id: str, body: dict[str, str]) -> dict[str, Any]:
            return {"functionResponse": {"id": call_id, "name": "read_file", "response": body}}

        return [{"role": "user", "parts": [{"text": "go"}]},
                {"role": "model", "parts": [fc("m1", "/w/mock.png"), fc("m2", "/w/GEMINI.md")]},
                {"role": "user", "parts": [fr("m1", {}), fr("m2", response)]}]

    text = "# Project\nRun npm test before each commit.\n"
    assert found(GEMINI, turn({"output": text}), 2) == [("/w/GEMINI.md", text)]
    assert found(GEMINI, turn({"output": text, "error": "[Operation Cancelled] User cancelled tool execution."}),
                 2) == []


def test_only_whole_reads_of_instruction_files_count() -> None:
    assert read_path("Read", {"file_path": "AGENTS.md", "offset": 10, "limit": 5}) is None, "a partial read"
    assert read_path("Write", {"file_path": "AGENTS.md", "content": "x"}) is None, "a write's result is no file"
    assert read_path("read_file", '{"absolute_path": "/w/GEMINI.md"}') == "/w/GEMINI.md"
    assert read_path("shell", {"command": ["bash", "-lc", "cat AGENTS.md"]}) == "AGENTS.md"
    assert read_path("exec_command", {"cmd": "cat .cursorrules"}) == ".cursorrules"
    assert read_path("shell", {"command": ["bash", "-lc", "cat AGENTS.md | head"]}) is None
    assert read_path("read", {"filePath": "/w/.cursor/rules/style.mdc"}) == "/w/.cursor/rules/style.mdc"
    assert read_path("shell_command", {"command": "Get-Content -Raw AGENTS.md"}) == "AGENTS.md"


PLAYBOOK = ("# Shop platform - execution playbook\n\n## Packaging rules\n\n"
            "- All runnable application code must stay inside fullstack/ and nowhere else.\n"
            "- Docs go to docs/design.md and docs/api-spec.md, never to the root directory.\n"
            "- Do not skip prompts: each must be validated before the next one starts.\n\n"
            "## Prompt 1 - bootstrap\n\n- Add health endpoints and a frontend health page.\n"
            "- Record every assumption in questions.md before writing any code.\n\n"
            "## Prompt 8 - attendance\n\n- Implement device binding checks.\n- Add payroll reconciliation export.\n")


def test_a_document_the_user_quotes_and_the_agent_reads_whole_is_pinned_under_its_path() -> None:
    pasted = PLAYBOOK.split("## Prompt 8")[0]  # the user pastes the rules and the first prompt, not the rest
    command = {"command": "Get-Content -Raw playbook.md"}
    messages = [{"role": "user", "content": f"original prompt\n{pasted}\nwork only on prompt 1"},
                *read_call("shell_command", command, PLAYBOOK)]
    assert found(MESSAGES, messages, 2) == [("playbook.md", PLAYBOOK)]
    unquoted = [{"role": "user", "content": "build the shop platform, see the playbook"},
                *read_call("shell_command", command, PLAYBOOK)]
    assert found(MESSAGES, unquoted, 2) == [], "a file the user did not quote is no instruction"
    partial = [messages[0], *read_call("shell_command", {"command": "Get-Content playbook.md | Select -First 5"},
                                       PLAYBOOK)]
    assert found(MESSAGES, partial, 2) == [], "nor is a part of one"


def test_text_the_user_marks_is_pinned_but_not_in_tool_output() -> None:
    messages = [{"role": "user", "content": "Fix it.\n<pin>Never touch vendor/.\nPython 3.11 only.</pin>\nThanks"},
                *read_call("Bash", {"command": "cat notes"}, "<pin>not from the user</pin>")]
    assert [f for i in range(3) for f in found(MESSAGES, messages, i)] == [
        (USER, "Never touch vendor/.\nPython 3.11 only.")]
    assert found(CHAT, [{"role": "user", "content": "<pin>  </pin>"}], 0) == [], "an empty pin pins nothing"


def test_the_users_words_name_a_pinned_text_instead_of_carrying_it_twice() -> None:
    words = carry_words(RESPONSES, [CODEX_AGENTS], (), start=0, end=1, opener=None, previous_opener=None, seqs=[3],
                        measure=MEASURE, budget=1000)
    assert words[0][3] == (f"# AGENTS.md instructions for {WORK}\n\n<INSTRUCTIONS>\n[{WORK}/AGENTS.md: verbatim "
                           "under the pinned instructions]\n</INSTRUCTIONS>\n<environment_context>\n"
                           f"  <cwd>{WORK}</cwd>\n  <shell>bash</shell>\n</environment_context>")
    marked = [{"role": "user", "content": "Fix it. <pin> Python 3.11 only. </pin> Thanks"}]
    words = carry_words(CHAT, marked, (), start=0, end=1, opener=None, previous_opener=None, seqs=[3],
                        measure=MEASURE, budget=1000)
    assert words[0][3] == f"Fix it. <pin> [{USER}: verbatim under the pinned instructions] </pin> Thanks"


# -- carried, superseded, budgeted --------------------------------------------------------------------


def test_a_re_read_supersedes_the_older_text_and_pins_carry_across_compactions() -> None:
    messages: list[dict[str, Any]] = [CODEX_AGENTS, {"type": "message", "role": "user", "content": "go"}]
    first = carry(RESPONSES, messages, (), start=0, end=2, opener=None, previous_opener=None, seqs=range(10, 99),
                  measure=MEASURE, budget=1000)
    assert first == ((f"{WORK}/AGENTS.md", 10, MEASURE.text_tokens(AGENTS_MD), AGENTS_MD),)
    newer = "# Rules\n\nAlways answer in Italian.\n"
    messages += [{"type": "function_call", "call_id": "c1", "name": "shell",
                  "arguments": orjson.dumps({"command": ["bash", "-lc", "cat AGENTS.md"]}).decode()},
                 {"type": "function_call_output", "call_id": "c1", "output": newer},
                 {"type": "message", "role": "user", "content": "<pin>Keep the API stable.</pin>"}]
    second = carry(RESPONSES, messages, first, start=2, end=5, opener=None, previous_opener=None, seqs=range(10, 99),
                   measure=MEASURE, budget=1000)
    assert [(p[0], p[1], p[3]) for p in second] == [("AGENTS.md", 13, newer), (USER, 14, "Keep the API stable.")], (
        "the relative re-read replaces the absolute path's older text")
    assert render(second) == (f"{HEADING}\n\n[AGENTS.md, as of log entry 13]\n{newer}\n\n"
                              f"[{USER}, as of log entry 14]\nKeep the API stable.")
    third = carry(RESPONSES, messages, second, start=5, end=5, opener=None, previous_opener=None, seqs=range(10, 99),
                  measure=MEASURE, budget=1000)
    assert third == second, "a compaction with nothing new keeps the pins byte for byte"


def test_over_the_budget_the_oldest_pins_are_left_out_whole_and_named() -> None:
    rng = random.Random(7)
    texts = [prose(rng, 150) for _ in range(3)]
    messages = [{"role": "user", "content": f"<pin>{text}</pin>"} for text in texts]
    tokens = [MEASURE.text_tokens(t) for t in texts]
    pins = carry(CHAT, messages, (), start=0, end=3, opener=None, previous_opener=None, seqs=[5, 6, 7],
                 measure=MEASURE, budget=tokens[1] + tokens[2] + 40)
    assert [p[3] for p in pins] == ["", texts[1], texts[2]], "the newest kept whole, the oldest left out whole"
    shown = render(pins)
    assert texts[1] in shown and texts[2] in shown and texts[0][:40] not in shown
    assert shown.endswith(f"whole in the fact log: {USER} (log entry 5, {tokens[0]:,} tokens)]")


def test_a_pin_larger_than_the_room_left_is_cut_head_and_tail_and_older_ones_left_out() -> None:
    rng = random.Random(8)
    old, large = prose(rng, 100), "\n".join(f"- Rule {i}: {prose(rng, 12)}" for i in range(60))
    messages = [{"role": "user", "content": f"<pin>{old}</pin>"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "r", "name": "Read",
                                                   "input": {"file_path": "/w/CLAUDE.md"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "r", "content": large}]}]
    budget = 500
    assert MEASURE.text_tokens(large) > 2 * budget
    pins = carry(MESSAGES, messages, (), start=0, end=3, opener=None, previous_opener=None, seqs=[4, 5, 6],
                 measure=MEASURE, budget=budget)
    assert [(p[0], p[1]) for p in pins] == [(USER, 4), ("/w/CLAUDE.md", 6)]
    assert pins[0][3] == "", "no room left for the older pin"
    cut = pins[1][3]
    assert cut.startswith("- Rule 0: ") and cut.endswith(large[-60:]), "head and tail kept"
    assert "full text in the fact log, log entry 6 …]" in cut
    assert pins[1][2] + 16 <= budget and pins[1][2] == MEASURE.text_tokens(cut)


def test_the_checkpoint_keeps_its_pins_and_reads_one_without_them() -> None:
    pins = (("/w/AGENTS.md", 4, 9, "Use tabs."),)
    checkpoint = Checkpoint("", 3, "h", None, 0, 0, "m", 0.0, pins=pins)
    assert checkpoint.summarises, "pins alone make a summary item"
    assert Checkpoint.from_json(checkpoint.to_json()) == checkpoint
    assert checkpoint.view_key != Checkpoint("", 3, "h", None, 0, 0, "m", 0.0).view_key
    old = orjson.loads(checkpoint.to_json())
    del old["pins"]
    assert Checkpoint.from_json(old).pins == ()
    with pytest.raises(ValueError, match="malformed pins"):
        Checkpoint.from_json({**old, "pins": 5})


# -- end to end ------------------------------------------------------------------------------------

WINDOW = 8_000
ROUNDS = 36
KEY = "sk-pins"
#: An instruction file long enough that the user words' budget clips it once enough of them are carried.
INSTRUCTIONS = "\n".join(f"- Rule {i}: files under pkg_{i}/ use the prefix r{i}_ and keep {i * 3} blank lines."
                         for i in range(24))


def strings(value: Any) -> str:
    """Every string in a request's items, one per line: where a text sits varies by API."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "\n".join(strings(v) for v in value.values())
    if isinstance(value, list):
        return "\n".join(strings(v) for v in value)
    return ""


async def drive(proxy: TestClient[Any, Any], api: str, rng: random.Random) -> None:
    """``ROUNDS`` rounds of a long user message and the fake's short answer, the instruction file in the first."""
    if api == "messages":
        first = {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nCodebase and user instructions are shown below.\n\n"
             f"Contents of /w/CLAUDE.md (project instructions, checked into the codebase):\n\n{INSTRUCTIONS}\n"
             "</system-reminder>"}, {"type": "text", "text": prose(rng, 150)}]}
        messages: list[dict[str, Any]] = [first]
    else:
        messages = [{"type": "message", "role": "developer", "content": "You are a coding agent."},
                    {"type": "message", "role": "user", "content": [
                        {"type": "input_text", "text": f"# AGENTS.md instructions for /w\n\n<INSTRUCTIONS>\n"
                         f"{INSTRUCTIONS}\n</INSTRUCTIONS>"}]},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prose(rng, 150)}]}]
    for _ in range(ROUNDS):
        if api == "messages":
            body = {"model": "m", "max_tokens": 512, "system": "You code.", "messages": messages}
            resp = await proxy.post("/v1/messages", data=orjson.dumps(body),
                                    headers={"x-api-key": KEY, "X-Session-Id": "pins"})
            answer = await resp.json()
            assert resp.status == 200, answer
            messages += [{"role": "assistant", "content": answer["content"]},
                         {"role": "user", "content": [{"type": "text", "text": prose(rng, 150)}]}]
        else:
            body = {"model": "m", "input": messages, "store": False}
            resp = await proxy.post("/v1/responses", data=orjson.dumps(body),
                                    headers={"Authorization": f"Bearer {KEY}", "X-Session-Id": "pins"})
            answer = await resp.json()
            assert resp.status == 200, answer
            messages += [*answer["output"], {"type": "message", "role": "user",
                                             "content": [{"type": "input_text", "text": prose(rng, 150)}]}]


@pytest.mark.parametrize("api", ["messages", "responses"])
async def test_the_instruction_file_stays_verbatim_in_every_view_through_many_compactions(
        aiohttp_server: Any, aiohttp_client: Any, store_url: str, api: str) -> None:
    """The fake's summariser keeps FACT-… tokens only, and the user words' budget clips the oldest long message:
    only the pin keeps the file whole."""
    fake = (FakeMessages if api == "messages" else FakeResponses)(Script(steps=0), window=WINDOW)
    upstream = await aiohttp_server(fake.app())
    root = str(upstream.make_url("")).rstrip("/")
    proxy = await aiohttp_client(create_app(Settings(upstream=root + "/v1", anthropic_upstream=root,
                                                     store=store_url, context_window=WINDOW)))
    await drive(proxy, api, random.Random(11))

    views = [r.body["messages" if api == "messages" else "input"] for r in fake.turns()]
    assert [r.status for r in fake.turns()] == [200] * ROUNDS, "no refusal"
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "pins"))
    checkpoints = [f.extra["checkpoint"] for f in facts if f.kind == "checkpoint"]
    assert len([f for f in facts if f.kind == "summary"]) >= 3, "compacted several times"
    assert not any("Rule 7" in c["summary"] for c in checkpoints), "the summariser dropped the file"
    for n, view in enumerate(views):
        assert INSTRUCTIONS in strings(view), f"view {n} lost the instruction file"
    path = "/w/CLAUDE.md" if api == "messages" else "/w/AGENTS.md"
    last = strings(views[-1])
    assert HEADING in last and f"[{path}, as of log entry " in last, "the pin, labelled, in the summary item"
    assert last.count(INSTRUCTIONS) == 1, "one copy: the user's words name the pin instead"
