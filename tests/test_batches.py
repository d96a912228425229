"""Masking in batches over a real store: when a batch is due, what it logs, and that it never overwrites."""

from __future__ import annotations

import random
from typing import Any

from proxy.context.checkpoint import Checkpoint
from proxy.context.compactor import ContextCompactor
from proxy.context.engine import ContextEngine, EngineSettings
from proxy.context.log.history import HistoryManager
from proxy.context.summary.summarizer import SummaryGenerator
from proxy.context.view.batches import mask_batch
from proxy.context.view.budget import ContextBudgetPolicy
from proxy.context.view.projection import ProjectionBuilder
from proxy.context.view.worth import CacheRates, Moment
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.store.base import FactLog, SessionKey
from tests.proxyfixtures import read_log
from tests.test_compaction_e2e import prose
from tests.test_engine import Summariser, prepare
from tests.test_workingset import numbered

KEY = SessionKey("tenant", "batches")
WINDOW = 16_000
#: The cache cold, the next gap far off: a batch is made as soon as it is one (``proxy.context.view.worth``).
AFTER_A_GAP = Moment(True, 1_000)


def run(steps: int, words: int = 400) -> list[dict[str, Any]]:
    rng = random.Random(steps)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    for n in range(steps):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{n}", "type": "function", "function": {"name": "run", "arguments": f'{{"n": {n}}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": prose(rng, words)})
    return messages


def engine_over(store: FactLog, **overrides: Any) -> ContextEngine:
    history = HistoryManager(store, clock=lambda: 1000.0)
    settings = EngineSettings(**{"context_window": WINDOW, "precompact_threshold": 1.0, **overrides})  # no background
    return ContextEngine(history, settings, clock=lambda: 1000.0)


async def batch(engine: ContextEngine, messages: list[dict[str, Any]], prepared: Any = None) -> Any:
    hashes = [message_hash(m) for m in messages]
    state = await engine.history.state(KEY)
    if prepared is None:
        prepared = engine.view(messages, hashes, state, dialect=CHAT, window=WINDOW, tools=None, max_output=None,
                               fit=False)
    return await mask_batch(engine, KEY, messages, hashes, state, prepared, dialect=CHAT, model="m", window=WINDOW,
                            tools=None, max_output=None, moment=AFTER_A_GAP, rates=CacheRates()), prepared


async def test_a_batch_is_due_once_old_outputs_would_free_an_eighth_of_the_window(store: FactLog) -> None:
    engine = engine_over(store, keep_tool_output_share=1.0)  # ten kept by count: 4,000+ tokens pass the budget
    # 10 outputs are kept; each of about 400 tokens: 4 older ones free under 2,000 tokens, 6 free more.
    assert (await batch(engine, run(14)))[0] is None
    assert [f.kind for f in await read_log(store, KEY)] == [], "nothing due, nothing written"
    view, before = await batch(engine, run(16))
    assert view is not None and view.compacted == "proactive"
    facts = await read_log(store, KEY)
    assert [f.kind for f in facts].count("checkpoint") == 1 and "summary" not in {f.kind for f in facts}
    checkpoint = view.checkpoint
    assert (checkpoint.summary, checkpoint.retain_start_idx, checkpoint.masked_until) == ("", 1, 2 + 2 * 6 + 1)
    assert checkpoint.tokens_before == before.estimate.tokens and checkpoint.tokens_after == view.estimate.tokens
    assert before.estimate.tokens - view.estimate.tokens >= WINDOW // 8
    assert (await batch(engine, run(16)))[0] is None, "the batch is masked; the next one is not due yet"


async def test_a_batch_planned_on_a_stale_view_never_overwrites_a_newer_checkpoint(store: FactLog) -> None:
    one, other = engine_over(store), engine_over(store)  # two replicas
    messages = run(16)
    hashes = [message_hash(m) for m in messages]
    stale = other.view(messages, hashes, await other.history.state(KEY), dialect=CHAT, window=WINDOW, tools=None,
                       max_output=None, fit=False)  # planned before either wrote
    first, _ = await batch(one, messages)
    assert first is not None
    second, _ = await batch(other, messages, stale)
    assert second is not None and second.checkpoint == first.checkpoint, "it goes with the reduction made first"
    assert [f.kind for f in await read_log(store, KEY)].count("checkpoint") == 1


async def test_without_batches_masking_waits_for_the_threshold(store: FactLog) -> None:
    engine = engine_over(store, mask_batch_share=None)
    assert (await batch(engine, run(16)))[0] is None


def compactor(summariser: Summariser) -> ContextCompactor:
    policy = ContextBudgetPolicy(WINDOW)
    return ContextCompactor(SummaryGenerator(summariser), policy.counter_for(CHAT), clock=lambda: 5.0,
                            projection=ProjectionBuilder(CHAT), min_retain_rounds=2, measure=policy,
                            user_words_budget=1_600)


async def test_at_the_threshold_masking_comes_first_when_it_reaches_the_target() -> None:
    messages = run(24)
    hashes = [message_hash(m) for m in messages]
    summariser = Summariser()
    result = await compactor(summariser).compact(messages, hashes, None, budget=5_000, model="m", mask_target=8_000)
    assert result.outcome == "ok" and result.tier == "mask" and summariser.calls == 0
    assert result.checkpoint is not None and result.checkpoint.masked_until == len(messages) - 2 * 10 + 1
    assert result.tokens_after <= 8_000


async def test_when_masking_cannot_reach_the_target_a_summary_masks_its_tail_too() -> None:
    messages = run(40)  # masked stubs of 30 steps: enough for a summary to be worth its call
    hashes = [message_hash(m) for m in messages]
    summariser = Summariser()
    result = await compactor(summariser).compact(messages, hashes, None, budget=5_000, model="m", mask_target=500)
    assert result.outcome == "ok" and result.tier == "summary" and summariser.calls == 1
    checkpoint = result.checkpoint
    assert isinstance(checkpoint, Checkpoint)
    assert 2 < checkpoint.retain_start_idx < checkpoint.masked_until == len(messages) - 2 * 10 + 1
    assert checkpoint.round_start_idx == 1 and checkpoint.user_words == (), "the round's opener is still in view"
    assert checkpoint.covers == checkpoint.masked_until and checkpoint.matches(hashes)


async def test_a_batch_that_masks_a_read_carries_the_files_exact_text_into_the_view(store: FactLog) -> None:
    engine = engine_over(store, keep_tool_output_share=1.0)
    messages = run(16)
    text = prose(random.Random(1), 400) + "\n"  # a whole read, large enough to be masked
    messages[2:4] = [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "r", "type": "function", "function": {"name": "Read",
                                                         "arguments": '{"file_path": "/r/app.py"}'}}]},
        {"role": "tool", "tool_call_id": "r", "content": numbered(text)}]
    view, _ = await batch(engine, messages)
    assert view is not None and view.checkpoint.masked_until > 3, "the read's output is masked"
    shown = view.messages[1]["content"]
    assert f"### /r/app.py (current as of log entry 3)\n```\n{text}```" in shown
    logged = [f.extra["checkpoint"] for f in await read_log(store, KEY) if f.kind == "checkpoint"]
    assert logged[-1]["working_set"] == [["/r/app.py", 3, 3, 1, text.count("\n")]]


async def test_a_batch_lasts_several_steps_of_the_sessions_outputs(store: FactLog) -> None:
    # A batch the size of an eighth of the window is two outputs of ~1,000 tokens: the prompt prefix changed every
    # other step (18 times in 60 steps, bench.lasting). Waiting for five of the session's outputs, it holds longer.
    engine = engine_over(store)
    rng = random.Random(34)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    previous: list[Any] | None = None
    changes = 0
    for n in range(40):
        prepared = await prepare(engine, messages, Summariser())
        assert prepared.estimate.tokens <= WINDOW
        view = list(prepared.messages)
        changes += previous is not None and view[: len(previous)] != previous
        previous = view
        messages = [*messages, {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{n}", "type": "function", "function": {"name": "run", "arguments": f'{{"n": {n}}}'}}]},
                    {"role": "tool", "tool_call_id": f"c{n}", "content": prose(rng, 800)}]
    assert 0 < changes <= 40 // 5, changes
