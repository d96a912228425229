"""The chat dialect's identity: cosmetic differences clients make when echoing a message keep its hash."""

from __future__ import annotations

import pytest

from proxy.context.view.tokens import text_length
from proxy.dialects.chat import DIALECT as CHAT
from proxy.dialects.chat import message_hash

CALL = {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "ls", "n": 2}'}}


@pytest.mark.parametrize(("a", "b"), [
    ({"role": "assistant", "content": None, "tool_calls": [CALL]},
     {"role": "assistant", "content": "", "tool_calls": [CALL]}),
    ({"role": "assistant", "content": None, "tool_calls": [CALL]},
     {"role": "assistant", "tool_calls": [CALL]}),
    ({"role": "user", "content": "hello"}, {"role": "user", "content": [{"type": "text", "text": "hello"}]}),
    ({"role": "user", "content": "hello"}, {"content": "hello", "role": "user"}),
    ({"role": "user", "content": "hello"}, {"role": "user", "content": "  hello\n"}),
    ({"role": "assistant", "content": None, "tool_calls": [CALL]},
     {"role": "assistant", "content": None, "tool_calls": [
         {"id": "call_1", "function": {"arguments": '{"n":2,"cmd":"ls"}', "name": "run"}}]}),
    ({"role": "assistant", "content": "x", "refusal": None, "reasoning_content": "r", "annotations": []},
     {"role": "assistant", "content": "x"}),
], ids=["null-vs-empty", "null-vs-absent", "one-part-list", "key-order", "whitespace", "arguments-and-type",
        "fields-clients-drop"])
def test_cosmetic_differences_hash_alike(a, b) -> None:
    assert message_hash(a) == message_hash(b)


@pytest.mark.parametrize(("a", "b"), [
    ({"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello"}),
    ({"role": "user", "content": "hello"}, {"role": "user", "content": "hello!"}),
    ({"role": "tool", "tool_call_id": "a", "content": "x"}, {"role": "tool", "tool_call_id": "b", "content": "x"}),
    ({"role": "assistant", "tool_calls": [CALL]},
     {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "run", "arguments": '{"cmd": "rm"}'}}]}),
])
def test_real_differences_hash_apart(a, b) -> None:
    assert message_hash(a) != message_hash(b)


@pytest.mark.parametrize("depth", [251, 252, 253, 254, 255, 400])
def test_arguments_nested_deeper_than_orjson_writes_still_hash(depth: int) -> None:
    """252 to 254 levels parse and write alone, but not three levels down where the hash writes them."""
    deep = "[" * depth + "]" * depth
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": deep}}
    legacy = {"name": "f", "arguments": deep}
    assert message_hash({"role": "assistant", "tool_calls": [call]}) != message_hash({"role": "assistant"})
    assert message_hash({"role": "assistant", "function_call": legacy}) != message_hash({"role": "assistant"})


def test_text_length_counts_what_the_model_reads() -> None:
    assert text_length(CHAT, {"role": "user", "content": "abc"}) == 3
    parts = [{"type": "text", "text": "ab"}, {"type": "text", "text": "c"}]
    assert text_length(CHAT, {"role": "user", "content": parts}) == 4  # the parts, joined by a newline
    assert text_length(CHAT, {"role": "tool", "tool_call_id": "id", "content": "x"}) == 4
