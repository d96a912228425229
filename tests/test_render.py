"""``render``: the transcript's message body (built on ``blocks``) and ``replay`` up to an entry."""

from __future__ import annotations

from proxy.render import Transcript, message_body, replay
from proxy.store.base import FactLog, NewFact, SessionKey, StoredFact


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


def test_the_transcript_says_what_a_checkpoint_masked_and_summarised() -> None:
    transcript = Transcript()
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"},
                *({"role": "assistant", "content": str(i)} for i in range(6))]
    for seq, message in enumerate(messages):
        transcript.fact(StoredFact(id=str(seq), seq=seq, kind="message", index=seq, source="client", message=message,
                                   ts=0.0, hash=f"h{seq}", extra={}))

    def line(**checkpoint: object) -> str:
        payload = {"retain_start_idx": 1, "tokens_before": 900, "tokens_after": 300, "summary": "", **checkpoint}
        return transcript.fact(StoredFact(id="c", seq=len(messages), kind="checkpoint", index=1, source="proxy",
                                          message=None, ts=0.0, extra={"checkpoint": payload}))

    assert line(masked_until=5) == "── checkpoint: tool outputs of messages 1–4 masked (900 → 300 tokens) ──"  # noqa: RUF001
    assert line(summary="S", retain_start_idx=3, masked_until=6) == (
        "── checkpoint: messages 1–2 summarised, tool outputs of messages 3–5 masked (900 → 300 tokens) ──")  # noqa: RUF001
    assert line(summary="S", retain_start_idx=3) == "── checkpoint: messages 1–2 summarised (900 → 300 tokens) ──"  # noqa: RUF001
