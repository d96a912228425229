from __future__ import annotations

import copy

import pytest

from proxy.context.compactor import Checkpoint
from proxy.context.items import leading_system_count, round_start_for
from proxy.context.view.projection import (
    SUMMARY_END,
    SUMMARY_HEADER,
    ProjectionBuilder,
    build_model_view,
)
from proxy.dialects import CHAT
from proxy.types import Message
from tests.fakeupstream import role_error


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


def led(message: Message) -> Message:
    """``message`` with the summary leading it, as the default placement sends it."""
    return {**message, "content": f"{SUMMARY_HEADER}\n\nS{SUMMARY_END}{message['content']}"}


def test_leading_system_count() -> None:
    assert leading_system_count(CHAT, CONVERSATION) == 1
    assert leading_system_count(CHAT, [{"role": "developer"}, {"role": "system"}, {"role": "user"}]) == 2
    assert leading_system_count(CHAT, []) == 0


def test_round_start_for() -> None:
    assert round_start_for(CHAT, CONVERSATION, 3) is None  # a user message is a boundary
    assert round_start_for(CHAT, CONVERSATION, 7) == 3
    assert round_start_for(CHAT, CONVERSATION, 2) == 1
    assert round_start_for(CHAT, CONVERSATION, 10) is None  # the end
    assert round_start_for(CHAT, [{"role": "system"}, {"role": "assistant"}], 1) is None


def test_without_checkpoint_the_view_is_the_conversation_itself() -> None:
    view = build_model_view(CHAT, CONVERSATION, None)
    assert view == CONVERSATION
    assert all(a is b for a, b in zip(view, CONVERSATION, strict=True))
    assert view is not CONVERSATION


def test_checkpoint_at_a_round_boundary_leads_the_first_retained_user_message() -> None:
    before = copy.deepcopy(CONVERSATION)
    view = build_model_view(CHAT, CONVERSATION, checkpoint(3))
    assert view == [CONVERSATION[0], led(CONVERSATION[3]), *CONVERSATION[4:]]
    end = "\n\n[ctxproxy] End of the summary. The user's message:\n\n"
    assert view[1]["content"] == f"{SUMMARY_HEADER}\n\nS{end}second task"
    assert all(a is b for a, b in zip(view[2:], CONVERSATION[4:], strict=True))
    assert before == CONVERSATION


def test_checkpoint_inside_a_round_leads_its_reinserted_user_message() -> None:
    view = build_model_view(CHAT, CONVERSATION, checkpoint(7, round_start=3))
    assert view == [CONVERSATION[0], led(CONVERSATION[3]), *CONVERSATION[7:]]


def test_a_user_message_of_parts_gets_the_summary_as_its_leading_part() -> None:
    parts = [{"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}}, {"type": "image_url"}]
    messages = [CONVERSATION[0], {"role": "user", "content": parts}, CONVERSATION[2]]
    view = build_model_view(CHAT, messages, checkpoint(1))
    assert view[1] == {"role": "user", "content": [{"type": "text", "text": f"{SUMMARY_HEADER}\n\nS{SUMMARY_END}"},
                                                   *parts]}
    assert view[1]["content"][1] is parts[0]


def test_a_tail_that_starts_with_an_assistant_message_gets_a_summary_message_of_its_own() -> None:
    messages = [CONVERSATION[0], CONVERSATION[2], *CONVERSATION[4:]]  # no user message before the split
    view = build_model_view(CHAT, messages, checkpoint(2))
    assert view == [CONVERSATION[0], SUMMARY, *messages[2:]]
    assert role_error(view) is None
    assert build_model_view(CHAT, CONVERSATION, checkpoint(10)) == [CONVERSATION[0], SUMMARY]  # nothing retained


def test_the_summary_is_byte_identical_while_the_conversation_grows() -> None:
    grown = [*CONVERSATION, {"role": "user", "content": "third task"}, {"role": "assistant", "content": "ok"}]
    for placement in ("user", "system"):
        shorter = build_model_view(CHAT, CONVERSATION, checkpoint(7, round_start=3), summary_placement=placement)
        longer = build_model_view(CHAT, grown, checkpoint(7, round_start=3), summary_placement=placement)
        assert longer[: len(shorter)] == shorter


@pytest.mark.parametrize("placement", ["user", "system"])
@pytest.mark.parametrize(("retain", "round_start"), [(0, None), (1, None), (3, None), (4, 3), (7, 3), (10, None)])
def test_views_pass_a_strict_chat_template(placement: str, retain: int, round_start: int | None) -> None:
    view = build_model_view(CHAT, CONVERSATION, checkpoint(retain, round_start), summary_placement=placement)
    assert role_error(view) is None


def test_summary_in_the_system_message() -> None:
    before = copy.deepcopy(CONVERSATION)
    view = build_model_view(CHAT, CONVERSATION, checkpoint(3), summary_placement="system")
    assert view == [{"role": "system", "content": f"be brief\n\n{SUMMARY_HEADER}\n\nS"}, *CONVERSATION[3:]]
    assert before == CONVERSATION


def test_summary_in_a_system_message_given_as_parts() -> None:
    messages = [{"role": "system", "content": [{"type": "text", "text": "rules"}]}, *CONVERSATION[1:]]
    view = build_model_view(CHAT, messages, checkpoint(3), summary_placement="system")
    assert view[0] == {
        "role": "system",
        "content": [{"type": "text", "text": "rules"}, {"type": "text", "text": f"{SUMMARY_HEADER}\n\nS"}],
    }
    assert messages[0] == {"role": "system", "content": [{"type": "text", "text": "rules"}]}


def test_summary_in_system_placement_without_a_system_message() -> None:
    view = build_model_view(CHAT, CONVERSATION[1:], checkpoint(2), summary_placement="system")
    assert view == [{"role": "system", "content": f"{SUMMARY_HEADER}\n\nS"}, *CONVERSATION[3:]]


def test_builder_validates_its_settings() -> None:
    with pytest.raises(ValueError):
        ProjectionBuilder(CHAT, summary_placement="assistant")  # type: ignore[arg-type]


def test_a_checkpoint_index_inside_the_system_block_keeps_the_system_block_once() -> None:
    view = build_model_view(CHAT, CONVERSATION, checkpoint(0))
    assert view == [CONVERSATION[0], led(CONVERSATION[1]), *CONVERSATION[2:]]
