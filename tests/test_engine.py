"""ContextEngine over a real store: the lock, checkpoints in the log, rewinds, failures that change nothing."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import orjson
import pytest

from proxy.context.checkpoint import Checkpoint, masking_checkpoint
from proxy.context.engine import MAX_POLICIES, ContextEngine, EngineSettings, active_checkpoint
from proxy.context.keep import userwords
from proxy.context.log.history import HistoryManager
from proxy.context.summary.summarizer import PROMPT_OVERHEAD_TOKENS, SummaryAnswer
from proxy.context.view.batches import checkpoint_fact
from proxy.context.view.budget import REPLY_PRIMING_TOKENS
from proxy.context.view.masking import KEEP_OUTPUTS_SHARE
from proxy.context.view.projection import SUMMARY_END
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.logs import JsonFormatter
from proxy.store.base import FactLog, SessionKey
from tests.fakeupstream import full_summary
from tests.proxyfixtures import MASKING_OFF, read_log
from tests.test_compaction_e2e import prose

KEY = SessionKey("tenant", "engine")
WINDOW = 4_000
#: A window whose hard limit lies well above the threshold: a view can pass the one and not the other.
ROOMY = {"context_window": 20_000, "compression_threshold": 0.1}


def conversation(rounds: int, seed: int = 1, question: int = 120) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for i in range(rounds):
        messages.append({"role": "user", "content": f"question {i} " + prose(rng, question)})
        messages.append({"role": "assistant", "content": f"answer {i} " + prose(rng, 120)})
    return messages


class Summariser:
    """A real summary function: counts calls, can block on an event or fail as told."""

    def __init__(self, answer: str = full_summary("the summary"), gate: asyncio.Event | None = None,
                 error: Exception | None = None) -> None:
        self.answer, self.gate, self.error = answer, gate, error
        self.calls = 0
        self.entered = asyncio.Event()
        self.prompts: list[list[dict[str, Any]]] = []
        self.max_tokens: list[int] = []

    async def __call__(self, messages: list[dict[str, Any]], max_tokens: int) -> SummaryAnswer:
        self.calls += 1
        self.prompts.append(messages)
        self.max_tokens.append(max_tokens)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return SummaryAnswer(self.answer)


def engine_over(store: FactLog, **overrides: Any) -> ContextEngine:
    """An engine that compacts in front of the request (no background jobs: tests/test_background.py has those)."""
    history = HistoryManager(store, clock=lambda: 1000.0)
    settings = EngineSettings(**{"context_window": WINDOW, "min_retain_rounds": 2, "summary_timeout": 5,
                                 "precompact_threshold": 1.0, **overrides})
    return ContextEngine(history, settings, clock=lambda: 1000.0)


async def prepare(engine: ContextEngine, messages: list[dict[str, Any]], complete: Any, key: SessionKey = KEY,
                  tools: list[dict[str, Any]] | None = None):
    hashes = [message_hash(m) for m in messages]
    state = await engine.history.sync(key, messages, hashes)
    return await engine.prepare(key, messages, hashes, state, dialect=CHAT, model="m", tools=tools, max_output=None,
                                complete=complete)


async def test_over_threshold_compacts_and_records_summary_then_checkpoint(store: FactLog) -> None:
    engine = engine_over(store)
    messages = conversation(20)
    summariser = Summariser()
    view = await prepare(engine, messages, summariser)
    assert view.compacted == "proactive" and view.changed
    assert view.estimate.tokens <= view.threshold
    assert view.messages[0] == messages[0]
    facts = await read_log(store, KEY)
    assert [f.kind for f in facts[-2:]] == ["summary", "checkpoint"]
    assert [f.message for f in facts if f.kind == "message"] == messages, "compaction never alters messages"
    checkpoint = facts[-1].extra["checkpoint"]
    assert checkpoint["retain_start_idx"] == facts[-1].index
    retained = messages[checkpoint["retain_start_idx"]:]
    assert view.messages[1] == {"role": "user",
                                "content": f"{facts[-2].message['content']}{SUMMARY_END}{retained[0]['content']}"}
    model_part, words = facts[-2].message["content"].split(f"\n\n{userwords.HEADING}\n\n")
    assert model_part.endswith(full_summary("the summary")), "the model's sections, then the user's words"
    assert "log entry 1" in words.split("\n")[0], "carried by the proxy, oldest first (400 tokens for 18: folded)"
    assert view.messages[2:] == retained[1:]


async def test_the_compaction_log_line_names_the_session(store: FactLog, caplog: pytest.LogCaptureFixture) -> None:
    """In text (``session=…``) and as the JSON line's fields: an operator greps a session's compactions."""
    caplog.set_level(logging.INFO, logger="proxy.context.engine")
    await prepare(engine_over(store), conversation(20), Summariser())
    [record] = [r for r in caplog.records if r.getMessage().startswith("compaction ")]
    assert record.getMessage().startswith(f"compaction session={KEY.session} trigger=proactive outcome=ok tokens ")
    fields = orjson.loads(JsonFormatter().format(record))
    assert {name: fields[name] for name in ("event", "session", "tenant", "trigger", "outcome", "tier")} == {
        "event": "compaction", "session": KEY.session, "tenant": KEY.tenant, "trigger": "proactive",
        "outcome": "ok", "tier": "summary"}
    assert fields["tokens_after"] < fields["tokens_before"]


async def test_a_second_process_sees_the_checkpoint(store: FactLog) -> None:
    messages = conversation(20)
    await prepare(engine_over(store), messages, Summariser())
    other = engine_over(store)  # a fresh process: nothing cached
    state = await other.history.state(KEY)
    assert active_checkpoint(state) is not None
    view = other.view(messages, [message_hash(m) for m in messages], state, dialect=CHAT, window=WINDOW,
                      tools=None, max_output=None)
    assert view.estimate.tokens <= view.threshold


async def test_one_compaction_at_a_time_across_engines(store: FactLog) -> None:
    a, b = engine_over(store), engine_over(store)  # two replicas sharing one store
    messages = conversation(20)
    gate = asyncio.Event()
    first = Summariser(gate=gate)
    second = Summariser()
    task_a = asyncio.create_task(prepare(a, messages, first))
    await asyncio.wait_for(first.entered.wait(), 10)
    task_b = asyncio.create_task(prepare(b, messages, second))
    gate.set()
    view_a, view_b = await asyncio.gather(task_a, task_b)
    assert first.calls >= 1 and second.calls == 0, "the waiting replica reused the running compaction"
    assert view_a.compacted == "proactive"
    assert view_b.checkpoint == view_a.checkpoint
    assert view_b.compacted == "proactive", "the view it sent was compacted, by the other replica"
    facts = await read_log(store, KEY)
    assert [f.kind for f in facts].count("checkpoint") == 1


@pytest.mark.parametrize("summariser", [
    Summariser(error=RuntimeError("upstream 500")),
    Summariser(answer="   "),
    Summariser(gate=asyncio.Event()),  # never answers: hits the summary timeout
], ids=["error", "empty", "hang"])
async def test_failed_summary_changes_nothing(store: FactLog, summariser: Summariser) -> None:
    """Past the threshold but under the hard limit: the view goes as it is, the log gains nothing."""
    engine = engine_over(store, **ROOMY, **({"summary_timeout": 0.05} if summariser.gate else {}))
    messages = conversation(10)
    view = await prepare(engine, messages, summariser)
    assert view.threshold < view.estimate.tokens <= view.limit
    assert view.compacted == "none" and not view.changed
    assert view.messages == messages
    facts = await read_log(store, KEY)
    assert {f.kind for f in facts} == {"message"}


@pytest.mark.parametrize("summariser", [
    Summariser(error=RuntimeError("upstream 500")),
    Summariser(answer="I'm sorry, but I can't help with that."),
    Summariser(gate=asyncio.Event()),
], ids=["error", "refusal", "hang"])
async def test_over_the_hard_limit_a_failed_summary_gives_way_to_the_model_free_tier(
        store: FactLog, summariser: Summariser) -> None:
    engine = engine_over(store, **({"summary_timeout": 0.05} if summariser.gate else {}))
    messages = conversation(20)
    view = await prepare(engine, messages, summariser)
    assert view.compacted == "proactive" and view.estimate.tokens <= view.limit and not view.clipped
    facts = await read_log(store, KEY)
    assert [f.message for f in facts if f.kind == "message"] == messages, "compaction never alters messages"
    assert [f.kind for f in facts[-2:]] == ["summary", "checkpoint"]
    checkpoint = Checkpoint.from_json(facts[-1].extra["checkpoint"])
    assert checkpoint.summary == "" and checkpoint.summary_end == 1, "nothing of the model's: no summary yet"
    assert f"Messages 1 to {checkpoint.retain_start_idx - 1} of this conversation (log entries 1 to " \
           f"{checkpoint.retain_start_idx - 1})" in checkpoint.elision
    assert userwords.HEADING in facts[-2].message["content"], "the user's words of the elided turns are carried"

    # The next compaction that gets a model summary folds the elided range back in.
    later = [*messages, *conversation(12, seed=2)[1:]]
    working = Summariser()
    await prepare(engine, later, working)
    assert "[#1 user]" in working.prompts[0][1]["content"], "the summary starts where the elided range does"
    folded = Checkpoint.from_json((await read_log(store, KEY))[-1].extra["checkpoint"])
    assert folded.summary == full_summary("the summary") and not folded.elision


async def test_three_failures_pause_proactive_compaction(store: FactLog) -> None:
    engine = engine_over(store, **ROOMY)
    # Short questions: a summary pays here (with long ones, the user's words it must carry ate what it freed, and
    # the compaction is judged not worth a call before it is made).
    messages = conversation(16, question=10)
    failing = Summariser(error=RuntimeError("down"))
    for _ in range(5):
        await prepare(engine, messages, failing)
    assert failing.calls == 3


async def test_with_the_backoff_open_a_view_over_the_limit_gets_the_model_free_tier_without_a_call(
        store: FactLog) -> None:
    engine = engine_over(store, max_failures=1)
    failing = Summariser(error=RuntimeError("down"))
    await prepare(engine, conversation(20), failing)
    assert failing.calls == 1
    longer = [*conversation(20), *conversation(14, seed=3)[1:]]
    view = await prepare(engine, longer, failing)
    assert failing.calls == 1, "the backoff is open: no summary call"
    assert view.estimate.tokens <= view.limit and view.checkpoint is not None and view.checkpoint.elision


async def test_an_edit_inside_the_covered_prefix_does_not_use_the_checkpoint_and_a_return_does(
        store: FactLog) -> None:
    engine = engine_over(store)
    messages = conversation(20)
    await prepare(engine, messages, Summariser())
    edited = [messages[0], {"role": "user", "content": "a different start"}]
    hashes = [message_hash(m) for m in edited]
    state = await engine.history.sync(KEY, edited, hashes)
    assert active_checkpoint(state) is None
    view = engine.view(edited, hashes, state, dialect=CHAT, window=WINDOW, tools=None, max_output=None)
    assert view.messages == edited and not view.changed
    facts = await read_log(store, KEY)
    assert facts[-2].kind == "rewind" and (facts[-2].index, facts[-2].extra["from_seq"]) == (1, 0)
    assert facts[-1].message == edited[1]
    # Back to the original conversation: its checkpoint applies again, before anything is logged.
    original = [message_hash(m) for m in messages]
    back = engine.view(messages, original, state, dialect=CHAT, window=WINDOW, tools=None, max_output=None)
    assert back.changed and back.checkpoint == active_checkpoint(await engine.history.sync(KEY, messages, original))
    assert len(await read_log(store, KEY)) == len(facts) + 1, "the return is one rewind"


# ---- item 11.10: the summary call is sized for the summary model's own window ------------------------------------


@pytest.mark.parametrize(("summary_model", "calls", "max_input", "max_output"), [
    (None, 1, 113_408, 8_192),  # the request's model (gpt-4o, 128,000 tokens) writes the summary
    ("gpt-4", 3, 5_735, 2_048),  # an 8,192-token model: more, smaller chunks and a smaller answer
])
async def test_summary_chunks_fit_the_summary_models_window(store: FactLog, summary_model: str | None, calls: int,
                                                            max_input: int, max_output: int) -> None:
    engine = ContextEngine(HistoryManager(store, clock=lambda: 1000.0),
                           EngineSettings(summary_model=summary_model, min_retain_rounds=2, precompact_threshold=1.0))
    messages = conversation(60)
    hashes = [message_hash(m) for m in messages]
    summariser = Summariser()
    result, _ = await engine.compact(KEY, messages, hashes, trigger="manual", dialect=CHAT, model="gpt-4o",
                                     complete=summariser, window=engine.window_for("gpt-4o"))
    assert result.outcome == "ok"
    assert summariser.calls == calls
    assert summariser.max_tokens == [max_output] * calls
    counter = TokenCounter()  # chunks are counted with the tokenizer, as the budget counts
    sizes = [counter.text_tokens("\n".join(m["content"] for m in prompt)) for prompt in summariser.prompts]
    assert max(sizes) <= max_input - PROMPT_OVERHEAD_TOKENS


async def test_tool_definitions_count_when_a_checkpoint_exists(store: FactLog) -> None:
    """The re-check after the lock left the tools out: with 1,200 tokens of schemas, views went over."""
    engine = engine_over(store)
    rng = random.Random(4)
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": prose(rng, 200)}}
             for i in range(6)]
    messages = conversation(14)
    summariser = Summariser()
    views = []
    for i in range(14, 30):
        messages += [{"role": "user", "content": f"question {i} " + prose(rng, 120)},
                     {"role": "assistant", "content": f"answer {i} " + prose(rng, 120)}]
        views.append(await prepare(engine, messages, summariser, tools=tools))
    assert engine.policy(WINDOW).tools_tokens(tools) > 1_200
    assert summariser.calls >= 3
    assert [v.estimate.tokens for v in views if v.estimate.tokens > v.threshold] == []


async def test_a_background_summary_that_lands_after_a_masking_batch_keeps_what_the_batch_masked(
        store: FactLog) -> None:
    engine = engine_over(store, **MASKING_OFF)  # only the batch masks
    rng = random.Random(7)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    for i in range(16):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        messages += [{"role": "assistant", "content": f"step {i}", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": prose(rng, 150)}]
    hashes = [message_hash(m) for m in messages]
    await engine.history.sync(KEY, messages, hashes)
    gate = asyncio.Event()
    held = Summariser(gate=gate)
    job = asyncio.create_task(engine.compact(KEY, messages, hashes, trigger="background", dialect=CHAT, model="m",
                                             complete=held, window=WINDOW))
    await asyncio.wait_for(held.entered.wait(), 10)
    # A masking batch lands meanwhile (it takes no lock), masking all but the last two outputs.
    batch = masking_checkpoint(None, len(messages) - 4, hashes, system_end=1, model="m", created_at=1000.0)
    await engine.history.append_proxy_facts(KEY, [checkpoint_fact(batch, tenant=None, made_from=None, tier="mask")])
    gate.set()
    result, state = await job
    assert result.outcome == "ok" and result.checkpoint is not None
    assert result.checkpoint.retain_start_idx < batch.masked_until, "the batch masks past the summary's split"
    final = active_checkpoint(state, hashes)
    assert final is not None and final.summary == full_summary("the summary")
    assert final.masked_until == batch.masked_until, "the summary did not unmask what the batch masked"


async def test_windows_learned_from_refusals_only_go_down_and_a_larger_success_raises_an_inferred_one(
        store: FactLog) -> None:
    engine = engine_over(store, context_window=64_000)
    engine.windows.refusal("m", 16_500)  # no figure: the window is below what was refused, less 5 %, rounded down
    assert engine.window_for("m") == 15_360 and engine.window_for("other") == 64_000
    engine.windows.refusal("m", 20_000)
    assert engine.window_for("m") == 15_360, "a refusal above the learned window does not raise it"
    engine.windows.success("m", 15_000)
    assert engine.window_for("m") == 15_360, "a success under it says nothing"
    engine.windows.success("m", 18_100)
    assert engine.window_for("m") == 18_432, "the bound was too low: just above what succeeded"
    engine.windows.success("m", 70_000)
    assert engine.window_for("m") == 64_000, "never above the configured window"
    engine.windows.learn("m", 12_000)  # stated by the upstream: its word stays
    engine.windows.success("m", 13_000)
    assert engine.window_for("m") == 12_000
    engine.windows.refusal("m", 1_000)
    assert engine.window_for("m") == 1_024, "bounded below like a stated window"


async def test_ten_kept_outputs_of_a_thousand_tokens_are_masked_before_any_background_summary(
        store: FactLog) -> None:
    """Ten ~1k-token outputs alone passed the soft threshold of a 16k window: a summary came at every step and
    masking never ran. Within their token budget (a quarter of the window) masking comes first."""
    engine = engine_over(store, context_window=16_000, precompact_threshold=0.6, min_retain_rounds=10,
                         keep_tool_output_share=KEEP_OUTPUTS_SHARE)
    model = Summariser()
    rng = random.Random(3)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    for i in range(30):
        await prepare(engine, messages, model)
        if engine.background.running(KEY) is not None:
            await engine.background.join(KEY)
        call = {"id": f"c{i}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        messages += [{"role": "assistant", "content": f"step {i}", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": prose(rng, 1_000)}]
    state = await engine.history.state(KEY, refresh=True)
    checkpoint = active_checkpoint(state, [message_hash(m) for m in messages])
    assert checkpoint is not None and checkpoint.masked_until > 0, "masking ran"
    assert model.calls == 0, "masking kept the run under the soft threshold: no summary"
    await engine.aclose()


async def test_the_policies_kept_per_window_are_bounded(sqlite_store: FactLog) -> None:
    """Windows come from what upstreams teach, any value: the engine keeps at most MAX_POLICIES of their policies,
    and one made again is what it was."""
    engine = engine_over(sqlite_store)
    first = engine.policy(2048)
    for window in range(4096, 4096 + 3 * MAX_POLICIES):
        engine.policy(window)
    assert len(engine._policies) == MAX_POLICIES
    assert 2048 not in engine._policies, "the oldest went first"
    again = engine.policy(2048)
    assert again is not first and again.threshold(None) == first.threshold(None)
    assert again.counter is first.counter, "the token counts stay shared"


async def test_a_sessions_routine_view_keeps_its_sums_for_the_next_step(sqlite_store: FactLog) -> None:
    """``prepare`` names the session to the token sum, which counts its next view from where the two part."""
    engine = engine_over(sqlite_store, context_window=1_000_000)
    messages = conversation(40)
    hashes = [message_hash(m) for m in messages]
    state = await engine.history.sync(KEY, messages, hashes)
    first = await engine.prepare(KEY, messages, hashes, state, dialect=CHAT, model="m", tools=None, max_output=None,
                                 complete=Summariser())
    kept = engine.counter.views.get(KEY)
    assert kept is not None and kept.digests == tuple(hashes)
    assert kept.sums[-1] + REPLY_PRIMING_TOKENS == first.estimate.tokenizer
