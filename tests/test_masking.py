"""Tier 1, masking: placeholders in each API's shape, what is masked, and the checkpoint that masks."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.context.checkpoint import Checkpoint, masking_checkpoint, prefix_hash
from proxy.context.keep.userwords import HEADING
from proxy.context.log.lineage import ConversationState
from proxy.context.view.budget import ContextBudgetPolicy
from proxy.context.view.masking import KEPT_ERRORS, Masker, arguments_digest, mask_end
from proxy.context.view.projection import SUMMARY_HEADER, FrozenEnds, ProjectionBuilder
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT, MESSAGES, RESPONSES
from proxy.store.base import StoredFact

COUNTER = TokenCounter()
LOG = "\n".join(f"line {i}: test_parser.py::test_case_{i} PASSED" for i in range(312))
TOKENS = COUNTER.text_tokens(LOG)


def placeholder(where: str = "log entry 57", hint: str = "re-run the tool if you need it again") -> str:
    return f'[output of run {{"cmd":"pytest -x"}} elided: 312 lines, {TOKENS:,} tokens; {where}; {hint}]'


CHAT_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_9", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "pytest -x"}'}}]}
CHAT_RESULT = {"role": "tool", "tool_call_id": "call_9", "content": LOG}


def test_a_chat_output_becomes_a_placeholder_naming_its_call_size_and_entry() -> None:
    masked = Masker(COUNTER).item(CHAT, [CHAT_CALL, CHAT_RESULT], 1, [56, 57], ["p0", "p1"])
    assert masked == {"role": "tool", "tool_call_id": "call_9", "content": placeholder()}


def test_a_masked_output_that_failed_keeps_its_error_lines_verbatim_after_the_placeholder() -> None:
    failing = LOG + "\nE   AssertionError: expected 3, got 4\nFAILED tests/test_a.py::test_sum\nExit code: 1"
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "shell", "arguments": '{"command": "pytest -x"}'}}]}
    masked = Masker(COUNTER).item(CHAT, [call, {"role": "tool", "tool_call_id": "call_9", "content": failing}],
                                  1, [56, 57], ["p0", "p1"])
    head, kept = masked["content"].split("\n", 1)
    assert head.startswith('[output of shell {"command":"pytest -x"} elided: ') and head.endswith("again]")
    assert kept.splitlines() == ["Its error lines, verbatim:", "Exit code: 1", "E   AssertionError: expected 3, got 4",
                                 "FAILED tests/test_a.py::test_sum"]


def test_a_field_its_client_prints_empty_is_no_error_line() -> None:
    """Gemini CLI's shell answers a failed command with every field, an empty one as ``(none)``."""
    failing = ("Command: npm test\nDirectory: (root)\nOutput: " + LOG + "\nnpm ERR! Test failed.\nError: (none)\n"
               "Exit Code: 1\nSignal: (none)\nBackground PIDs: (none)\nProcess Group PGID: 4242")
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "run_shell_command",
                                                          "arguments": '{"command": "npm test"}'}}]}
    masked = Masker(COUNTER).item(CHAT, [call, {"role": "tool", "tool_call_id": "call_9", "content": failing}],
                                  1, [56, 57], ["p0", "p1"])
    assert masked["content"].split("\n", 1)[1].splitlines() == [
        "Its error lines, verbatim:", "Exit Code: 1", "npm ERR! Test failed."]


def test_with_the_recall_tool_the_placeholder_names_it() -> None:
    masked = Masker(COUNTER, recall=True).item(CHAT, [CHAT_CALL, CHAT_RESULT], 1, [56, 57], ["p0", "p1"])
    assert masked["content"] == placeholder(hint="call ctxproxy_recall with entry 57 to read it again")


def test_before_it_is_logged_an_output_is_named_by_its_index_and_recall_is_not_offered() -> None:
    masked = Masker(COUNTER, recall=True).item(CHAT, [CHAT_CALL, CHAT_RESULT], 1, [56], ["p0"])
    assert masked["content"] == placeholder(where="message index 1")


def test_a_responses_output_keeps_its_item_and_call_id() -> None:
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "run", "arguments": '{"cmd":"pytest -x"}'}
    output = {"type": "function_call_output", "id": "fco_1", "call_id": "c1", "output": [
        {"type": "input_text", "text": LOG}]}
    masked = Masker(COUNTER).item(RESPONSES, [call, output], 1, [56, 57], ["p0", "p1"])
    assert masked == {"type": "function_call_output", "id": "fco_1", "call_id": "c1", "output": placeholder()}


@pytest.mark.parametrize(("dialect", "call", "output"), [
    (CHAT, CHAT_CALL, {"role": "tool", "tool_call_id": "call_9"}),
    (RESPONSES, {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "c1"}),
], ids=["chat", "responses"])
def test_an_output_item_without_its_output_has_nothing_to_mask(dialect: Any, call: Any, output: Any) -> None:
    """A tool message without ``content`` (the fuzzer found one: a 500 from the masker) holds no output: nothing
    to mask, clip or recall, and nothing counted as freed."""
    assert dialect.result_paths(output) == []
    messages = [call, output]
    masker = Masker(COUNTER)
    assert masker.item(dialect, messages, 1, [56, 57], ["p0", "p1"]) is output  # left as it is
    count = ContextBudgetPolicy().counter_for(dialect)
    assert masker.freed(dialect, messages, [dialect.hash(m) for m in messages], 0, 2, [56, 57], ["p0", "p1"],
                        count) == 0


def test_a_screenshot_output_is_left_alone() -> None:
    call = {"type": "computer_call", "call_id": "c1", "action": {"type": "screenshot"}}
    output = {"type": "computer_call_output", "call_id": "c1", "output": {"type": "computer_screenshot",
                                                                         "image_url": "data:image/png;base64," + LOG}}
    messages = [call, output]
    assert Masker(COUNTER).item(RESPONSES, messages, 1, [0, 1], ["p0", "p1"]) is output


def test_an_anthropic_result_block_keeps_its_id_flags_and_breakpoint_and_the_user_text_beside_it() -> None:
    call = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "t", "signature": "sig"},
        {"type": "tool_use", "id": "toolu_1", "name": "run", "input": {"cmd": "pytest -x"}},
        {"type": "tool_use", "id": "toolu_2", "name": "ls", "input": {}}]}
    result = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True, "content": [{"type": "text", "text": LOG}],
         "cache_control": {"type": "ephemeral"}},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "a.py"},
        {"type": "text", "text": "stop, use tabs"}]}
    masked = Masker(COUNTER).item(MESSAGES, [call, result], 1, [56, 57], ["p0", "p1"])
    # Flagged a failure whose output marks no line: its first line is kept as the error (errorlines.error_lines).
    kept = placeholder() + "\n".join([KEPT_ERRORS, "line 0: test_parser.py::test_case_0 PASSED"])
    assert masked == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True, "content": kept,
         "cache_control": {"type": "ephemeral"}},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "a.py"},  # smaller than a placeholder: kept
        {"type": "text", "text": "stop, use tabs"}]}
    assert MESSAGES.results(masked) == MESSAGES.results(result), "pairing unchanged"
    assert MESSAGES.user_text(result) == "stop, use tabs", "the user's words beside tool results, not the results"


def test_a_small_output_is_not_masked_and_a_built_item_is_reused() -> None:
    small = {"role": "tool", "tool_call_id": "call_9", "content": "ok"}
    masker = Masker(COUNTER)
    assert masker.item(CHAT, [CHAT_CALL, small], 1, [0, 1], ["p0", "p1"]) is small
    first = masker.item(CHAT, [CHAT_CALL, CHAT_RESULT], 1, [56, 57], ["p0", "q1"])
    again = masker.item(CHAT, [dict(CHAT_CALL), dict(CHAT_RESULT)], 1, [56, 57], ["p0", "q1"])
    assert again is first and masker.digests[id(first)] == CHAT.hash(first)


@pytest.mark.parametrize(("arguments", "digest"), [
    ('{"cmd":  "pytest -x"}', '{"cmd":"pytest -x"}'),
    ({"path": "a b\n  c"}, '{"path":"a b\\n c"}'),
    ("not json   at all", "not json at all"),
    ('{"x": "' + "y" * 200 + '"}', '{"x":"' + "y" * 73 + "…"),
])
def test_arguments_digest(arguments: Any, digest: str) -> None:
    assert arguments_digest(arguments) == digest


def chat_steps(steps: int, start: int = 0) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for n in range(start, start + steps):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": "run", "arguments": f'{{"n": {n}}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": f"output {n}\n" + LOG})
    return messages


CONVERSATION = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go"}, *chat_steps(14)]


def test_mask_end_keeps_the_last_outputs() -> None:
    assert mask_end(CHAT, CONVERSATION, 2, 10) == 2 + 2 * 4 + 1  # the 10th last output is the 5th of 14
    assert mask_end(CHAT, CONVERSATION, 2, 1) == len(CONVERSATION) - 1
    assert mask_end(CHAT, CONVERSATION, 2, 15) == 2, "fewer outputs than kept: nothing to mask"


def test_a_masking_checkpoint_shows_no_summary_and_masks_only_its_region() -> None:
    hashes = [CHAT.hash(m) for m in CONVERSATION]
    checkpoint = masking_checkpoint(None, 11, hashes, system_end=1, model="m", created_at=1.0)
    assert (checkpoint.summary, checkpoint.retain_start_idx, checkpoint.masked_until, checkpoint.covers) == ("", 1, 11,
                                                                                                             11)
    assert checkpoint.prefix_hash == prefix_hash(hashes, 11)
    seqs = list(range(100, 100 + len(CONVERSATION)))
    view = ProjectionBuilder(CHAT).build(CONVERSATION, checkpoint, seqs=seqs, keys=hashes)
    assert len(view) == len(CONVERSATION)
    assert view[:3] == CONVERSATION[:3] and view[11:] == CONVERSATION[11:], "no summary item; the rest verbatim"
    for index in (3, 5, 7, 9):
        assert view[index]["content"].startswith(f'[output of run {{"n":{(index - 3) // 2}}} elided: 313 lines, ')
        assert view[index]["content"].endswith(f"; log entry {100 + index}; re-run the tool if you need it again]")
    assert view[4] is CONVERSATION[4] and view[10] is CONVERSATION[10], "calls pass through as the client's objects"


def test_a_later_summary_keeps_masking_and_a_masking_checkpoint_keeps_the_summary() -> None:
    hashes = [CHAT.hash(m) for m in CONVERSATION]
    summarised = Checkpoint("S", 4, prefix_hash(hashes, 4), None, 0, 0, "m", 0.0,
                            user_words=((1, 1, 1, "go", 1),))
    masked = masking_checkpoint(summarised, 9, hashes, system_end=1, model="other", created_at=2.0)
    assert (masked.summary, masked.retain_start_idx, masked.user_words, masked.model) == ("S", 4, summarised.user_words,
                                                                                          "m")
    assert masked.covers == 9 and masked.masks and masked.view_key != summarised.view_key
    view = ProjectionBuilder(CHAT).build(CONVERSATION, masked, seqs=range(len(CONVERSATION)), keys=hashes)
    assert view[1] == {"role": "user", "content": f"{SUMMARY_HEADER}\n\nS\n\n{HEADING}\n\n[log entry 1]\ngo"}
    outputs = [m["content"].startswith("[output of") for m in view[2:] if m["role"] == "tool"]
    assert outputs[:3] == [True, True, False], "indices 5 and 7 are masked, 9 is not"


def state_of(hashes: list[str]) -> ConversationState:
    state = ConversationState()
    for seq, digest in enumerate(hashes):
        state.apply(StoredFact(id=str(seq), seq=seq, kind="message", index=seq, source="client", message={}, ts=0.0,
                               hash=digest, extra={}))
    return state


def test_a_masking_checkpoint_serves_only_conversations_holding_all_it_masks() -> None:
    hashes = [CHAT.hash(m) for m in CONVERSATION]
    state = state_of(hashes)
    checkpoint = masking_checkpoint(None, 11, hashes, system_end=1, model="m", created_at=1.0)
    state.apply(StoredFact(id="c", seq=len(hashes), kind="checkpoint", index=None, source="proxy", message=None,
                           ts=0.0, extra={"checkpoint": orjson.loads(checkpoint.to_json())}))
    assert state.checkpoint_for(hashes) is not None
    assert state.checkpoint_for(hashes[:11]) is not None
    assert state.checkpoint_for(hashes[:10]) is None, "a rewind before masked_until never gets its placeholders"
    assert state.checkpoint_for([*hashes[:10], "edited", *hashes[11:]]) is None
    seqs, keys = state.entries_for(hashes, 11)
    assert list(seqs) == list(range(11)) and list(keys) == state.prefixes[:11]


def test_two_sessions_with_the_same_history_get_placeholders_naming_their_own_entries() -> None:
    """Caches are per engine, sessions are many: the same outputs at other seqs are other placeholders."""
    hashes = [CHAT.hash(m) for m in CONVERSATION]
    checkpoint = masking_checkpoint(None, 11, hashes, system_end=1, model="m", created_at=1.0)
    builder = ProjectionBuilder(CHAT)
    one = builder.build(CONVERSATION, checkpoint, seqs=range(len(CONVERSATION)), keys=hashes)
    other = builder.build(CONVERSATION, checkpoint, seqs=range(50, 50 + len(CONVERSATION)), keys=hashes)
    again = builder.build([dict(m) for m in CONVERSATION], checkpoint, seqs=range(len(CONVERSATION)), keys=hashes)
    assert one[3]["content"].endswith("; log entry 3; re-run the tool if you need it again]")
    assert other[3]["content"].endswith("; log entry 53; re-run the tool if you need it again]")
    assert again == one and again[3] is one[3], "the region built once is reused, byte for byte"


def test_freed_counts_what_masking_would_save_and_remembers_where_it_stopped() -> None:
    hashes = [CHAT.hash(m) for m in CONVERSATION]
    masker = Masker(COUNTER)
    count = ContextBudgetPolicy().counter_for(CHAT)
    seqs, keys = range(len(CONVERSATION)), [f"k{i}" for i in range(len(CONVERSATION))]
    full = masker.freed(CHAT, CONVERSATION, hashes, 2, 11, seqs, keys, count)
    masked = [masker.item(CHAT, CONVERSATION, i, seqs, keys) for i in range(2, 11)]
    assert full == sum(count(m, h) - count(n, None) for m, n, h in zip(CONVERSATION[2:11], masked, hashes[2:11],
                                                                        strict=True))
    assert masker.freed(CHAT, CONVERSATION, hashes, 2, 13, seqs, keys, count) > full, "extended: only the new part"
    changed = [*keys[:5], "edited", *keys[6:]]
    assert masker.freed(CHAT, CONVERSATION, hashes, 2, 11, seqs, changed, count) == full, "a new path, counted anew"


def test_the_kept_outputs_are_a_token_budget_as_well_as_a_count() -> None:
    # Each output counts 100 here: a budget of 250 keeps the last two of the ten asked for, and masks the rest.
    size = lambda index: 100  # noqa: E731
    end = mask_end(CHAT, CONVERSATION, 2, 10, budget=250, size=size)
    assert end == len(CONVERSATION) - 4, "masking reaches just past the third last output"
    assert mask_end(CHAT, CONVERSATION, 2, 10, budget=10**6, size=size) == mask_end(CHAT, CONVERSATION, 2, 10)
    assert mask_end(CHAT, CONVERSATION, 2, 10, budget=1, size=size) == len(CONVERSATION) - 2, "the last stays"


def test_the_layout_says_where_the_frozen_prefix_ends() -> None:
    hashes = [CHAT.hash(m) for m in CONVERSATION]
    keys = {"seqs": range(len(CONVERSATION)), "keys": hashes}
    masking = masking_checkpoint(None, 11, hashes, system_end=1, model="m", created_at=1.0)
    assert ProjectionBuilder(CHAT).layout(CONVERSATION, masking, **keys)[1] == FrozenEnds(masked=10)
    summarised = Checkpoint("S", 4, prefix_hash(hashes, 4), None, 0, 0, "m", 0.0)
    both = masking_checkpoint(summarised, 9, hashes, system_end=1, model="m", created_at=2.0)
    view, frozen = ProjectionBuilder(CHAT).layout(CONVERSATION, both, **keys)
    assert frozen == FrozenEnds(summary=1, masked=6), "the summary its own item, then the masked 4..8"
    assert view[1]["content"].startswith(SUMMARY_HEADER) and view[7] is CONVERSATION[9]
    view, frozen = ProjectionBuilder(CHAT, summary_placement="system").layout(CONVERSATION, both, **keys)
    assert frozen == FrozenEnds(summary=0, masked=5) and SUMMARY_HEADER in view[0]["content"]
    assert ProjectionBuilder(CHAT).layout(CONVERSATION, summarised)[1] == FrozenEnds(summary=1)
    assert ProjectionBuilder(CHAT).layout(CONVERSATION, None) == (CONVERSATION, FrozenEnds())
