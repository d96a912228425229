"""HistoryManager's pure parts: planning into the tree of lineages, hash reuse, checkpoint validity, folding."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.log.chain import chain_hash
from proxy.context.log.history import REUSE_FROM_BYTES, HistoryManager
from proxy.context.log.lineage import ROOT, ConversationState, common_prefix
from proxy.context.log.planning import plan_sync
from proxy.dialects.chat import message_hash
from proxy.store.base import NewFact, SessionKey, StoredFact
from tests.proxyfixtures import replay

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
        size = REUSE_FROM_BYTES  # large enough to be kept and compared with
        assert asyncio.run(history.hashes_for(key, messages, size, message_hash)) == [message_hash(m) for m in messages]


def test_a_message_equal_to_the_last_requests_gets_its_very_hash_and_a_message_hashed_anew_a_new_one() -> None:
    """What the token sums kept per session know a message by (``proxy.context.view.tokens.RunningCount``)."""
    history = HistoryManager(log=None, clock=lambda: 0.0)  # type: ignore[arg-type]  # hashing needs no store
    key = SessionKey("t", "s")
    first = [{"role": "user", "content": f"m{i}"} for i in range(4)]
    before = asyncio.run(history.hashes_for(key, first, REUSE_FROM_BYTES, message_hash))
    second = [dict(m) for m in first[:2]] + [{"role": "user", "content": "edited"}, dict(first[3])]
    after = asyncio.run(history.hashes_for(key, second, REUSE_FROM_BYTES, message_hash))
    assert [a is b for a, b in zip(after, before, strict=True)] == [True, True, False, False]
    assert after[3] == before[3], "the same value, hashed anew past the first difference"


def test_recent_requests_are_bounded_by_size() -> None:
    history = HistoryManager(log=None, clock=lambda: 0.0,  # type: ignore[arg-type]
                             recent_bytes=2 * REUSE_FROM_BYTES + 1000)
    for i in range(5):
        messages = [{"role": "user", "content": str(i)}]
        asyncio.run(history.hashes_for(SessionKey("t", f"s{i}"), messages, REUSE_FROM_BYTES, message_hash))
    assert [key for key, _, _ in history._recent] == [SessionKey("t", "s3"), SessionKey("t", "s4")]


def test_a_short_request_is_hashed_whole_and_not_kept() -> None:
    """Thousands of short sessions would each keep their last request's objects: under ``REUSE_FROM_BYTES`` the
    request is hashed anew instead; a conversation whose requests shrink below it drops what it kept."""
    history = HistoryManager(log=None, clock=lambda: 0.0)  # type: ignore[arg-type]
    key = SessionKey("t", "s")
    messages = [{"role": "user", "content": "a short request"}]
    slot = (key, "", message_hash(messages[0]))
    assert asyncio.run(history.hashes_for(key, messages, 200, message_hash)) == [message_hash(messages[0])]
    assert slot not in history._recent
    asyncio.run(history.hashes_for(key, messages, REUSE_FROM_BYTES, message_hash))
    assert slot in history._recent
    asyncio.run(history.hashes_for(key, messages, 200, message_hash))
    assert slot not in history._recent and history._recent_size == 0


@pytest.mark.parametrize("size", [200, REUSE_FROM_BYTES])
@pytest.mark.parametrize("side", ["title", "probe"])
def test_a_side_call_between_two_steps_keeps_the_runs_previous_request(size: int, side: str) -> None:
    """A side call (short or long) between two steps of the run, a title call (another system prompt) or a probe
    (the run's first messages, no tools: another conversation): the run's next request still gets the very hashes
    of what it resends (what the token sums kept per session know a message by), and only its new message is
    hashed."""
    history = HistoryManager(log=None, clock=lambda: 0.0)  # type: ignore[arg-type]  # hashing needs no store
    key = SessionKey("t", "s")
    run = [{"role": "system", "content": "agent"}, *({"role": "user", "content": f"m{i}"} for i in range(4))]
    before = asyncio.run(history.hashes_for(key, run, REUSE_FROM_BYTES, message_hash, "run:tools"))
    if side == "title":
        asyncio.run(history.hashes_for(key, [{"role": "system", "content": "Write a title."}, dict(run[1])], size,
                                       message_hash, "run"))
    else:
        asyncio.run(history.hashes_for(key, [dict(m) for m in run[:2]], size, message_hash, "run"))
    hashed: list[Any] = []

    def counted(item: Any) -> str:
        hashed.append(item)
        return message_hash(item)

    step = [dict(m) for m in run] + [{"role": "user", "content": "m4"}]
    after = asyncio.run(history.hashes_for(key, step, REUSE_FROM_BYTES, counted, "run:tools"))
    assert all(a is b for a, b in zip(after, before, strict=False))
    assert hashed == [step[0], step[-1]], "the first message names the conversation; the new one is hashed"


class Messages(list):  # type: ignore[type-arg]  # a list that a weak reference can follow
    pass


async def test_the_previous_request_is_freed_after_the_request_goes_on_not_during_it() -> None:
    """Freeing a long history's objects takes about as long as comparing them: it waits for the loop's next turn
    (the request is on its way upstream by then) instead of delaying this request."""
    history = HistoryManager(log=None, clock=lambda: 0.0)  # type: ignore[arg-type]
    key = SessionKey("t", "s")
    first = Messages([{"role": "user", "content": "one"}])
    gone = weakref.ref(first)
    await history.hashes_for(key, first, REUSE_FROM_BYTES, message_hash)
    del first
    await history.hashes_for(key, [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
                             REUSE_FROM_BYTES, message_hash)
    assert gone() is not None  # replaced, not yet freed
    await asyncio.sleep(0)  # one turn of the loop: the callbacks scheduled so far run
    assert gone() is None


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
    state.apply(_fact(5, "rewind", 1, from_seq=0))
    assert state.checkpoint is None, "the lineage no longer holds the covered prefix"
    state.apply(_fact(6, "rewind", 4, from_seq=3))
    assert state.checkpoint is not None, "back on the covered lineage, the checkpoint serves again"


def test_plan_sync_rewinds_then_appends_and_marks_upstream() -> None:
    state = ConversationState()
    for i, digest in enumerate(["a", "b", "c"]):
        state.apply(_fact(i, "message", i, hash=digest))
    messages = [{"role": "user", "content": x} for x in "abxy"]
    facts = plan_sync(state, messages, ["a", "b", "x", "y"], 3, {}, {"usage": {"prompt_tokens": 1}})
    assert [(f.kind, f.index, f.source, f.extra.get("from_seq")) for f in facts] == [
        ("rewind", 2, "client", 1), ("message", 2, "client", None), ("message", 3, "upstream", None)]
    assert facts[-1].extra == {"usage": {"prompt_tokens": 1}}


def _stored(state: ConversationState, facts: list[NewFact]) -> list[StoredFact]:
    """What a store would return for appending ``facts`` after ``state``."""
    return [StoredFact(id=str(state.next_seq + i), seq=state.next_seq + i, kind=f.kind, index=f.index,
                       source=f.source, message=f.message, ts=0.0, hash=f.hash, extra=f.extra)
            for i, f in enumerate(facts)]


def _sync(state: ConversationState, log: list[StoredFact], conversation: list[dict[str, Any]],
          upstream_from: int | None = None) -> list[NewFact]:
    hashes = [message_hash(m) for m in conversation]
    facts = plan_sync(state, conversation, hashes, len(conversation) if upstream_from is None else upstream_from,
                      {}, {})
    for fact in _stored(state, facts):
        state.apply(fact)
        log.append(fact)
    return facts


def _user(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": t} for t in texts]


@settings(max_examples=150)
@given(st.lists(st.lists(st.sampled_from("abc"), max_size=6), min_size=1, max_size=12))
def test_any_sequence_of_conversations_logs_each_path_once_and_replays_to_the_last(
        conversations: list[list[str]]) -> None:
    state, log = ConversationState(), []
    for texts in conversations:
        _sync(state, log, _user(*texts))
    assert replay(log) == _user(*conversations[-1])
    assert state.hashes == [message_hash(m) for m in _user(*conversations[-1])]
    paths = {tuple(texts[:n]) for texts in conversations for n in range(1, len(texts) + 1)}
    assert len([f for f in log if f.kind == "message"]) == len(paths), "no message is logged twice"
    rebuilt = ConversationState()
    for fact in log:
        rebuilt.apply(fact)
    assert (rebuilt.hashes, rebuilt.seqs) == (state.hashes, state.seqs), "folding the log gives the same state"


def test_returning_to_a_known_branch_costs_one_rewind() -> None:
    state, log = ConversationState(), []
    main = _user("sys", "task", "step 1", "step 2")
    _sync(state, log, main)
    _sync(state, log, _user("title?", "name it"))
    facts = _sync(state, log, [*main, *_user("step 3")])
    assert [(f.kind, f.index, f.extra.get("from_seq")) for f in facts] == [("rewind", 4, 3), ("message", 4, None)]
    assert state.seqs == [0, 1, 2, 3, 8]
    assert state.locate([message_hash(m) for m in _user("title?", "name it", "more")]) == (2, 6)


def test_a_rewind_without_from_seq_continues_from_its_index_on_the_current_lineage() -> None:
    state = ConversationState()
    for i, digest in enumerate(["h0", "h1", "h2"]):
        state.apply(_fact(i, "message", i, hash=digest))
    state.apply(_fact(3, "rewind", 1))  # a log written before rewinds named their entry
    state.apply(_fact(4, "message", 1, hash="x1"))
    assert (state.hashes, state.seqs) == (["h0", "x1"], [0, 4])
    assert replay([_fact(i, "message", i, hash=f"h{i}") for i in range(3)]
                  + [_fact(3, "rewind", 1), _fact(4, "message", 1, hash="x1")]) == [
        {"role": "user", "content": "0"}, {"role": "user", "content": "4"}]


def test_folding_is_idempotent_and_refuses_gaps() -> None:
    state = ConversationState()
    fact = _fact(0, "message", 0, hash="h0")
    state.apply(fact)
    state.apply(fact)  # a catch-up and an append's own result may both deliver it
    assert (state.hashes, state.next_seq) == (["h0"], 1)
    with pytest.raises(ValueError, match="gap"):
        state.apply(_fact(2, "message", 1, hash="h2"))


def test_a_checkpoint_serves_its_lineage_while_another_is_current() -> None:
    state, log = ConversationState(), []
    main = _user("sys", "task", "step 1", "step 2")
    _sync(state, log, main)
    hashes = [message_hash(m) for m in main]
    state.apply(_stored(state, [NewFact(kind="checkpoint", index=3, source="proxy", extra={"checkpoint": {
        "retain_start_idx": 3, "prefix_hash": state.prefixes[2]}})])[0])
    _sync(state, log, _user("title?"))
    assert state.checkpoint is None
    assert state.checkpoint_for([*hashes, message_hash(_user("step 3")[0])]) is not None
    assert state.checkpoint_for([*hashes[:2], message_hash(_user("other")[0])]) is None


def test_last_usage_follows_the_lineage() -> None:
    state, log = ConversationState(), []
    main = [*_user("task"), {"role": "assistant", "content": "done"}]
    facts = plan_sync(state, main, [message_hash(m) for m in main], 1, {},
                      {"usage": {"prompt_tokens": 9}, "view": {"length": 1}})
    for fact in _stored(state, facts):
        state.apply(fact)
        log.append(fact)
    assert state.last_usage == {"prompt_tokens": 9} and state.last_view == {"length": 1}
    _sync(state, log, _user("title?"))
    assert state.last_usage is None and state.last_view is None, "the other lineage measured nothing"
    _sync(state, log, [*main, *_user("next")])
    assert state.last_usage == {"prompt_tokens": 9}, "back on the lineage, its last measurement applies again"



def test_the_usage_for_a_conversation_is_the_newest_on_its_path_wherever_the_head_is() -> None:
    """A side call on the run's first message and one on its whole history each log a reply with a usage of its
    own and move the head there: the run's next request is measured by the run's last reply, not by theirs (a
    title call's 43 tokens made the run's estimate read hundreds of tokens short); the question on the history
    is measured by the run's reply too, on its path."""
    state, log = ConversationState(), []

    def logged(messages: list[Any], usage: int) -> None:
        facts = plan_sync(state, messages, [message_hash(m) for m in messages], len(messages) - 1, {},
                          {"usage": {"prompt_tokens": usage}, "view": {"length": len(messages) - 1}})
        for fact in _stored(state, facts):
            state.apply(fact)
            log.append(fact)

    run = [*_user("task"), {"role": "assistant", "content": "step 1"}]
    logged(run, 900)
    logged([*_user("task"), {"role": "assistant", "content": "A title"}], 43)
    logged([*run, *_user("who speaks next?"), {"role": "assistant", "content": "user"}], 950)
    assert state.last_usage == {"prompt_tokens": 950}, "the head is the question's reply"
    following = [message_hash(m) for m in [*run, *_user("step 1 done")]]
    assert state.usage_for(following)[:2] == ({"prompt_tokens": 900}, {"length": 1})
    asked = [message_hash(m) for m in [*run, *_user("who speaks next?")]]
    assert state.usage_for(asked)[:2] == ({"prompt_tokens": 900}, {"length": 1})
    assert state.usage_for([message_hash(_user("another task")[0])]) is None


def _walk(state: ConversationState, hashes: list[str], base: int) -> list[str]:
    """``known_prefixes(hashes, 0, base)`` worked out afresh: chain hashes from ``base`` while the log has them."""
    prefix = ""
    for digest in state.path_to(base)[1]:
        prefix = chain_hash(prefix, digest)
    known: list[str] = []
    for digest in hashes:
        prefix = chain_hash(prefix, digest)
        try:
            state.seq_of_prefix(prefix)
        except KeyError:
            break
        known.append(prefix)
    return known


@settings(max_examples=150)
@given(st.lists(st.tuples(st.lists(st.sampled_from("abc"), max_size=6), st.integers(0, 3)), min_size=1,
                max_size=12))
def test_a_remembered_walk_answers_as_a_walk_afresh_whatever_the_log_gained_since(
        steps: list[tuple[list[str], int]]) -> None:
    """``known_prefixes`` remembers its walks; each answer is still that of the log as it is now, for any
    conversation asked about before or after any entries are logged."""
    state, log = ConversationState(), []
    asked: list[list[str]] = []
    for texts, base_at in steps:
        hashes = [message_hash(m) for m in _user(*texts)]
        asked.append(hashes)
        for earlier in asked:
            base = state.seqs[min(base_at, len(state.seqs)) - 1] if base_at and state.seqs else ROOT
            assert state.known_prefixes(earlier, 0, base) == _walk(state, earlier, base)
            start = common_prefix(state.hashes, earlier)
            assert state.known_prefixes(earlier, start) == _walk(state, earlier[start:], state.seqs[start - 1]
                                                                 if start else ROOT)
        _sync(state, log, _user(*texts))


def test_the_run_walked_from_a_side_branch_follows_what_the_run_logs_since() -> None:
    """A title call on the run's first message leaves the head on its own branch; the run's request is walked
    from there, and the run's next request, after the run logged more, is walked as far as the log goes now."""
    state, log = ConversationState(), []
    run = _user("sys", "task", "step 1", "step 2")
    _sync(state, log, run)
    _sync(state, log, _user("sys", "title?"))
    hashes = [message_hash(m) for m in [*run, *_user("step 3")]]
    assert len(state.known_prefixes(hashes, 1)) == 3, "step 3 is not logged yet"
    _sync(state, log, [*run, *_user("step 3")])
    _sync(state, log, _user("sys", "title?"))
    longer = [*hashes, message_hash(_user("step 4")[0])]
    assert state.known_prefixes(longer, 1) == _walk(state, longer[1:], state.seqs[0])
    assert len(state.known_prefixes(longer, 1)) == 4, "step 3, logged since, is on the path"
    edited = [*hashes[:2], message_hash(_user("step 1, edited")[0]), *hashes[3:]]
    assert state.known_prefixes(edited, 1) == _walk(state, edited[1:], state.seqs[0])
    assert len(state.known_prefixes(edited, 1)) == 1, "a path that parts from the one walked is walked anew"
