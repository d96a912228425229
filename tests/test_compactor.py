from __future__ import annotations

import asyncio
import copy
import hashlib
import itertools
import re
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.context.compactor import (
    Checkpoint,
    CompactionBackoff,
    CompactionResult,
    ContextCompactor,
    plan_retain_start,
    prefix_hash,
    retain_budget_for,
)
from proxy.context.items import leading_system_count, round_start_for
from proxy.context.summary.summarizer import SummaryAnswer, SummaryGenerator
from proxy.context.view.budget import ContextBudgetPolicy
from proxy.context.view.projection import (
    SUMMARY_END,
    SUMMARY_HEADER,
    ProjectionBuilder,
)
from proxy.context.view.tokens import chars_tokens
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.types import Message
from tests.fakeupstream import full_summary, role_error

COUNT = ContextBudgetPolicy(estimator="chars").counter_for(CHAT)
CREATED_AT = 1_700_000_000.5


class Model:
    """A summary model answering with a fixed text, recording the transcripts it was given."""

    def __init__(self, answer: str = "SUMMARY") -> None:
        self.answer = full_summary(answer)
        self.prompts: list[str] = []

    async def __call__(self, prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        self.prompts.append(prompt[1]["content"])
        return SummaryAnswer(self.answer)

    def indices(self) -> list[int]:
        return [int(n) for text in self.prompts for n in re.findall(r"^\[#(\d+) ", text, re.MULTILINE)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def compactor(model: object, *, rounds: int = 10, timeout: float = 120.0) -> ContextCompactor:
    return ContextCompactor(
        SummaryGenerator(model, timeout=timeout),  # type: ignore[arg-type]
        COUNT,
        clock=lambda: CREATED_AT,
        projection=ProjectionBuilder(CHAT),
        min_retain_rounds=rounds,
    )


def call(call_id: str) -> Message:
    return {"id": call_id, "type": "function", "function": {"name": "run", "arguments": "{}"}}


def chat(rounds: int, size: int = 300) -> list[Message]:
    """A system message, then ``rounds`` rounds of a user message and an answer, 100 tokens each."""
    messages: list[Message] = [{"role": "system", "content": "be brief"}]
    for i in range(rounds):
        messages.append({"role": "user", "content": f"{i:03d}" + "u" * (size - 3)})
        messages.append({"role": "assistant", "content": f"{i:03d}" + "a" * (size - 3)})
    return messages


#: One round of tool steps: 0 system, 1 user, 2/4/6 assistant calls, 3/5/7 results, 8 answer.
AGENT: list[Message] = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "do it"},
    {"role": "assistant", "content": None, "tool_calls": [call("a")]},
    {"role": "tool", "tool_call_id": "a", "content": "x"},
    {"role": "assistant", "content": None, "tool_calls": [call("b")]},
    {"role": "tool", "tool_call_id": "b", "content": "x"},
    {"role": "assistant", "content": None, "tool_calls": [call("c")]},
    {"role": "tool", "tool_call_id": "c", "content": "x"},
    {"role": "assistant", "content": "done"},
]
AGENT_COUNTS = [1, 10, 1, 5, 1, 5, 1, 5, 1]


def hashes_of(messages: Sequence[Message]) -> list[str]:
    return [message_hash(m) for m in messages]


# ---- plan_retain_start ------------------------------------------------------


def test_plan_keeps_the_last_rounds() -> None:
    messages = chat(12)
    assert plan_retain_start(CHAT, messages, [1] * 25, 10, 1000) == 5  # the user message of round 3


def test_plan_keeps_everything_when_there_are_few_rounds() -> None:
    assert plan_retain_start(CHAT, chat(10), [1] * 21, 10, 1000) == 1


def test_plan_drops_rounds_over_the_budget() -> None:
    assert plan_retain_start(CHAT, chat(12), [1] * 25, 10, 6) == 19  # three rounds of two messages


@pytest.mark.parametrize(
    ("budget", "start"),
    [
        (29, 1),  # the whole round fits
        (28, 4),  # 13 of steps + the re-inserted user message's 10 (from 2 it would be 19 + 10)
        (20, 6),  # 7 + 10
        (12, 8),  # 1 + 10
        (5, 8),  # nothing fits: the last step alone
    ],
)
def test_plan_splits_inside_a_round_at_assistant_steps(budget: int, start: int) -> None:
    assert plan_retain_start(CHAT, AGENT, AGENT_COUNTS, 10, budget) == start


def test_plan_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        plan_retain_start(CHAT, AGENT, [1], 10, 10)
    with pytest.raises(ValueError):
        plan_retain_start(CHAT, AGENT, AGENT_COUNTS, 0, 10)


def test_plan_of_a_conversation_with_nothing_to_split() -> None:
    assert plan_retain_start(CHAT, [{"role": "system"}], [1], 10, 10) == 1
    assert plan_retain_start(CHAT, [], [], 10, 10) == 0


def test_retain_budget_for() -> None:
    assert retain_budget_for(128_000) == 44_800
    assert retain_budget_for(10, 0.01) == 1


# ---- Checkpoint ---------------------------------------------------------------


CHECKPOINT = Checkpoint("sum", 5, "abc", 3, 900, 300, "gpt-4o", 12.5)


def test_checkpoint_json_round_trip() -> None:
    text = CHECKPOINT.to_json()
    assert text == (
        '{"artifacts":[],"created_at":12.5,"elision":"","masked_until":0,"model":"gpt-4o","prefix_hash":"abc",'
        '"retain_start_idx":5,"round_start_idx":3,"summarised_until":-1,"summary":"sum","tokens_after":300,'
        '"tokens_before":900,"trail":"","user_words":[],"v":3}'
    )
    assert Checkpoint.from_json(text) == CHECKPOINT
    assert Checkpoint.from_json(text.encode()) == CHECKPOINT
    assert Checkpoint.from_json({**CHECKPOINT.__dict__, "v": 2}) == CHECKPOINT
    tiered = Checkpoint("sum", 5, "abc", 3, 900, 300, "gpt-4o", 12.5, 9, ((2, 7, 3, "use tabs", 1),))
    assert Checkpoint.from_json(tiered.to_json()) == tiered, "lists read back as the tuples the dataclass holds"
    elided = Checkpoint("sum", 9, "abc", None, 900, 300, "gpt-4o", 12.5, summarised_until=4, elision="## Not shown",
                        artifacts=(("file", "a.py", "edited", 3, 7),), trail="## Artifact trail")
    assert Checkpoint.from_json(elided.to_json()) == elided
    assert elided.summary_end == 4 and CHECKPOINT.summary_end == 5
    assert elided.view_key != replace(elided, trail="").view_key, "the proxy's own text is part of the view"


def test_a_version_2_checkpoint_reads_as_one_without_an_elided_range_or_a_trail() -> None:
    text = ('{"created_at":12.5,"masked_until":0,"model":"gpt-4o","prefix_hash":"abc","retain_start_idx":5,'
            '"round_start_idx":3,"summary":"sum","tokens_after":300,"tokens_before":900,"user_words":[],"v":2}')
    assert Checkpoint.from_json(text) == CHECKPOINT
    assert CHECKPOINT.view_key == "5:abc:" + CHECKPOINT.view_key.split(":")[2], "version 2 keys stay as they were"


def test_a_version_1_checkpoint_reads_as_one_that_neither_masks_nor_carries_words() -> None:
    text = ('{"created_at":12.5,"model":"gpt-4o","prefix_hash":"abc","retain_start_idx":5,"round_start_idx":3,'
            '"summary":"sum","tokens_after":300,"tokens_before":900,"v":1}')
    assert Checkpoint.from_json(text) == CHECKPOINT
    assert CHECKPOINT.covers == 5 and not CHECKPOINT.masks
    assert CHECKPOINT.view_key == f"5:abc:{hashlib.blake2b(b'sum', digest_size=8).hexdigest()}", "as version 1 had it"


@pytest.mark.parametrize(
    "data",
    [
        '{"v": 2}',
        '{"v": 1, "summary": "s"}',
        "[]",
        '{"created_at":1,"model":"m","prefix_hash":"",'
        '"retain_start_idx":"5","round_start_idx":null,"summary":"s","tokens_after":1,"tokens_before":1,"v":1}',
        '{"created_at":1,"model":"m","prefix_hash":"","masked_until":"3",'
        '"retain_start_idx":5,"round_start_idx":null,"summary":"s","tokens_after":1,"tokens_before":1,"v":2}',
        '{"created_at":1,"model":"m","prefix_hash":"","user_words":[[1, 2]],'
        '"retain_start_idx":5,"round_start_idx":null,"summary":"s","tokens_after":1,"tokens_before":1,"v":2}',
        '{"created_at":1,"model":"m","prefix_hash":"",'
        '"retain_start_idx":5,"round_start_idx":null,"summary":"s","tokens_after":1,"tokens_before":1,"v":4}',
        '{"created_at":1,"model":"m","prefix_hash":"","elision":7,'
        '"retain_start_idx":5,"round_start_idx":null,"summary":"s","tokens_after":1,"tokens_before":1,"v":3}',
    ],
)
def test_malformed_checkpoints_raise(data: str) -> None:
    with pytest.raises(ValueError):
        Checkpoint.from_json(data)


def test_checkpoint_matches_its_prefix_only() -> None:
    hashes = hashes_of(chat(3))
    checkpoint = Checkpoint("s", 3, prefix_hash(hashes, 3), None, 0, 0, "m", 0.0)
    assert checkpoint.matches(hashes)
    assert checkpoint.matches(hashes[:3])
    assert not checkpoint.matches(hashes[:2])
    assert not checkpoint.matches([hashes[0], "edited", *hashes[2:]])
    assert checkpoint.matches([*hashes[:3], "anything after the prefix"])


def test_view_key_names_summary_and_split() -> None:
    keys = {CHECKPOINT.view_key, Checkpoint("other", 5, "abc", 3, 0, 0, "m", 0.0).view_key}
    keys.add(Checkpoint("sum", 6, "abc", 3, 0, 0, "m", 0.0).view_key)
    assert len(keys) == 3
    assert Checkpoint("sum", 5, "abc", None, 1, 1, "other model", 99.0).view_key == CHECKPOINT.view_key


# ---- CompactionBackoff ---------------------------------------------------------


def test_backoff_after_three_failures_until_the_cooldown_ends() -> None:
    clock = Clock()
    backoff = CompactionBackoff(clock=clock, max_failures=3, cooldown=300.0)
    for outcome in ("failed", "timeout"):
        backoff.record("s", outcome)
        assert backoff.allowed("s")
    backoff.record("s", "failed")
    assert not backoff.allowed("s")
    assert backoff.allowed("other session")
    clock.now = 299.9
    assert not backoff.allowed("s")
    clock.now = 300.0
    assert backoff.allowed("s")
    backoff.record("s", "failed")  # a fresh set of attempts after the cool-down
    assert backoff.allowed("s")


def test_backoff_counts_consecutive_failures_only() -> None:
    backoff = CompactionBackoff(clock=Clock())
    for outcome in ("failed", "failed", "ok", "failed", "skipped", "failed"):
        backoff.record("s", outcome)
    assert backoff.allowed("s")
    backoff.record("s", "timeout")
    assert not backoff.allowed("s")


def test_backoff_forgets_the_oldest_sessions_past_its_bound() -> None:
    backoff = CompactionBackoff(clock=Clock(), max_failures=1, max_sessions=2)
    for key in ("a", "b", "c"):
        backoff.record(key, "failed")
    assert [backoff.allowed(k) for k in ("a", "b", "c")] == [True, False, False]


# ---- ContextCompactor.compact -------------------------------------------------------


async def test_compaction_summarises_what_leaves_the_tail() -> None:
    messages = chat(12)
    before = copy.deepcopy(messages)
    hashes = hashes_of(messages)
    model = Model()
    result = await compactor(model).compact(messages, hashes, None, budget=10_000, model="gpt-4o")
    # The summary leads the first retained user message: 300 characters, plus the summary's.
    led = chars_tokens(len(f"{SUMMARY_HEADER}\n\n{full_summary('SUMMARY')}{SUMMARY_END}") + 300)
    expected = Checkpoint(full_summary("SUMMARY"), 5, prefix_hash(hashes, 5), None, 2403, 3 + led + 1900, "gpt-4o",
                          CREATED_AT)
    assert result == CompactionResult("ok", expected, 2403, 3 + led + 1900)
    assert model.indices() == [1, 2, 3, 4]
    assert messages == before


async def test_a_second_compaction_rolls_the_previous_summary_forward() -> None:
    messages = chat(16)
    hashes = hashes_of(messages)
    first = Checkpoint("FIRST", 5, prefix_hash(hashes, 5), None, 0, 0, "m", 0.0)
    model = Model("SECOND")
    result = await compactor(model).compact(messages, hashes, first, budget=10_000, model="m")
    assert result.checkpoint is not None
    assert result.checkpoint.retain_start_idx == 13
    assert result.checkpoint.summary == "FIRST\n" + full_summary("SECOND")  # an update: the previous one is kept
    assert model.indices() == list(range(5, 13))
    assert model.prompts[0].startswith("<previous-summary>\nFIRST\n</previous-summary>")


async def test_a_checkpoint_of_another_history_is_ignored() -> None:
    messages = chat(12)
    stale = Checkpoint("STALE", 3, "not this prefix", None, 0, 0, "m", 0.0)
    model = Model()
    result = await compactor(model).compact(messages, hashes_of(messages), stale, budget=10_000, model="m")
    assert result.outcome == "ok"
    assert model.indices() == [1, 2, 3, 4]
    assert "STALE" not in model.prompts[0]


async def test_nothing_to_summarise_is_skipped_without_a_call() -> None:
    model = Model()
    result = await compactor(model).compact(chat(10), hashes_of(chat(10)), None, budget=10_000, model="m")
    assert result == CompactionResult("skipped", None, 2003, 2003, "nothing new to summarise")
    assert model.prompts == []


async def test_a_compaction_that_frees_little_is_skipped_without_a_call() -> None:
    model = Model()
    messages = chat(11)  # one round of eleven would leave: 200 of 2203 tokens, under 10 %
    result = await compactor(model).compact(messages, hashes_of(messages), None, budget=10_000, model="m")
    assert result == CompactionResult("skipped", None, 2203, 2203, "would free under 10%")
    assert model.prompts == []


async def test_a_summary_too_long_to_help_is_skipped() -> None:
    messages = chat(12)
    result = await compactor(Model("s" * 1200)).compact(messages, hashes_of(messages), None, budget=10_000, model="m")
    assert result.outcome == "skipped"
    assert result.checkpoint is None
    assert result.tokens_after > 0.9 * result.tokens_before


async def test_summary_failure_changes_nothing() -> None:
    async def broken(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        raise RuntimeError("upstream 500")

    messages = chat(12)
    result = await compactor(broken).compact(messages, hashes_of(messages), None, budget=10_000, model="m")
    assert result == CompactionResult("failed", None, 2403, 2403, "RuntimeError: upstream 500")


async def test_summary_timeout_changes_nothing() -> None:
    never = asyncio.Event()

    async def hangs(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        await never.wait()
        return SummaryAnswer("late")

    messages = chat(12)
    result = await compactor(hangs, timeout=0.01).compact(messages, hashes_of(messages), None, budget=10_000, model="m")
    assert (result.outcome, result.checkpoint) == ("timeout", None)


async def test_a_long_round_is_split_at_a_step_and_keeps_its_user_message() -> None:
    messages: list[Message] = [AGENT[0], {"role": "user", "content": "u" * 30}]
    for i in range(20):
        messages.append({"role": "assistant", "content": None, "tool_calls": [call(str(i))]})
        messages.append({"role": "tool", "tool_call_id": str(i), "content": "r" * 297})
    result = await compactor(Model()).compact(messages, hashes_of(messages), None, budget=1000, model="m")
    checkpoint = result.checkpoint
    assert checkpoint is not None
    # Nine steps of 102 tokens (2 for the call, 100 for its result) and the user message's 10 fit in 1000.
    assert [COUNT(m) for m in messages[1:4]] == [10, 2, 100]
    assert (checkpoint.retain_start_idx, checkpoint.round_start_idx) == (24, 1)
    view = ProjectionBuilder(CHAT).build(messages, checkpoint)
    assert view[1]["content"].endswith(SUMMARY_END + messages[1]["content"])
    assert view[2:] == messages[24:]


async def test_each_level_shrinks_the_tail() -> None:
    messages = chat(12)
    hashes = hashes_of(messages)
    starts = []
    for level in (0, 1, 2):
        result = await compactor(Model()).compact(messages, hashes, None, budget=2000, model="m", level=level)
        assert result.checkpoint is not None
        starts.append(result.checkpoint.retain_start_idx)
    assert starts == [5, 15, 21]  # 10 rounds in 2000 tokens; 5 rounds in 1000; 2 rounds in 500


async def test_a_view_over_the_window_compacts_for_any_gain() -> None:
    messages = chat(11)  # retiring one round of eleven frees 200 of 2203 tokens: under 10 %
    hashes = hashes_of(messages)
    assert (await compactor(Model()).compact(messages, hashes, None, budget=10_000, model="m")).outcome == "skipped"
    result = await compactor(Model()).compact(messages, hashes, None, budget=10_000, model="m", min_gain=0.0)
    assert result.outcome == "ok"
    assert result.checkpoint is not None and result.checkpoint.retain_start_idx == 3


async def test_a_summary_longer_than_what_it_replaces_is_skipped_even_without_a_minimum_gain() -> None:
    messages = chat(11)
    result = await compactor(Model("s" * 3000)).compact(messages, hashes_of(messages), None, budget=10_000,
                                                        model="m", min_gain=0.0)
    assert result.outcome == "skipped" and result.tokens_after > result.tokens_before


# ---- properties over random conversations -------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """System first; rounds of a user message and assistant steps with 0-3 parallel calls and their results."""

    def text() -> str:
        return draw(st.sampled_from(["a", "bc ", "字"])) * draw(st.integers(0, 1200))

    ids = itertools.count()
    messages: list[Message] = [{"role": "system", "content": text()} for _ in range(draw(st.integers(0, 2)))]
    for _ in range(draw(st.integers(1, 14))):
        messages.append({"role": "user", "content": text()})
        for _ in range(draw(st.integers(0, 6))):
            calls = [call(f"call_{next(ids)}") for _ in range(draw(st.integers(0, 3)))]
            if not calls:
                messages.append({"role": "assistant", "content": text()})
                continue
            messages.append(
                {"role": "assistant", "content": draw(st.sampled_from([None, "", "let me look"])), "tool_calls": calls}
            )
            messages.extend({"role": "tool", "tool_call_id": c["id"], "content": text()} for c in calls)
    return messages


def assert_well_formed(view: Sequence[Message], had_system: bool, strict: bool = False) -> None:
    """System first and only first; each tool result right after its call batch; no call left unanswered.

    ``strict``: also what strict chat templates demand (the conversation itself met it).
    """
    assert not strict or role_error(list(view)) is None, role_error(list(view))
    assert (view[0]["role"] == "system") is had_system or (not had_system and view[0]["role"] != "system")
    open_calls: set[str] = set()
    seen_other = False
    for message in view:
        role = message["role"]
        if role in ("system", "developer"):
            assert not seen_other, "system message after the start"
            continue
        seen_other = True
        if role == "tool":
            assert message["tool_call_id"] in open_calls, "tool result without its call right before"
            open_calls.remove(message["tool_call_id"])
            continue
        assert not open_calls, f"unanswered calls {open_calls}"
        open_calls = {c["id"] for c in message.get("tool_calls") or ()}
    assert not open_calls, f"unanswered calls {open_calls}"


def tail_cost(messages: Sequence[Message], counts: Sequence[int], start: int) -> int:
    opener = round_start_for(CHAT, messages, start)
    return sum(counts[start:]) + (counts[opener] if opener is not None else 0)


def cuts_of(messages: Sequence[Message]) -> list[int]:
    return [i for i in range(leading_system_count(CHAT, messages), len(messages)) if messages[i]["role"] != "tool"]


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(conversations(), st.integers(1, 12), st.integers(1, 4000))
def test_plan_is_well_formed_and_fits_when_any_split_fits(messages: list[Message], rounds: int, budget: int) -> None:
    counts = [COUNT(m) for m in messages]
    start = plan_retain_start(CHAT, messages, counts, rounds, budget)
    cuts = cuts_of(messages)
    assert start in cuts
    if any(tail_cost(messages, counts, i) <= budget for i in cuts):
        assert tail_cost(messages, counts, start) <= budget
    users = [i for i in cuts if messages[i]["role"] == "user"]
    if len(users) > rounds and tail_cost(messages, counts, users[-rounds]) <= budget:
        assert start == users[-rounds]
    checkpoint = Checkpoint("s", start, "", round_start_for(CHAT, messages, start), 0, 0, "m", 0.0)
    for placement in ("user", "system"):
        view = ProjectionBuilder(CHAT, summary_placement=placement).build(messages, checkpoint)
        assert_well_formed(view, had_system=bool(leading_system_count(CHAT, messages)) or placement == "system",
                           strict=role_error(messages) is None)


@PROPERTY
@given(
    conversations(),
    st.integers(0, 2),
    st.integers(50, 6000),
    st.sampled_from(["user", "system"]),
)
def test_compaction_is_well_formed_fits_and_leaves_its_input_alone(
    messages: list[Message], level: int, budget: int, placement: str
) -> None:
    original = copy.deepcopy(messages)
    hashes = hashes_of(messages)
    projection = ProjectionBuilder(CHAT, summary_placement=placement)  # type: ignore[arg-type]
    model = Model("summary of the work so far")
    engine = ContextCompactor(
        SummaryGenerator(model), COUNT, clock=lambda: 0.0, projection=projection, min_retain_rounds=3
    )
    had_system = bool(leading_system_count(CHAT, messages))

    result = asyncio.run(engine.compact(messages, hashes, None, budget=budget, model="m", level=level))
    assert messages == original
    assert_well_formed(projection.build(messages, None), had_system)
    first = result.checkpoint
    if first is None:
        assert result.outcome == "skipped"
        return
    strict = role_error(messages) is None
    assert_well_formed(projection.build(messages, first), had_system or (placement == "system" and first.summarises),
                       strict)
    counts = engine.tail_counts(messages, hashes, first.masked_until, (), ())  # the tail is budgeted as shown
    effective = budget >> level
    if result.tier == "mask":  # the summary was not worth its call; masking alone freed enough
        assert first.summary == "" and not model.prompts and first.masks
    elif any(tail_cost(messages, counts, i) <= effective for i in cuts_of(messages)):
        assert tail_cost(messages, counts, first.retain_start_idx) <= effective
    assert result.tokens_after == sum(COUNT(m) for m in projection.build(messages, first))

    model.prompts.clear()
    again = asyncio.run(engine.compact(messages, hashes, first, budget=budget, model="m", level=level + 1))
    assert messages == original
    if again.checkpoint is not None:
        assert again.checkpoint.covers > first.covers, "every reduction goes further than the one before"
        if again.tier == "summary":
            assert again.checkpoint.retain_start_idx > first.retain_start_idx
            assert set(model.indices()) == set(range(first.retain_start_idx, again.checkpoint.retain_start_idx))
            if first.summary:
                assert model.prompts[0].startswith(f"<previous-summary>\n{model.answer}\n")
        else:
            assert not model.prompts and again.checkpoint.summary == first.summary
        assert_well_formed(projection.build(messages, again.checkpoint),
                           had_system or (placement == "system" and again.checkpoint.summarises), strict)


# ---- the model-free tier and what a failed summary keeps (issue 18, items 2 and 7) -------------------------------


def tool_loop(steps: int, size: int = 600) -> list[Message]:
    """One round of ``steps`` tool calls with large outputs: only masking and summaries can shrink it."""
    messages: list[Message] = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    for i in range(steps):
        messages += [{"role": "assistant", "content": f"step {i}", "tool_calls": [call(f"c{i}")]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": f"{i:03d}" + "o" * size}]
    return messages


async def broken(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
    raise RuntimeError("upstream 500")


async def test_a_failed_summary_keeps_the_masking_the_same_compaction_computed() -> None:
    messages = tool_loop(20)
    masking = ContextCompactor(SummaryGenerator(broken), COUNT, clock=lambda: CREATED_AT,
                               projection=ProjectionBuilder(CHAT), min_retain_rounds=1, keep_tool_outputs=3)
    result = await masking.compact(messages, hashes_of(messages), None, budget=600, model="m", mask_target=10)
    assert result.outcome == "ok" and result.tier == "mask" and result.checkpoint is not None
    assert result.summary_error == "RuntimeError: upstream 500", "the backoff still hears of the failure"
    assert result.tokens_after < result.tokens_before


async def test_with_fallback_a_failed_summary_gives_the_model_free_checkpoint() -> None:
    messages = chat(12)
    seqs = list(range(100, 100 + len(messages)))
    result = await compactor(broken).compact(messages, hashes_of(messages), None, budget=600, model="m",
                                             fallback=True, seqs=seqs)
    assert result.outcome == "fallback" and result.tier == "fallback" and result.checkpoint is not None
    checkpoint = result.checkpoint
    assert checkpoint.summary == "" and checkpoint.summary_end == 1 < checkpoint.retain_start_idx
    last = checkpoint.retain_start_idx - 1
    assert f"Messages 1 to {last} of this conversation (log entries 101 to {100 + last})" in checkpoint.elision
    assert result.tokens_after < result.tokens_before
    view = ProjectionBuilder(CHAT).build(messages, checkpoint)
    assert role_error(view) is None and checkpoint.elision in view[1]["content"]


async def test_with_the_model_not_asked_the_model_free_tier_makes_no_call() -> None:
    model = Model()
    messages = chat(12)
    result = await compactor(model).compact(messages, hashes_of(messages), None, budget=600, model="m",
                                            fallback=True, use_model=False)
    assert result.outcome == "fallback" and model.prompts == []


async def test_a_model_summary_after_the_model_free_tier_folds_the_elided_range_back_in() -> None:
    messages = chat(12)
    hashes = hashes_of(messages)
    elided = (await compactor(broken).compact(messages, hashes, None, budget=600, model="m", fallback=True)).checkpoint
    assert elided is not None
    model = Model()
    # The split stays where it is: the summary covers the elided range, and the marker goes.
    result = await compactor(model, rounds=3).compact(messages, hashes, elided, budget=600, model="m")
    assert result.outcome == "ok" and result.checkpoint is not None
    assert model.indices()[0] == 1, "the summary starts where the elided range does"
    assert result.checkpoint.retain_start_idx == elided.retain_start_idx
    assert not result.checkpoint.elision and result.checkpoint.summary_end == elided.retain_start_idx


async def test_the_gain_is_measured_against_the_whole_request_fixed_part_included() -> None:
    messages = chat(13)  # three rounds leave the tail: worth a summary measured on the messages alone
    worth = await compactor(Model()).compact(messages, hashes_of(messages), None, budget=10_000, model="m")
    assert worth.outcome == "ok"
    model = Model()
    # Beside 5,000 tokens of tool definitions and answer room the same gain is under a tenth of what is sent.
    result = await compactor(model).compact(messages, hashes_of(messages), None, budget=10_000, model="m",
                                            fixed=5_000)
    assert (result.outcome, result.detail) == ("skipped", "would free under 10%")
    assert model.prompts == [], "skipped before the summary call"
    over = await compactor(Model()).compact(messages, hashes_of(messages), None, budget=10_000, model="m",
                                            fixed=5_000, min_gain=0.0)
    assert over.outcome == "ok", "over the window any gain counts, as before"



# ---- compactions that last (issue 19, item 7) -----------------------------------------------------------------


def test_a_last_step_over_the_budget_keeps_the_step_before_when_that_one_fits() -> None:
    """Counted as the view shows them (a masked step is its placeholders), the step before an over-budget last step
    stays in the tail: a tail of the last step alone began with the output the next step masks."""
    assert plan_retain_start(CHAT, AGENT, AGENT_COUNTS, 10, 6) == 6  # 1 + 5 fit; 8 alone would be the tail
    assert plan_retain_start(CHAT, AGENT, AGENT_COUNTS, 10, 5) == 8  # the step before does not fit either


async def test_the_tail_is_budgeted_in_the_tokens_the_view_shows() -> None:
    """Outputs already masked cost their placeholders in the tail's budget, so a summary keeps the masked steps
    before the last one instead of a tail of the last step alone."""
    messages = tool_loop(12, size=2_000)
    hashes = hashes_of(messages)
    masking = ContextCompactor(SummaryGenerator(Model()), COUNT, clock=lambda: CREATED_AT,  # type: ignore[arg-type]
                               projection=ProjectionBuilder(CHAT), min_retain_rounds=1, keep_tool_outputs=1)
    result = await masking.compact(messages, hashes, None, budget=900, model="m")  # the last step is 674
    assert result.outcome == "ok" and result.checkpoint is not None and result.checkpoint.summary
    checkpoint = result.checkpoint
    kept = len(messages) - checkpoint.retain_start_idx
    assert kept > 2, "more than the last step"
    assert checkpoint.masked_until > checkpoint.retain_start_idx, "the steps kept before it are masked"
    shown = masking.tail_counts(messages, hashes, checkpoint.masked_until, (), ())[checkpoint.retain_start_idx:]
    whole = masking.message_counts(messages, hashes)[checkpoint.retain_start_idx:]
    assert sum(shown) + 1 <= 900 < sum(whole), "within the budget as shown (with the re-inserted 'go'), not whole"


async def test_a_summary_whose_carried_words_eat_its_gain_is_not_asked_for() -> None:
    """The worth test counts what the checkpoint will carry (the user's words) and the summary itself: judged
    without them, the call was made and its answer thrown away ("summary left it over 90%")."""
    messages = chat(13)
    model = Model()
    carrying = ContextCompactor(SummaryGenerator(model), COUNT, clock=lambda: CREATED_AT,  # type: ignore[arg-type]
                                projection=ProjectionBuilder(CHAT), min_retain_rounds=10,
                                measure=ContextBudgetPolicy(estimator="chars"), user_words_budget=1_000)
    result = await carrying.compact(messages, hashes_of(messages), None, budget=10_000, model="m")
    assert (result.outcome, result.detail) == ("skipped", "would free under 10%")
    assert model.prompts == [], "no call whose answer could not be used"
