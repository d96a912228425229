"""The client's own compaction: recognising it, the answers in each client's shape, and its traces later.

Request shapes follow the clients: Claude Code 2.1.332's summary request is rebuilt the way its bundled code
assembles it (marker, task, optional ``Additional Instructions:``, reminder); Codex's texts come from
codex-rs (``templates/compact/``). The answers are parsed back the way each client reads them.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.clientcompact import (
    CODEX_ENDPOINT,
    CompactionRequest,
    Envelope,
    compaction_reference,
    compaction_references,
    find_boundary,
    recognise,
    render,
)
from proxy.clientcompact.answers import claude_code_text
from proxy.clientcompact.boundaries import claude_code_summary, codex_summary
from proxy.sse import SSESplitter, parse_event

# -- the clients' texts -------------------------------------------------------------------------------


def claude_prompt(task: str = "the conversation so far", *, instructions: str | None = None,
                  summary_only: bool = False) -> str:
    """Claude Code's summary request text, assembled as 2.1.332 does (the long body abbreviated)."""
    wanted = "a <summary> block" if summary_only else "an <analysis> block followed by a <summary> block"
    text = (
        "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n"
        "- Do NOT use Read, Bash, Grep, Glob, Edit, Write, or ANY other tool.\n"
        "- You already have all the context you need in the conversation above.\n"
        "- Tool calls will be REJECTED and will waste your only turn \u2014 you will fail the task.\n"
        f"- Your entire response must be plain text: {wanted}.\n"
        f"Your task is to create a detailed summary of {task}, paying close attention to the user's explicit "
        "requests and your previous actions.\nYour summary should include the following sections:\n"
        "1. Primary Request and Intent: Capture all of the user's explicit requests and intents in detail\n"
    )
    if instructions is not None:
        text += f"\nAdditional Instructions:\n{instructions}"
    return text + (f"\nREMINDER: Do NOT call any tools. Respond with plain text only \u2014 {wanted}. "
                   "Tool calls will be rejected and you will fail the task.")


CODEX_PROMPT = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM that will "
    "resume the task.\n\nInclude:\n- Goal / user objective\n- Current progress and key decisions made\n"
)
CODEX_PREFIX = (
    "Another language model started to solve this problem and produced a summary of its thinking process. You "
    "also have access to the state of the tools that were used by that language model. Use this to build on the "
    "work that has already been done and avoid duplicating work. Here is the summary produced by the other "
    "language model, use the information in this summary to assist with your own analysis:"
)
CLAUDE_CONTINUATION = (
    "This session is being continued from a previous conversation that ran out of context. The summary below "
    "covers the earlier portion of the conversation."
)


def claude_request(last_user: list[dict[str, Any]] | str, *, trailing_system: bool = True) -> dict[str, Any]:
    """A Claude Code request as captured: tools offered, a tool cycle, then ``last_user``, then a system entry."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Make tests/test_parse.py pass."}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Run the tests first.", "signature": "sig-1"},
            {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "pytest -q"}},
        ]},
        {"role": "user", "content": last_user},
    ]
    if trailing_system:
        messages.append({"role": "system", "content": "Today's date is 2026-11-30."})
    return {"model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": True,
            "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}],
            "messages": messages}


TOOL_RESULT = {"type": "tool_result", "tool_use_id": "toolu_01", "content": "1 failed, 12 passed"}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def codex_request(*tail: dict[str, Any], **fields: Any) -> dict[str, Any]:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions/>"}]},
        user("Add a --dry-run flag."),
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
        {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"command":["ls"]}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "cli.py\n"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
    ]
    return {"model": "gpt-5-codex", "instructions": "You are Codex.", "input": [*items, *tail], "stream": True,
            **fields}


# -- Claude Code requests ---------------------------------------------------------------------------------


def test_claude_code_captured_shape_is_recognised() -> None:
    """The prompt after the tool results of its message, tools offered, a system entry after it."""
    prompt = {"type": "text", "text": claude_prompt(), "cache_control": {"type": "ephemeral"}}
    payload = claude_request([TOOL_RESULT, prompt])
    found = recognise("messages", payload)
    assert found == CompactionRequest(kind="claude_code", index=2, block=1, instructions=None, scope="all",
                                      analysis=True)
    assert found.conversation(payload["messages"]) == [
        *payload["messages"][:2],
        {"role": "user", "content": [TOOL_RESULT]},
        {"role": "system", "content": "Today's date is 2026-11-30."},
    ]


def test_claude_code_additional_instructions_are_extracted() -> None:
    prompt = claude_prompt(instructions="Focus on the parser.\nKeep every failing test name.")
    found = recognise("messages", claude_request([TOOL_RESULT, {"type": "text", "text": prompt}]))
    assert found is not None and found.instructions == "Focus on the parser.\nKeep every failing test name."


@pytest.mark.parametrize(("task", "scope"), [
    ("the conversation so far", "all"),
    ("the RECENT portion of the conversation \u2014 the messages that follow earlier retained context", "recent"),
    ("this conversation. This summary will be placed at the start of a continuing session", "up_to"),
], ids=["all", "recent", "up-to"])
def test_claude_code_variants_name_their_scope(task: str, scope: str) -> None:
    found = recognise("messages", claude_request([{"type": "text", "text": claude_prompt(task)}]))
    assert found is not None and (found.kind, found.scope) == ("claude_code", scope)


def test_claude_code_summary_only_variant_wants_no_analysis() -> None:
    found = recognise("messages", claude_request([{"type": "text", "text": claude_prompt(summary_only=True)}]))
    assert found is not None and found.analysis is False


def test_claude_code_string_content_is_the_whole_message() -> None:
    payload = claude_request(claude_prompt(), trailing_system=False)
    found = recognise("messages", payload)
    assert found == CompactionRequest(kind="claude_code", index=2, block=None)
    assert found.conversation(payload["messages"]) == payload["messages"][:2]


def test_claude_code_custom_prompt_is_known_by_marker_and_reminder() -> None:
    custom = ("CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\nWrite <summary></summary> of our work."
              "\nREMINDER: Do NOT call any tools. Respond with plain text only \u2014 a <summary> block.")
    found = recognise("messages", claude_request([{"type": "text", "text": custom}]))
    assert found == CompactionRequest(kind="claude_code", index=2, block=0, analysis=False)


@pytest.mark.parametrize("last_user", [
    pytest.param([{**TOOL_RESULT, "content": claude_prompt()}], id="tool-result-string"),
    pytest.param([{**TOOL_RESULT, "content": [{"type": "text", "text": claude_prompt()}]}], id="tool-result-blocks"),
    pytest.param([{"type": "text", "text": "Here is notes.md:\n" + claude_prompt()}], id="quoted-mid-text"),
    pytest.param([{"type": "text", "text": "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools. List them."}],
                 id="marker-alone"),
])
def test_claude_code_quoted_phrases_are_not_a_request(last_user: list[dict[str, Any]]) -> None:
    assert recognise("messages", claude_request(last_user)) is None


def test_claude_code_request_in_an_earlier_message_does_not_count() -> None:
    payload = claude_request([{"type": "text", "text": claude_prompt()}], trailing_system=False)
    payload["messages"] += [{"role": "assistant", "content": [{"type": "text", "text": "<summary>x</summary>"}]},
                            {"role": "user", "content": "Thanks, carry on."}]
    assert recognise("messages", payload) is None
    payload["messages"].pop()
    assert recognise("messages", payload) is None  # the last turn is the assistant's


# -- Codex requests ---------------------------------------------------------------------------------------


def test_codex_local_compaction_is_the_trailing_prompt() -> None:
    payload = codex_request(user(CODEX_PROMPT))
    found = recognise("responses", payload)
    assert found == CompactionRequest(kind="codex_local", index=6)
    assert found.conversation(payload["input"]) == payload["input"][:6]


def test_codex_custom_compact_prompt_needs_the_turn_metadata() -> None:
    custom = user("Summarise for a teammate; list open TODOs.")
    metadata = orjson.dumps({"request_kind": "compaction", "compaction": {"implementation": "responses"}}).decode()
    expected = CompactionRequest(kind="codex_local", index=6,
                                 instructions="Summarise for a teammate; list open TODOs.")
    in_body = codex_request(custom, client_metadata={"x-codex-turn-metadata": metadata})
    assert recognise("responses", in_body) == expected
    assert recognise("responses", codex_request(custom), turn_metadata=metadata) == expected
    assert recognise("responses", codex_request(custom)) is None
    turn = orjson.dumps({"request_kind": "turn"}).decode()
    assert recognise("responses", codex_request(custom), turn_metadata=turn) is None


def test_codex_remote_trigger_ends_the_input() -> None:
    payload = codex_request({"type": "compaction_trigger"})
    found = recognise("responses", payload)
    assert found == CompactionRequest(kind="codex_trigger", index=6)
    assert found.conversation(payload["input"]) == payload["input"][:6]
    assert recognise("responses", codex_request({"type": "compaction_trigger"}, user("go on"))) is None


def test_codex_endpoint_summarises_the_whole_input() -> None:
    items = codex_request()["input"]
    assert CODEX_ENDPOINT.conversation(items) == items and CODEX_ENDPOINT.kind == "codex_endpoint"


@pytest.mark.parametrize("payload", [
    pytest.param(codex_request({"type": "function_call_output", "call_id": "c", "output": CODEX_PROMPT}),
                 id="prompt-in-tool-output"),
    pytest.param(codex_request(user(CODEX_PROMPT), user("Never mind, continue.")), id="prompt-earlier"),
    pytest.param({"model": "m", "input": CODEX_PROMPT}, id="input-string"),
    pytest.param({"model": "m", "input": []}, id="input-empty"),
])
def test_codex_non_requests(payload: dict[str, Any]) -> None:
    assert recognise("responses", payload) is None


def test_chat_requests_are_never_client_compactions() -> None:
    assert recognise("chat", {"messages": [{"role": "user", "content": claude_prompt()}]}) is None


# -- boundaries on later requests -------------------------------------------------------------------------------


def claude_continuation(summary: str, *, lead: str = "") -> dict[str, Any]:
    """Claude Code's first message after a compaction, as 2.1.332 writes it."""
    text = (f"{lead}{CLAUDE_CONTINUATION}\n<system-reminder>\n</system-reminder>\nSummary:\n{summary}\n"
            "If you need specific details from before compaction (like exact code snippets, error messages, or "
            "content you generated), read the full transcript at: /root/.claude/projects/p/s.jsonl")
    return {"role": "user", "content": [{"type": "text", "text": text}]}


SUMMARY = "1. Primary Request and Intent:\n   Make tests/test_parse.py pass.\n9. Optional Next Step:\n   Run pytest."


@pytest.mark.parametrize("lead", ["", "<artifact-content-authored-by-others/>\n"], ids=["plain", "marker-line"])
def test_claude_code_boundary_gives_the_clients_summary(lead: str) -> None:
    messages = [claude_continuation(SUMMARY, lead=lead), {"role": "user", "content": "Go on."}]
    assert claude_code_summary(messages[0]) == SUMMARY
    boundary = find_boundary("messages", messages)
    assert boundary is not None and (boundary.client, boundary.index, boundary.summary) == ("claude_code", 0, SUMMARY)
    assert find_boundary("messages", messages, start=1) is None


def test_claude_code_continuation_inside_a_tool_result_is_no_boundary() -> None:
    quoted = {"role": "user", "content": [{**TOOL_RESULT, "content": claude_continuation(SUMMARY)["content"]}]}
    assert claude_code_summary(quoted) is None
    assert claude_code_summary({"role": "assistant", "content": claude_continuation(SUMMARY)["content"]}) is None


@pytest.mark.parametrize("prefix", [CODEX_PREFIX, CODEX_PREFIX.replace("summary to assist", "summary to  assist")],
                         ids=["single-space", "double-space"])
def test_codex_boundary_follows_the_retained_user_messages(prefix: str) -> None:
    items = [user("Add a --dry-run flag."), user("Also update the README."), user(f"{prefix}\n## Goal\nShip it"),
             user("Continue.")]
    assert codex_summary(items[2]) == "## Goal\nShip it"
    boundary = find_boundary("responses", items)
    assert boundary is not None
    assert (boundary.client, boundary.index, boundary.summary) == ("codex", 2, "## Goal\nShip it")
    assert codex_summary({"type": "function_call_output", "call_id": "c", "output": f"{prefix}\nx"}) is None
    assert find_boundary("chat", items) is None


def test_compaction_items_carried_back_are_found_with_their_reference() -> None:
    items = [user("hi"), {"type": "compaction", "encrypted_content": "ctxproxy.v1.a.b"},
             {"type": "compaction_summary", "encrypted_content": "ctxproxy.v1.c.d"}, {"type": "compaction"}]
    assert compaction_references(items) == [(1, "ctxproxy.v1.a.b"), (2, "ctxproxy.v1.c.d"), (3, "")]
    assert compaction_references(items, start=2) == [(2, "ctxproxy.v1.c.d"), (3, "")]
    assert compaction_reference(user("ctxproxy.v1.a.b")) is None


# -- answers -------------------------------------------------------------------------------------------------

ENV = Envelope(model="m-1", input_tokens=1200, output_tokens=80, response_id="resp_1", item_id="msg_1",
               created_at=1_700_000_000)


def events(body: bytes) -> list[tuple[str, Any]]:
    splitter = SSESplitter()
    parsed = [parse_event(raw) for raw in [*splitter.feed(body), splitter.flush()] if raw]
    return [(event.event, event.json()) for event in parsed if event is not None]


def claude_keeps(text: str) -> str:
    """What Claude Code keeps of the answer: the analysis block dropped, the first ``<summary>`` up to the first
    ``</summary>`` after it."""
    start, end = text.find("<analysis>"), text.find("</analysis>")
    if start != -1 and end != -1 and "<summary>" not in text[:start]:
        text = text[:start] + text[end + len("</analysis>"):]
    open_at = text.find("<summary>") + len("<summary>")
    return text[open_at : text.find("</summary>", open_at)].strip()


def test_claude_code_text_is_analysis_then_summary() -> None:
    assert claude_code_text("S1\nS2") == (
        "<analysis>\nThis conversation was summarised by ctxproxy from its checkpoint; the summary follows.\n"
        "</analysis>\n\n<summary>\nS1\nS2\n</summary>")
    assert claude_code_text("S", analysis=False) == "<summary>\nS\n</summary>"
    tricky = "Edited render(): it now closes </summary> tags."
    assert claude_keeps(claude_code_text(tricky)) == "Edited render(): it now closes &lt;/summary&gt; tags."


def test_claude_code_answer_as_a_body() -> None:
    answer = render(CompactionRequest("claude_code", 2, 1), ENV, stream=False, summary=SUMMARY)
    assert answer.content_type == "application/json"
    assert answer.items == [{"role": "assistant", "content": [{"type": "text", "text": claude_code_text(SUMMARY)}]}]
    assert orjson.loads(answer.body) == {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m-1",
        "content": [{"type": "text", "text": claude_code_text(SUMMARY)}], "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1200, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                  "output_tokens": 80},
    }


def test_claude_code_answer_as_a_stream() -> None:
    answer = render(CompactionRequest("claude_code", 2, 1, analysis=False), ENV, stream=True, summary=SUMMARY)
    assert answer.content_type == "text/event-stream"
    assert answer.items == [{"role": "assistant", "content": [
        {"type": "text", "text": f"<summary>\n{SUMMARY}\n</summary>"}]}]
    got = events(answer.body)
    assert [name for name, _ in got] == ["message_start", "content_block_start", "content_block_delta",
                                         "content_block_stop", "message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in got)
    assert got[0][1]["message"] == {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m-1", "content": [], "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1200, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                  "output_tokens": 0},
    }
    assert got[1][1]["content_block"] == {"type": "text", "text": ""}
    assert got[2][1]["delta"] == {"type": "text_delta", "text": f"<summary>\n{SUMMARY}\n</summary>"}
    assert got[4][1] == {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                         "usage": {"output_tokens": 80}}
    assert claude_keeps(got[2][1]["delta"]["text"]) == SUMMARY


def completed_items(stream: list[tuple[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What Codex takes from a stream: the items of ``output_item.done``, and ``response.completed``."""
    done = [data["item"] for name, data in stream if name == "response.output_item.done"]
    (completed,) = [data["response"] for name, data in stream if name == "response.completed"]
    assert stream[-1][0] == "response.completed"
    return done, completed


USAGE = {"input_tokens": 1200, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 80,
         "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 1280}
MESSAGE = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": SUMMARY, "annotations": []}]}


def test_codex_local_answer_is_one_assistant_message() -> None:
    request = CompactionRequest("codex_local", 6)
    answer = render(request, ENV, stream=False, summary=f"\n{SUMMARY}\n")
    assert answer.items == [MESSAGE]
    body = orjson.loads(answer.body)
    assert body == {"id": "resp_1", "object": "response", "created_at": 1_700_000_000, "status": "completed",
                    "model": "m-1", "output": [MESSAGE], "usage": USAGE}
    stream = events(render(request, ENV, stream=True, summary=SUMMARY).body)
    assert [name for name, _ in stream] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [data["sequence_number"] for _, data in stream] == list(range(9))
    assert stream[0][1]["response"]["status"] == "in_progress" and stream[0][1]["response"]["output"] == []
    assert stream[4][1] == {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
                            "content_index": 0, "delta": SUMMARY, "sequence_number": 4}
    done, completed = completed_items(stream)
    assert done == [MESSAGE] and completed == body


def test_codex_trigger_answer_streams_exactly_one_compaction_item() -> None:
    request = CompactionRequest("codex_trigger", 6)
    answer = render(request, ENV, stream=True, reference="ctxproxy.v1.p.m")
    item = {"type": "compaction", "encrypted_content": "ctxproxy.v1.p.m"}
    assert answer.items == [item]
    stream = events(answer.body)
    assert [name for name, _ in stream] == ["response.created", "response.in_progress", "response.output_item.added",
                                            "response.output_item.done", "response.completed"]
    done, completed = completed_items(stream)
    assert done == [item]
    assert completed == {"id": "resp_1", "object": "response", "created_at": 1_700_000_000, "status": "completed",
                         "model": "m-1", "output": [item], "usage": USAGE}
    body = orjson.loads(render(request, ENV, stream=False, reference="ctxproxy.v1.p.m").body)
    assert body == completed


def test_codex_endpoint_answer_is_output_with_one_compaction_item() -> None:
    for stream in (False, True):
        answer = render(CODEX_ENDPOINT, ENV, stream=stream, reference="ctxproxy.v1.p.m")
        assert answer.content_type == "application/json"
        assert answer.items == [{"type": "compaction", "encrypted_content": "ctxproxy.v1.p.m"}]
        assert orjson.loads(answer.body) == {
            "id": "resp_1", "object": "response.compaction", "created_at": 1_700_000_000,
            "output": [{"type": "compaction", "encrypted_content": "ctxproxy.v1.p.m"}], "usage": USAGE}


def test_an_answer_needs_its_content() -> None:
    with pytest.raises(ValueError, match="summary"):
        render(CompactionRequest("claude_code", 0), ENV, stream=False, reference="r")
    with pytest.raises(ValueError, match="reference"):
        render(CODEX_ENDPOINT, ENV, stream=False, summary="s")


def test_fresh_envelopes_differ() -> None:
    first, second = Envelope.new("m", 1, 2), Envelope.new("m", 1, 2)
    assert first.response_id != second.response_id and first.item_id != second.item_id
    assert first.response_id.startswith("resp_") and first.item_id.startswith("msg_")
