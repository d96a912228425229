"""HistoryManager's pure parts: prefix planning, hash reuse, checkpoint validity for an unlogged request."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.history import ConversationState, HistoryManager, common_prefix, plan_sync
from proxy.context.messages import chain_hash, message_hash
from proxy.store.base import SessionKey, StoredFact

message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]),
                                 "content": st.text(max_size=20)})


@given(st.lists(st.sampled_from("abc"), max_size=12), st.lists(st.sampled_from("abc"), max_size=12))
def test_common_prefix_is_the_longest_equal_prefix(a: list[str], b: list[str]) -> None:
    n = common_prefix(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


@settings(max_examples=60)
@given(st.lists(st.lists(message, max_size=8), min_size=1, max_size=5))
def test_hashes_for_reuses_only_what_is_equal(requests: list[list[dict[str, Any]]]) -> None:
    history = HistoryManager(log=None, clock=lambda: 0.0)  # type: ignore[arg-type]  # hashing needs no store
    key = SessionKey("t", "s")
    for messages in requests:
        assert history.hashes_for(key, messages, 100) == [message_hash(m) for m in messages]


def test_recent_requests_are_bounded_by_size() -> None:
    history = HistoryManager(log=None, clock=lambda: 0.0, recent_bytes=1000)  # type: ignore[arg-type]
    for i in range(5):
        history.hashes_for(SessionKey("t", f"s{i}"), [{"role": "user", "content": str(i)}], 0)
    assert list(history._recent) == [SessionKey("t", "s3"), SessionKey("t", "s4")]


def _fact(seq: int, kind: str, index: int | None, **extra: Any) -> StoredFact:
    digest = extra.pop("hash", None)
    return StoredFact(id=str(seq), seq=seq, kind=kind, index=index, source="client",  # type: ignore[arg-type]
                      message={"role": "user", "content": str(seq)} if kind == "message" else None, ts=0.0,
                      hash=digest, extra=extra)


def test_checkpoint_applies_to_a_request_that_extends_the_lineage_only() -> None:
    state = ConversationState()
    hashes = ["h0", "h1", "h2", "h3"]
    for i, digest in enumerate(hashes):
        state.apply(_fact(i, "message", i, hash=digest))
    prefix = chain_hash(chain_hash("", "h0"), "h1")
    state.apply(_fact(4, "checkpoint", 2, checkpoint={"retain_start_idx": 2, "prefix_hash": prefix}))
    assert state.checkpoint_for([*hashes, "h4"]) is not None  # new messages, not yet logged
    assert state.checkpoint_for(["h0", "h1", "x"]) is not None  # diverges after the covered prefix
    assert state.checkpoint_for(["h0", "edited", "h2"]) is None  # edits what the summary covers
    state.apply(_fact(5, "rewind", 1))
    assert state.checkpoint is None and state.checkpoints == []


def test_plan_sync_rewinds_then_appends_and_marks_upstream() -> None:
    state = ConversationState()
    for i, digest in enumerate(["a", "b", "c"]):
        state.apply(_fact(i, "message", i, hash=digest))
    messages = [{"role": "user", "content": x} for x in "abxy"]
    facts = plan_sync(state, messages, ["a", "b", "x", "y"], 3, {}, {"usage": {"prompt_tokens": 1}})
    assert [(f.kind, f.index, f.source) for f in facts] == [
        ("rewind", 2, "client"), ("message", 2, "client"), ("message", 3, "upstream")]
    assert facts[-1].extra == {"usage": {"prompt_tokens": 1}}
