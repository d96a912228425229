from __future__ import annotations

import copy

import pytest

from proxy.context.compactor import Checkpoint
from proxy.context.projection import (
    SUMMARY_HEADER,
    ProjectionBuilder,
    build_model_view,
    clip_message,
    clip_text,
    leading_system_count,
    round_start_for,
)
from proxy.types import Message


def call(call_id: str) -> Message:
    return {"id": call_id, "type": "function", "function": {"name": "run", "arguments": "{}"}}


CONVERSATION: list[Message] = [
    {"role": "system", "content": "be brief"},  # 0
    {"role": "user", "content": "first task"},  # 1
    {"role": "assistant", "content": "done"},  # 2
    {"role": "user", "content": "second task"},  # 3
    {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},  # 4
    {"role": "tool", "tool_call_id": "a", "content": "A" * 50},  # 5
    {"role": "tool", "tool_call_id": "b", "content": "ok"},  # 6
    {"role": "assistant", "content": None, "tool_calls": [call("c")]},  # 7
    {"role": "tool", "tool_call_id": "c", "content": "C"},  # 8
    {"role": "assistant", "content": "finished"},  # 9
]


def checkpoint(retain: int, round_start: int | None = None, summary: str = "S") -> Checkpoint:
    return Checkpoint(summary, retain, "h", round_start, 100, 10, "m", 0.0)


SUMMARY = {"role": "user", "content": f"{SUMMARY_HEADER}\n\nS"}


def test_leading_system_count() -> None:
    assert leading_system_count(CONVERSATION) == 1
    assert leading_system_count([{"role": "developer"}, {"role": "system"}, {"role": "user"}]) == 2
    assert leading_system_count([]) == 0


def test_round_start_for() -> None:
    assert round_start_for(CONVERSATION, 3) is None  # a user message is a boundary
    assert round_start_for(CONVERSATION, 7) == 3
    assert round_start_for(CONVERSATION, 2) == 1
    assert round_start_for(CONVERSATION, 10) is None  # the end
    assert round_start_for([{"role": "system"}, {"role": "assistant"}], 1) is None


def test_without_checkpoint_the_view_is_the_conversation_itself() -> None:
    view = build_model_view(CONVERSATION, None)
    assert view == CONVERSATION
    assert all(a is b for a, b in zip(view, CONVERSATION, strict=True))
    assert view is not CONVERSATION


def test_checkpoint_at_a_round_boundary() -> None:
    view = build_model_view(CONVERSATION, checkpoint(3))
    assert view == [CONVERSATION[0], SUMMARY, *CONVERSATION[3:]]
    assert view[2] is CONVERSATION[3]


def test_checkpoint_inside_a_round_reinserts_its_user_message() -> None:
    view = build_model_view(CONVERSATION, checkpoint(7, round_start=3))
    assert view == [CONVERSATION[0], SUMMARY, CONVERSATION[3], *CONVERSATION[7:]]


def test_summary_in_the_system_message() -> None:
    before = copy.deepcopy(CONVERSATION)
    view = build_model_view(CONVERSATION, checkpoint(3), summary_placement="system")
    assert view == [{"role": "system", "content": f"be brief\n\n{SUMMARY_HEADER}\n\nS"}, *CONVERSATION[3:]]
    assert before == CONVERSATION


def test_summary_in_a_system_message_given_as_parts() -> None:
    messages = [{"role": "system", "content": [{"type": "text", "text": "rules"}]}, *CONVERSATION[1:]]
    view = build_model_view(messages, checkpoint(3), summary_placement="system")
    assert view[0] == {
        "role": "system",
        "content": [{"type": "text", "text": "rules"}, {"type": "text", "text": f"{SUMMARY_HEADER}\n\nS"}],
    }
    assert messages[0] == {"role": "system", "content": [{"type": "text", "text": "rules"}]}


def test_summary_in_system_placement_without_a_system_message() -> None:
    view = build_model_view(CONVERSATION[1:], checkpoint(2), summary_placement="system")
    assert view == [{"role": "system", "content": f"{SUMMARY_HEADER}\n\nS"}, *CONVERSATION[3:]]


def test_clip_text_keeps_head_and_tail_and_names_the_index() -> None:
    text = "0123456789" * 10
    clipped = clip_text(text, 20, 17)
    assert clipped == (
        "0123456789\n[… 80 characters elided by ctxproxy; full text in the fact log, message index 17 …]\n0123456789"
    )
    assert clip_text(text, 100, 17) is text


def test_only_tool_results_are_clipped() -> None:
    long_user = {"role": "user", "content": "u" * 100}
    assert clip_message(long_user, 0, 10) is long_user
    tool = {"role": "tool", "tool_call_id": "a", "content": "abcdefghij" * 3}
    assert clip_message(tool, 5, 10) == {
        "role": "tool",
        "tool_call_id": "a",
        "content": "abcde\n[… 20 characters elided by ctxproxy; full text in the fact log, message index 5 …]\nfghij",
    }
    assert tool["content"] == "abcdefghij" * 3
    assert clip_message(tool, 5, None) is tool


def test_tool_results_given_as_text_parts_are_clipped_as_one_text() -> None:
    tool = {
        "role": "tool",
        "tool_call_id": "a",
        "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}],
    }
    assert clip_message(tool, 2, 2)["content"] == (
        "a\n[… 2 characters elided by ctxproxy; full text in the fact log, message index 2 …]\nd"
    )
    assert clip_message(tool, 2, 4) is tool
    image = {"role": "tool", "tool_call_id": "a", "content": [{"type": "image_url", "image_url": {}}]}
    assert clip_message(image, 2, 1) is image


def test_views_clip_oversized_tool_results_with_their_conversation_index() -> None:
    before = copy.deepcopy(CONVERSATION)
    for view in (
        build_model_view(CONVERSATION, None, clip_chars=10),
        build_model_view(CONVERSATION, checkpoint(4), clip_chars=10),
    ):
        clipped = [m for m in view if m.get("tool_call_id") == "a"]
        assert clipped[0]["content"] == (
            "AAAAA\n[… 40 characters elided by ctxproxy; full text in the fact log, message index 5 …]\nAAAAA"
        )
        assert next(m for m in view if m.get("tool_call_id") == "b") is CONVERSATION[6]
    assert before == CONVERSATION


def test_builder_validates_its_settings() -> None:
    with pytest.raises(ValueError):
        ProjectionBuilder(summary_placement="assistant")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ProjectionBuilder(clip_chars=0)


def test_a_checkpoint_index_inside_the_system_block_keeps_the_system_block_once() -> None:
    view = build_model_view(CONVERSATION, checkpoint(0))
    assert view == [CONVERSATION[0], SUMMARY, *CONVERSATION[1:]]
