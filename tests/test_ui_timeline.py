"""The inspector's parts without HTTP: the fold of a log, usage figures, where view messages came from, the
sign-in cookie, and the in-process record of compaction attempts."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.compactions import RecentCompactions
from proxy.context.compactor import Checkpoint, CompactionResult, prefix_hash
from proxy.context.view.budget import ContextBudgetPolicy
from proxy.context.view.clipping import clip_to_fit, entry_namer
from proxy.context.view.projection import SUMMARY_END, ProjectionBuilder
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.store.base import FactLog, NewFact, SessionKey, StoredFact
from proxy.ui import cookie
from proxy.ui.request import Origin, origins
from proxy.ui.timeline import Timeline, TimelineCache, usage_figures

KEY = SessionKey("t", "s")


def msg(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": text}


def fact(seq: int, kind: str, index: int | None, message: dict[str, Any] | None = None, source: str = "client",
         **extra: Any) -> StoredFact:
    digest = message_hash(message) if message is not None else None
    return StoredFact(str(seq), seq, kind, index, source, message, float(seq), digest, extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(("usage", "figures"), [
    ({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}}, (100, 64)),
    ({"prompt_tokens": 100}, (100, None)),
    ({"input_tokens": 90, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 10}}, (90, 10)),
    ({"input_tokens": 5, "cache_read_input_tokens": 80, "cache_creation_input_tokens": 15}, (100, 80)),
    ({"prompt_tokens": True}, (None, None)),
    ({}, (None, None)),
], ids=["chat", "chat-uncached", "responses", "anthropic", "not-a-number", "empty"])
def test_usage_figures(usage: dict[str, Any], figures: tuple[int | None, int | None]) -> None:
    assert usage_figures(usage) == figures


def test_the_items_of_one_reply_are_one_request_and_replies_with_no_figures_stay_apart() -> None:
    usage, view = {"input_tokens": 40}, {"key": "", "length": 1}
    t = Timeline()
    t.extend([fact(0, "message", 0, msg("user", "go")),
              fact(1, "message", 1, msg("assistant", "thinking"), "upstream", usage=usage, view=view),
              fact(2, "message", 2, msg("assistant", "done"), "upstream", usage=usage, view=view),
              fact(3, "message", 3, msg("user", "again")),
              fact(4, "message", 4, msg("assistant", "a"), "upstream", usage=usage, view=view),
              fact(5, "message", 5, msg("assistant", "b"), "upstream", usage={"input_tokens": 41}, view=view),
              fact(6, "message", 6, msg("assistant", "old"), "upstream"),
              fact(7, "message", 7, msg("assistant", "older"), "upstream")])
    assert [(p.seq, p.index, p.seen) for p in t.points] == [(1, 1, 40), (4, 4, 40), (5, 5, 41), (6, 6, t.prefix[6]),
                                                              (7, 7, t.prefix[7])]


def test_the_fold_follows_rewinds_and_counts_what_each_request_sent() -> None:
    counter = TokenCounter()
    m = [msg("system", "sys"), msg("user", "first question " * 20), msg("assistant", "answer " * 30),
         msg("user", "edited question " * 10), msg("assistant", "other answer")]
    t = Timeline()
    t.extend([fact(0, "message", 0, m[0]), fact(1, "message", 1, m[1]),
              fact(2, "message", 2, m[2], "upstream", usage={"prompt_tokens": 77}, view={"key": "", "length": 2}),
              fact(3, "rewind", 1), fact(4, "message", 1, m[3]), fact(5, "message", 2, m[4], "upstream")])
    tokens = [counter.message_tokens(CHAT, x) for x in m]
    assert [(p.seq, p.index, p.sent, p.seen, p.measured) for p in t.points] == [
        (2, 2, tokens[0] + tokens[1], 77, True),
        (5, 2, tokens[0] + tokens[3], tokens[0] + tokens[3], False),  # no usage: the estimate, all of it in view
    ]
    assert t.prefix == [0, tokens[0], tokens[0] + tokens[3], tokens[0] + tokens[3] + tokens[4]]
    assert (t.next_seq, t.kinds["rewind"], t.kinds["message"]) == (6, 1, 5)


def test_without_usage_the_estimate_is_the_view_the_checkpoint_makes() -> None:
    counter = TokenCounter()
    m = [msg("system", "sys"), msg("user", "q1 " * 50), msg("assistant", "a1 " * 50), msg("user", "q2 " * 50),
         msg("assistant", "a2 " * 40), msg("user", "q3"), msg("assistant", "a3")]
    hashes = [message_hash(x) for x in m]
    checkpoint = Checkpoint("the summary", 4, prefix_hash(hashes, 4), 3, 500, 100, "m", 0.0)
    facts = [fact(i, "message", i, x) for i, x in enumerate(m[:6])]
    facts.append(fact(6, "checkpoint", 4, None, "proxy", checkpoint=orjson.loads(checkpoint.to_json())))
    facts.append(fact(7, "message", 6, m[6], "upstream", view={"key": checkpoint.view_key, "length": 5}))
    t = Timeline()
    t.extend(facts)
    view = ProjectionBuilder(CHAT).build(m[:6], checkpoint)
    assert view[1]["content"].endswith(SUMMARY_END + m[3]["content"])  # the opener back, the summary leading it
    assert [x["content"] for x in view][2:] == [m[4]["content"], m[5]["content"]]
    [point] = t.points
    assert point.seen == sum(counter.message_tokens(CHAT, x) for x in view) and not point.measured
    [mark] = t.marks
    assert (mark.seq, mark.position, mark.first, mark.retain_start, mark.tokens_before, mark.tokens_after) == (
        6, 0, 1, 4, 500, 100)
    assert t.checkpoints == {checkpoint.view_key: checkpoint}


def test_an_undo_marks_retired_only_the_checkpoint_and_those_made_from_it() -> None:
    m = [msg("system", "sys"), msg("user", "q1"), msg("assistant", "a1"), msg("user", "q2"), msg("assistant", "a2")]
    made = [Checkpoint(f"s{n}", 1, "", None, 10, 5, "m", 0.0) for n in range(3)]
    facts = [fact(i, "message", i, x) for i, x in enumerate(m)]
    facts += [fact(5, "checkpoint", 1, None, "proxy", checkpoint=orjson.loads(made[0].to_json()), made_from=None),
              fact(6, "checkpoint", 1, None, "proxy", checkpoint=orjson.loads(made[1].to_json()), made_from=None),
              fact(7, "checkpoint", 1, None, "proxy", checkpoint=orjson.loads(made[2].to_json()), made_from=5),
              fact(8, "retire", None, None, "proxy", checkpoint_seq=5)]
    t = Timeline()
    t.extend(facts)
    assert [(mark.seq, mark.retired_by) for mark in t.marks] == [(5, 8), (6, None), (7, 8)], "6: another lineage's"


async def test_a_cached_fold_catches_up_with_what_was_appended(store: FactLog) -> None:
    cache = TimelineCache(size=1)
    first = [NewFact(kind="message", index=0, source="client", message=msg("user", "q"), hash="h0"),
             NewFact(kind="message", index=1, source="upstream", message=msg("assistant", "a"), hash="h1",
                     extra={"usage": {"prompt_tokens": 9}})]
    await store.append(KEY, 0, first, ts=1.0)
    async with cache.fold(store, KEY) as t:
        held = t
        assert [p.seq for p in t.points] == [1]
    await store.append(KEY, 2, [NewFact(kind="message", index=2, source="client", message=msg("user", "q2"),
                                        hash="h2"),
                                NewFact(kind="message", index=3, source="upstream", message=msg("assistant", "b"),
                                        hash="h3")], ts=2.0)
    async with cache.fold(store, KEY) as t:
        assert t is held and [p.seq for p in t.points] == [1, 3] and t.next_seq == 4
    async with cache.fold(store, SessionKey("t", "other")) as other:
        assert other.next_seq == 0
    async with cache.fold(store, KEY) as t:
        assert t is not held and [p.seq for p in t.points] == [1, 3]  # evicted (size 1), folded afresh


async def test_a_fold_whose_log_was_replaced_is_folded_afresh(redis_store) -> None:
    """A Redis that lost its data and got a new log of the same length: the cached figures must not stay."""
    cache = TimelineCache()

    def log(reply: str, prompt: int) -> list[NewFact]:
        return [NewFact(kind="message", index=0, source="client", message=msg("user", "q"), hash="h0"),
                NewFact(kind="message", index=1, source="upstream", message=msg("assistant", reply), hash=reply,
                        extra={"usage": {"prompt_tokens": prompt}})]

    await redis_store.append(KEY, 0, log("a", 9), ts=1.0)
    async with cache.fold(redis_store, KEY) as t:
        assert [p.seen for p in t.points] == [9]
    await redis_store.client.flushdb()
    await redis_store.append(KEY, 0, log("b", 42), ts=2.0)
    async with cache.fold(redis_store, KEY) as t:
        assert [p.seen for p in t.points] == [42] and t.next_seq == 2
    await redis_store.client.flushdb()
    async with cache.fold(redis_store, KEY) as t:
        assert t.next_seq == 0 and t.points == []


def test_origins_of_view_messages() -> None:
    tool = {"role": "tool", "tool_call_id": "c", "content": "x" * 500}
    m = [msg("system", "sys"), msg("user", "old"), msg("assistant", "old answer"), msg("user", "now"),
         {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                "function": {"name": "f", "arguments": "{}"}}]}, tool]
    seqs = [10, 11, 12, 13, 14, 15]
    checkpoint = Checkpoint("S", 3, prefix_hash([message_hash(x) for x in m], 3), None, 10, 5, "m", 0.0)
    view = ProjectionBuilder(CHAT).build(m, checkpoint)
    clipped = clip_to_fit(CHAT, view, 50, ContextBudgetPolicy(estimator="chars"), entry_namer(m, seqs))
    assert clipped is not None
    kept = clipped[-1]["content"].split("\n")
    assert kept[1] == "[… 253 characters elided by ctxproxy; full text in the fact log, entry seq 15 …]"
    elided = 253
    assert origins(clipped, m, CHAT, seqs) == [Origin("verbatim", 0), Origin("summary", None), Origin("verbatim", 4),
                                               Origin("clipped", 5, elided)]
    merged = ProjectionBuilder(CHAT, summary_placement="system").build(m, checkpoint)
    assert origins(merged, m, CHAT, seqs)[0] == Origin("summary", 0)


def test_cookie_is_signed_expires_is_of_one_epoch_and_never_holds_the_token() -> None:
    value = cookie.issue("tok", 1000.0, 3)
    assert "tok" not in value.split(".")[1:4] and value.count(".") == 4
    assert cookie.valid(value, "tok", 1000.0 + cookie.LIFETIME - 1, 3)
    assert not cookie.valid(value, "tok", 1000.0 + cookie.LIFETIME, 3)
    assert not cookie.valid(value, "other", 1000.0, 3)
    assert not cookie.valid(value, "tok", 1000.0, 4) and not cookie.valid(value, "tok", 1000.0, 2)
    version, expires, epoch, nonce, signature = value.split(".")
    assert not cookie.valid(f"{version}.{int(expires) + 10_000}.{epoch}.{nonce}.{signature}", "tok", 1000.0, 3)
    assert not cookie.valid(f"{version}.{expires}.4.{nonce}.{signature}", "tok", 1000.0, 4)
    assert not cookie.valid(f"{version}.{expires}.{epoch}.{nonce}.{signature}\udcff", "tok", 1000.0, 3)
    assert not cookie.valid(None, "tok", 0, 0) and not cookie.valid("v2.b.0.d.e", "tok", 0, 0)
    assert cookie.issue("tok", 1000.0, 3) != value  # a fresh nonce each time


def test_recent_compactions_are_bounded_and_keep_totals() -> None:
    record = RecentCompactions(clock=lambda: 5.0, max_sessions=2, per_session=3)
    checkpoint = Checkpoint("S", 2, "h", None, 100, 10, "m", 0.0)
    ok = CompactionResult("ok", checkpoint, 100, 10)
    for _ in range(4):
        record.record(KEY, "proactive", ok, 1.5)
    record.record(KEY, "reactive", CompactionResult("failed", None, 0, 0, "boom"), 0.25)
    events = record.events(KEY)
    assert len(events) == 3 and events[0].view_key == checkpoint.view_key
    assert (events[-1].trigger, events[-1].outcome, events[-1].detail, events[-1].view_key) == (
        "reactive", "failed", "boom", "")
    assert record.totals(KEY) == {("proactive", "ok"): 4, ("reactive", "failed"): 1}
    for name in ("b", "c"):
        record.record(SessionKey("t", name), "manual", ok, 0.1)
    assert record.events(KEY) == [] and record.totals(KEY) == {}  # the oldest session was forgotten
