"""``render``: the transcript's message body (built on ``blocks``) and ``replay`` up to an entry."""

from __future__ import annotations

from proxy.render import message_body, replay
from proxy.store.base import FactLog, NewFact, SessionKey


def test_the_transcript_body_is_built_from_the_blocks() -> None:
    message = {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path":\n "a.py"}'}}]}
    assert message_body(message) == 'Let me look.\n→ read({"path": "a.py"})'
    assert message_body({"role": "tool", "tool_call_id": "c", "content": "y" * 600}) == (
        "y" * 500 + "… [100 more characters]")
    assert message_body({"role": "assistant", "content": None}) == "(empty)"


async def test_replay_until_an_entry_is_the_conversation_as_it_stood_then(store: FactLog) -> None:
    key = SessionKey("t", "s")
    facts = [NewFact(kind="message", index=i, source="client", message={"role": "user", "content": str(i)},
                     hash=f"h{i}") for i in range(3)]
    await store.append(key, 0, [*facts, NewFact(kind="rewind", index=1, source="client"),
                                NewFact(kind="message", index=1, source="client",
                                        message={"role": "user", "content": "edited"}, hash="h1b")], ts=1.0)
    assert [m["content"] for m in (await replay(store, key, until=2)).messages] == ["0", "1", "2"]
    assert [m["content"] for m in (await replay(store, key, until=3)).messages] == ["0"]
    assert [m["content"] for m in (await replay(store, key)).messages] == ["0", "edited"]
