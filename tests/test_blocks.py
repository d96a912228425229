"""``blocks.message_blocks``: one reader of message text for every API's shape."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.blocks import Block, message_blocks, role_label

CASES: list[tuple[str, dict[str, Any], list[Block]]] = [
    ("chat text", {"role": "user", "content": "hi"}, [Block("text", "hi")]),
    ("chat parts", {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
     [Block("text", "a"), Block("other", "[image_url]")]),
    ("chat tool calls", {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}]},
     [Block("call", '{"p": 1}', "read")]),
    ("chat legacy function call", {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
     [Block("call", "{}", "f")]),
    ("chat tool result", {"role": "tool", "tool_call_id": "c1", "content": "out"}, [Block("result", "out", "c1")]),
    ("chat tool result in parts", {"role": "tool", "tool_call_id": "c1", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, [Block("result", "a\nb", "c1")]),
    ("anthropic blocks", {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "x"}, {"type": "text", "text": "ok"},
        {"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "ls"}}]},
     [Block("reasoning", "hmm"), Block("text", "ok"), Block("call", '{"cmd":"ls"}', "bash")]),
    ("anthropic compaction", {"role": "assistant", "content": [
        {"type": "compaction", "content": "Earlier: ran steps 1 to 4."}, {"type": "compaction", "content": None}]},
     [Block("text", "[compaction]\nEarlier: ran steps 1 to 4."), Block("other", "[compaction]")]),
    ("anthropic tool result", {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "a.py"}]}]},
     [Block("result", "a.py", "t1")]),
    ("responses message", {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "done"}]}, [Block("text", "done")]),
    ("responses function call", {"type": "function_call", "call_id": "f1", "name": "sh", "arguments": "{}"},
     [Block("call", "{}", "sh")]),
    ("responses function output", {"type": "function_call_output", "call_id": "f1", "output": "x"},
     [Block("result", "x", "f1")]),
    ("responses reasoning", {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}],
                             "encrypted_content": "..."}, [Block("reasoning", "plan")]),
    ("responses unknown item", {"type": "web_search_call", "id": "w"}, [Block("other", "[web_search_call]")]),
    ("odd content", {"role": "user", "content": {"weird": True}}, [Block("text", '{"weird":true}')]),
    ("empty", {"role": "assistant", "content": ""}, []),
]


@pytest.mark.parametrize(("message", "blocks"), [(m, b) for _, m, b in CASES], ids=[c[0] for c in CASES])
def test_message_blocks(message: dict[str, Any], blocks: list[Block]) -> None:
    assert message_blocks(message) == blocks


def test_role_label_names_items_without_a_role() -> None:
    assert role_label({"role": "tool", "tool_call_id": "c1"}) == "tool (c1)"
    assert role_label({"type": "function_call_output", "call_id": "f1"}) == "function_call_output (f1)"
