"""Each dialect's answers to the engine, and its reply readers, on shapes from the public API references."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.context.compactor import plan_retain_start
from proxy.context.items import cut_points
from proxy.dialects import CHAT, GEMINI, MESSAGES, RESPONSES
from proxy.dialects.base import Verdict
from proxy.errors import BadRequest

# -- Responses API --------------------------------------------------------------------------------

CODEX_INPUT: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "perms"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the bug"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA1"},
    {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"command":["ls"]}'},
    {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": '{"command":["pwd"]}'},
    {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
    {"type": "function_call_output", "call_id": "c2", "output": "/w"},
    {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "think"}],
     "encrypted_content": "gAAAA2"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
]


def test_responses_cut_points_keep_reasoning_with_its_item_and_calls_with_outputs() -> None:
    # Not before an output, not between a reasoning item and its item, not inside the parallel call pair.
    assert cut_points(RESPONSES, CODEX_INPUT) == [0, 1, 2, 7, 9]


def test_responses_roles_and_pairing() -> None:
    roles = [RESPONSES.role(item) for item in CODEX_INPUT]
    assert roles == ["system", "user", "assistant", "assistant", "assistant", "tool", "tool", "assistant",
                     "assistant", "user"]
    assert RESPONSES.calls(CODEX_INPUT[3]) == ("c1",)
    assert RESPONSES.results(CODEX_INPUT[6]) == ("c2",)
    assert RESPONSES.travels_with_next(CODEX_INPUT[2]) and not RESPONSES.travels_with_next(CODEX_INPUT[3])


def test_responses_identity_survives_echo_cosmetics() -> None:
    sent = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": "done", "annotations": []}]}
    echoed = {"role": "assistant", "content": "done"}
    # Ids, status, annotations, the part type and string-vs-parts content are echo cosmetics; the text is not.
    assert RESPONSES.hash(sent) == RESPONSES.hash(echoed)
    assert RESPONSES.hash(sent) != RESPONSES.hash({"role": "assistant", "content": "done!"})
    call = {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "c1", "name": "shell",
            "arguments": '{"a": 1, "b": 2}'}
    assert RESPONSES.hash(call) == RESPONSES.hash({**call, "id": "other", "arguments": '{"b":2,"a":1}'})
    assert RESPONSES.hash(call) != CHAT.hash(call)


def test_responses_input_may_be_a_string_and_must_not_be_empty() -> None:
    assert RESPONSES.parse(b'{"model": "m", "input": "hi"}').items == [{"role": "user", "content": "hi"}]
    with pytest.raises(BadRequest):
        RESPONSES.parse(b'{"model": "m", "input": []}')


def test_responses_summary_is_folded_into_a_user_item() -> None:
    folded = RESPONSES.with_summary(CODEX_INPUT[9], "SUMMARY")
    assert folded["content"] == [{"type": "input_text", "text": "SUMMARY"}, {"type": "input_text", "text": "thanks"}]
    assert CODEX_INPUT[9]["content"] == [{"type": "input_text", "text": "thanks"}]  # the input is untouched


def _responses_stream() -> list[dict[str, Any]]:
    reasoning = {"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "ENC"}
    call = {"type": "function_call", "id": "fc_9", "call_id": "c9", "name": "shell", "arguments": '{"x":1}'}
    usage = {"input_tokens": 900, "input_tokens_details": {"cached_tokens": 512}, "output_tokens": 20}
    return [
        {"type": "response.created", "response": {"status": "in_progress", "output": []}},
        {"type": "response.in_progress", "response": {"status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**reasoning, "encrypted_content": None}},
        {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
        {"type": "response.output_item.added", "output_index": 1, "item": {**call, "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '{"x":1}'},
        {"type": "response.output_item.done", "output_index": 1, "item": call},
        {"type": "response.completed", "response": {"status": "completed", "output": [], "usage": usage}},
    ]


def test_responses_reader_assembles_final_items_and_usage() -> None:
    reader = RESPONSES.reader()
    events = _responses_stream()
    verdicts = [reader.feed("", event) for event in events]
    assert verdicts == [Verdict.RELAY] * 7 + [Verdict.TERMINAL]
    assert reader.items() == [events[3]["item"], events[6]["item"]]
    assert reader.finished and reader.received
    assert reader.usage is not None
    assert (RESPONSES.prompt_tokens(reader.usage), RESPONSES.cached_tokens(reader.usage)) == (900, 512)
    assert [RESPONSES.commits(e) for e in events[:3]] == [False, False, True]


def test_responses_failed_event_is_classified_by_its_inner_error() -> None:
    failed = {"type": "response.failed", "response": {"status": "failed", "error": {
        "code": "context_length_exceeded", "message": "Your input exceeds the context window of this model."}}}
    assert RESPONSES.refusal_of(failed) == failed["response"]
    assert not RESPONSES.commits(failed)


# -- Anthropic Messages ---------------------------------------------------------------------------

CLAUDE_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
    {"role": "system", "content": "Today's date is 2026-11-30."},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hm", "signature": "SIG1"},
        {"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "ls"}},
        {"type": "tool_use", "id": "tu2", "name": "Bash", "input": {"command": "pwd"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "tu1", "content": "a.py"},
        {"type": "tool_result", "tool_use_id": "tu2", "content": [{"type": "text", "text": "/w"}],
         "cache_control": {"type": "ephemeral"}}]},
    {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
    {"role": "user", "content": "thanks"},
]


def test_messages_roles_pairing_and_cut_points() -> None:
    assert [MESSAGES.role(m) for m in CLAUDE_MESSAGES] == ["user", "system", "assistant", "tool", "assistant", "user"]
    assert MESSAGES.calls(CLAUDE_MESSAGES[2]) == ("tu1", "tu2")
    assert MESSAGES.results(CLAUDE_MESSAGES[3]) == ("tu1", "tu2")
    # Not before the tool results, nor before the system entry: it belongs with the user turn it follows.
    assert cut_points(MESSAGES, CLAUDE_MESSAGES) == [0, 2, 4, 5]


def test_a_trailing_system_entry_stays_with_the_last_step_in_the_smallest_tail() -> None:
    """Claude Code's nudge after silent tool steps ends the request; the tail must still hold the last step."""
    nudge = {"role": "system", "content": "The user hasn't heard from you in a while."}
    messages = [*CLAUDE_MESSAGES[:4], nudge]
    assert cut_points(MESSAGES, messages) == [0, 2]
    assert plan_retain_start(MESSAGES, messages, [10] * len(messages), 1, retain_budget=1) == 2


def test_messages_identity_ignores_moved_cache_breakpoints_and_string_content() -> None:
    moved = [dict(CLAUDE_MESSAGES[3], content=[
        {"type": "tool_result", "tool_use_id": "tu1", "content": "a.py", "cache_control": {"type": "ephemeral"}},
        {"type": "tool_result", "tool_use_id": "tu2", "content": "/w"}])]
    assert MESSAGES.hash(moved[0]) == MESSAGES.hash(CLAUDE_MESSAGES[3])
    assert MESSAGES.hash({"role": "user", "content": "thanks"}) == MESSAGES.hash(
        {"role": "user", "content": [{"type": "text", "text": "thanks", "cache_control": {"type": "ephemeral"}}]})
    changed = {**CLAUDE_MESSAGES[2], "content": [{**CLAUDE_MESSAGES[2]["content"][0], "signature": "SIG2"},
                                                  *CLAUDE_MESSAGES[2]["content"][1:]]}
    assert MESSAGES.hash(changed) != MESSAGES.hash(CLAUDE_MESSAGES[2])


def test_messages_text_counts_every_block_kind() -> None:
    assert MESSAGES.text(CLAUDE_MESSAGES[2]) == ('hm\nBash {"command":"ls"}\nBash {"command":"pwd"}', 0)
    assert MESSAGES.text(CLAUDE_MESSAGES[3]) == ("a.py\n/w", 0)
    image = {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "AAAA"}}]}
    assert MESSAGES.text(image) == ("", 1)


def _sse_messages_events() -> list[dict[str, Any]]:
    return [
        {"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": [], "usage": {
            "input_tokens": 10, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 30,
            "output_tokens": 1}}},
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "",
                                                                      "signature": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "let me "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "see"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "SIGX"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "tu9",
                                                                      "name": "Bash", "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"comm'}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta",
                                                              "partial_json": 'and": "ls"}'}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 40}},
        {"type": "message_stop"},
    ]


def test_messages_reader_rebuilds_thinking_signature_and_tool_input() -> None:
    reader = MESSAGES.reader()
    events = _sse_messages_events()
    verdicts = [reader.feed(e["type"], e) for e in events]
    assert verdicts[-1] is Verdict.TERMINAL and set(verdicts[:-1]) == {Verdict.RELAY}
    assert reader.items() == [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "let me see", "signature": "SIGX"},
        {"type": "tool_use", "id": "tu9", "name": "Bash", "input": {"command": "ls"}}]}]
    assert reader.finished
    assert reader.usage is not None
    assert MESSAGES.prompt_tokens(reader.usage) == 2040
    assert MESSAGES.cached_tokens(reader.usage) == 2000
    assert [MESSAGES.commits(e) for e in events[:3]] == [False, False, True]


def test_messages_summary_call_shape_and_answer() -> None:
    payload = MESSAGES.summary_payload("claude-x", "SYS", "USER", 4096)
    assert payload == {"model": "claude-x", "system": "SYS", "max_tokens": 4096, "stream": False,
                       "messages": [{"role": "user", "content": "USER"}]}
    assert MESSAGES.summary_answer({"content": [{"type": "text", "text": "S"}], "stop_reason": "end_turn"}) == (
        "S", True, "end_turn")
    assert MESSAGES.summary_answer({"content": [{"type": "text", "text": "S"}], "stop_reason": "max_tokens"}) == (
        "S", False, "max_tokens")


# -- Chat Completions ---------------------------------------------------------------------------------


def test_chat_cut_points_and_summary_fold() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "assistant", "content": "ok"},
    ]
    assert cut_points(CHAT, messages) == [0, 1, 2, 5]
    assert CHAT.with_summary(messages[1], "S: ") == {"role": "user", "content": "S: u"}  # the lead as given
    assert CHAT.with_summary(None, "S") == {"role": "user", "content": "S"}


def test_chat_summary_payload_names_the_output_bound_per_model_family() -> None:
    assert "max_completion_tokens" in CHAT.summary_payload("o3-mini", "s", "u", 10)
    assert "max_tokens" in CHAT.summary_payload("openrouter/meta/llama-3", "s", "u", 10)


def test_renders_the_payload_with_the_view_in_place() -> None:
    request = MESSAGES.parse(orjson.dumps({"model": "m", "system": [{"type": "text", "text": "S"}],
                                           "messages": CLAUDE_MESSAGES, "max_tokens": 5}))
    body = orjson.loads(MESSAGES.render(request, CLAUDE_MESSAGES[4:]))
    assert body == {"model": "m", "system": [{"type": "text", "text": "S"}], "messages": CLAUDE_MESSAGES[4:],
                    "max_tokens": 5}


def test_session_hints_from_the_body() -> None:
    assert RESPONSES.session_hint({"prompt_cache_key": "019a-thread"}) == "019a-thread"
    user_id = orjson.dumps({"device_id": "d", "account_uuid": "", "session_id": "5f1c-cc"}).decode()
    assert MESSAGES.session_hint({"metadata": {"user_id": user_id}}) == "5f1c-cc"
    assert MESSAGES.session_hint({"metadata": {"user_id": "user_abc"}}) is None
    assert MESSAGES.session_hint({"metadata": {"user_id": "[1]"}}) is None
    assert CHAT.session_hint({"prompt_cache_key": "x"}) is None


SCHEMA = {"type": "object", "properties": {"verdict": {"type": "string"}}}


@pytest.mark.parametrize(("dialect", "prompt", "options"), [
    (CHAT, {"functions": [{"name": "f", "parameters": SCHEMA}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}}},
     {"temperature": 0.2, "stream": True}),
    (MESSAGES, {"system": [{"type": "text", "text": "You are Claude Code."}],
                "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}},
     {"max_tokens": 5, "metadata": {"user_id": "u"}, "thinking": {"type": "adaptive"}}),
    (RESPONSES, {"instructions": "You are Codex.", "text": {"format": {"type": "json_schema", "schema": SCHEMA}},
                 "prompt": {"id": "pmpt_1", "variables": {"city": "Paris"}}},
     {"reasoning": {"effort": "high"}, "prompt_cache_key": "k", "include": ["reasoning.encrypted_content"]}),
    (GEMINI, {"systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]},
              "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
              "generationConfig": {"responseJsonSchema": SCHEMA}}, {"cachedContent": "cachedContents/1"}),
], ids=["chat", "messages", "responses", "gemini"])
def test_the_fixed_part_is_the_tools_and_every_field_the_model_reads_as_prompt(
        dialect: Any, prompt: dict[str, Any], options: dict[str, Any]) -> None:
    """Issue 35: each door counts what the model reads of a request besides its items in every estimate: a system
    prompt that is not an item, a structured answer's schema; not the options beside them."""
    tools = [{"name": "t"}]
    body = {"model": "m", dialect.items_field: [{"role": "user", "content": "hi", "parts": [{"text": "hi"}]}],
            "tools": tools, **prompt, **options}
    request = dialect.parse(orjson.dumps(body), {"model": "m"})
    assert request.fixed == [*tools, *prompt.values()]
    bare = dialect.parse(orjson.dumps({**body, "tools": None, **dict.fromkeys(prompt, "")}), {"model": "m"})
    assert bare.fixed is None


@pytest.mark.parametrize(("dialect", "body", "param"), [
    (CHAT, {"messages": [{"content": "no role"}]}, "messages[0]"),
    (CHAT, {"messages": [{"role": "assistant", "tool_calls": {"id": "x"}}]}, "messages[0].tool_calls"),
    (MESSAGES, {"messages": [{"role": "user", "content": "a"}, {"content": "b"}]}, "messages[1]"),
    (MESSAGES, {"messages": [{"role": "user", "content": {"type": "text"}}]}, "messages[0].content"),
    (RESPONSES, {"input": [{"type": "message"}, "not an object"]}, "input[1]"),
], ids=["chat-role", "chat-tool-calls", "messages-role", "messages-content", "responses-item"])
def test_malformed_items_are_a_400_naming_the_item(dialect: Any, body: dict[str, Any], param: str) -> None:
    """Parsing refuses what is no object; the rest, as the front door does, as each item is hashed."""
    with pytest.raises(BadRequest) as refused:
        items = dialect.parse(orjson.dumps({"model": "m", **body})).items
        for item in items:
            dialect.checked_hash(item, items)
    assert (refused.value.status, refused.value.param) == (400, param)
