from __future__ import annotations

import orjson
import pytest

from proxy.context.view.budget import (
    DEFAULT_ESTIMATOR,
    REPLY_PRIMING_TOKENS,
    ContextBudgetPolicy,
    Estimate,
    UsageSample,
    retry_limit,
)
from proxy.context.view.tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash


class WordEncoding:
    def encode_ordinary(self, text: str) -> list[int]:
        return [0] * len(text.split())


def policy(estimator: str = "chars", **kwargs: object) -> ContextBudgetPolicy:
    return ContextBudgetPolicy(estimator=estimator, counter=TokenCounter(WordEncoding()), **kwargs)  # type: ignore[arg-type]


VIEW = [
    {"role": "system", "content": "s" * 30},  # 30 chars
    {"role": "user", "content": "one two three"},  # 13 chars
]


def test_default_estimator_is_the_tokenizer() -> None:
    assert DEFAULT_ESTIMATOR == "tokenizer"
    assert ContextBudgetPolicy().estimator == "tokenizer"


def test_threshold_is_a_share_of_the_window() -> None:
    assert ContextBudgetPolicy().threshold() == 102_400
    assert ContextBudgetPolicy(8192, 0.5).threshold() == 4096


def test_threshold_leaves_room_for_the_requested_answer() -> None:
    budget = ContextBudgetPolicy()
    assert budget.threshold(4096) == 102_400  # 123904 left: the share is the tighter limit
    assert budget.threshold(40_000) == 88_000
    # An answer reservation that fills the window cannot be helped by compacting.
    assert budget.threshold(128_000) == 102_400
    assert budget.threshold(200_000) == 102_400


def test_requested_output_tokens() -> None:
    assert CHAT.max_output({}) is None
    assert CHAT.max_output({"max_tokens": 100}) == 100
    assert CHAT.max_output({"max_tokens": 100, "max_completion_tokens": 200}) == 200
    assert CHAT.max_output({"max_completion_tokens": None, "max_tokens": 100}) == 100
    assert CHAT.max_output({"max_tokens": True}) is None
    assert CHAT.max_output({"max_tokens": 0}) is None
    assert CHAT.max_output({"max_tokens": "100"}) is None


@pytest.mark.parametrize(
    "kwargs", [{"context_window": 0}, {"compression_threshold": 0}, {"compression_threshold": 1.5}]
)
def test_invalid_settings_raise(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ContextBudgetPolicy(**kwargs)  # type: ignore[arg-type]


def test_unknown_estimator_raises() -> None:
    with pytest.raises(ValueError, match="estimator must be one of chars, tokenizer, max"):
        ContextBudgetPolicy(estimator="guess")


def test_chars_estimate_counts_tool_definitions() -> None:
    tools = [{"type": "function"}]  # 21 characters of JSON
    assert policy().estimate(CHAT, VIEW) == Estimate(tokens=15, chars=15, usage=None, tokenizer=None)
    assert policy().estimate(CHAT, VIEW, tools=tools) == Estimate(tokens=22, chars=22, usage=None, tokenizer=None)


def test_tokenizer_estimate() -> None:
    expected = 1 + 3 + 2 * MESSAGE_OVERHEAD_TOKENS + REPLY_PRIMING_TOKENS
    assert policy("tokenizer").estimate(CHAT, VIEW) == Estimate(tokens=expected, chars=None, usage=None,
                                                                tokenizer=expected)


def test_max_estimate_takes_the_larger() -> None:
    words = [{"role": "user", "content": "a b c d e f g h i j"}]
    assert policy("max").estimate(CHAT, words) == Estimate(tokens=17, chars=7, usage=None, tokenizer=17)
    blob = [{"role": "user", "content": "x" * 90}]
    assert policy("max").estimate(CHAT, blob) == Estimate(tokens=30, chars=30, usage=None, tokenizer=8)


def test_usage_of_the_same_base_plus_what_was_added() -> None:
    sample = UsageSample.of(CHAT, 500, VIEW, "base")
    grown = [*VIEW, {"role": "assistant", "content": "x" * 9}]
    estimate = policy().estimate(CHAT, grown, usage=sample, view_key="base")
    assert estimate == Estimate(tokens=503, chars=18, usage=503, tokenizer=None)


def test_what_was_added_since_the_usage_is_counted_by_the_tokenizer() -> None:
    sample = UsageSample.of(CHAT, 500, VIEW, "base")
    result = {"role": "tool", "tool_call_id": "c", "content": "word " * 300}  # 1,500 characters, 300 words
    estimate = policy("tokenizer").estimate(CHAT, [*VIEW, result], usage=sample, view_key="base")
    assert estimate.usage == 500 + (300 + 1 + MESSAGE_OVERHEAD_TOKENS)  # characters ÷ 3 said 500 + 502
    assert estimate.tokens == estimate.usage


def test_echoed_reasoning_is_counted() -> None:
    counter = TokenCounter(WordEncoding())
    plain = {"role": "assistant", "content": "done"}
    reasoning = {**plain, "reasoning_content": "first I read the file then I ran the tests"}
    assert counter.message_tokens(CHAT, plain) == 1 + MESSAGE_OVERHEAD_TOKENS
    # Same identity (the hash leaves reasoning out), not the same count.
    assert counter.message_tokens(CHAT, reasoning) == 1 + 10 + MESSAGE_OVERHEAD_TOKENS
    assert counter.count_many(CHAT, [plain, reasoning], ["same", "same"]) == 2 + 10 + 2 * MESSAGE_OVERHEAD_TOKENS
    assert policy("chars").message_tokens(CHAT, reasoning) == 16  # 4 + 42 characters


def test_hard_limit_is_the_window_less_the_answer_reserve() -> None:
    budget = ContextBudgetPolicy(8_000)
    assert budget.hard_limit(5_500) == 2_500
    assert budget.threshold(5_500) == 2_500
    assert budget.hard_limit(8_000) == 8_000  # nothing fits beside it: left for the upstream to refuse
    assert budget.hard_limit() == 6_400  # no max_tokens: the window above the threshold, at most 4,096
    assert ContextBudgetPolicy().hard_limit() == 128_000 - 4_096
    assert ContextBudgetPolicy(8_000, 1.0).hard_limit() == 8_000


def test_tail_budget_leaves_room_under_the_effective_threshold() -> None:
    budget = policy("tokenizer")
    head = [{"role": "system", "content": "w " * 296}]  # 300 tokens with the message overhead
    fits = {"head": head, "head_hashes": [message_hash(head[0])], "tools": None}
    measured = Estimate(2_000, None, None, 2_000)
    assert budget.tail_budget(CHAT, measured, 102_400, 44_800, summary=None, **fits) == 44_800  # the window's share
    # Window 8,000 with max_tokens 5,500: threshold 2,500; beside the 300 of the system message no compaction
    # frees, the view after compaction takes 60 % of the 2,200 left: 1,620, of which the tail 1,320.
    assert budget.tail_budget(CHAT, measured, 2_500, 2_800, summary=None, **fits) == 1_320
    summary = "s " * 96  # 100 tokens: the next summary is taken to be as long
    assert budget.tail_budget(CHAT, measured, 2_500, 2_800, summary=summary, **fits) == 1_220
    # The upstream reports 1.5 tokens per local one: the view may take 1,080 local tokens.
    assert budget.tail_budget(CHAT, Estimate(3_000, None, 3_000, 2_000), 2_500, 2_800, summary=None, **fits) == 780
    # A threshold just over the system message: the tail gets 60 % of the 100 beside it; nothing beside it: 1 (the
    # last step alone).
    assert budget.tail_budget(CHAT, measured, 400, 2_800, summary=None, **fits) == 60
    assert budget.tail_budget(CHAT, measured, 300, 2_800, summary=None, **fits) == 1


def test_a_retry_asks_for_less_than_was_refused() -> None:
    assert retry_limit(8_000, 10_225) == 8_000  # the stated window is below what was refused
    assert retry_limit(12_000, 11_500) == 10_350  # the estimate undercounts this upstream: a tenth less
    assert retry_limit(5, 5) == 4


def test_tool_definitions_count_by_the_estimator() -> None:
    tools = [{"type": "function", "function": {"name": "read", "description": "read a file from disk"}}]
    chars = len(orjson.dumps(tools))
    assert policy("chars").tools_tokens(tools) == -(-chars // 3)
    assert policy("tokenizer").tools_tokens(tools) == TokenCounter(WordEncoding()).tools_tokens(tools)
    assert policy("max").tools_tokens(tools) == max(-(-chars // 3), TokenCounter(WordEncoding()).tools_tokens(tools))
    assert policy("tokenizer").tools_tokens(None) == 0


def test_usage_from_another_base_is_ignored() -> None:
    sample = UsageSample.of(CHAT, 500, VIEW, "base")
    assert policy().estimate(CHAT, VIEW, usage=sample, view_key="other").usage is None


def test_usage_after_a_rewind_is_ignored() -> None:
    sample = UsageSample.of(CHAT, 500, VIEW, "")
    edited = [VIEW[0], {"role": "user", "content": "something else"}, {"role": "assistant", "content": "ok"}]
    assert policy().estimate(CHAT, edited, usage=sample).usage is None
    assert policy().estimate(CHAT, VIEW[:1], usage=sample).usage is None


def test_what_the_upstream_counted_more_carries_over_to_another_base_per_item() -> None:
    """500 tokens upstream where the proxy counted 15, over 2 items: 242 a item more. A masked view (the same items,
    11 tokens by the proxy's count) keeps all of it; a view of one item, half; a rewound one, per item too."""
    sample = UsageSample.of(CHAT, 500, VIEW, "base", local=15)
    masked = [VIEW[0], {"role": "user", "content": "one"}]
    assert policy().estimate(CHAT, masked, usage=sample, view_key="masked") == Estimate(496, 11, 496, None)
    assert policy().estimate(CHAT, VIEW[:1], usage=sample, view_key="summary").usage == 10 + 242
    edited = [VIEW[0], {"role": "user", "content": "something else"}, {"role": "assistant", "content": "ok"}]
    assert policy().estimate(CHAT, edited, usage=sample, view_key="base").usage == 16 + 485 * 3 // 2
    # Nothing to carry: the proxy's count of the measured view unknown, or the upstream counted no more.
    assert policy().estimate(CHAT, masked, usage=UsageSample.of(CHAT, 500, VIEW, "base"), view_key="m").usage is None
    assert policy().estimate(CHAT, masked, usage=UsageSample.of(CHAT, 15, VIEW, "base", 15), view_key="m").usage is None


def test_usage_counts_even_when_smaller() -> None:
    sample = UsageSample.of(CHAT, 2, VIEW, "")
    assert policy().estimate(CHAT, VIEW, usage=sample) == Estimate(tokens=15, chars=15, usage=2, tokenizer=None)


def test_should_compact_is_strictly_above_the_threshold() -> None:
    budget = ContextBudgetPolicy(1000, 0.8)
    assert not budget.should_compact(Estimate(800, 800, None, None))
    assert budget.should_compact(Estimate(801, 801, None, None))
    assert budget.should_compact(Estimate(701, 701, None, None), max_output_tokens=300)


def test_message_tokens_follow_the_estimator() -> None:
    message = {"role": "user", "content": "a b c d e f g h i j"}  # 19 chars, 10 words
    assert policy("chars").message_tokens(CHAT, message) == 7
    assert policy("tokenizer").message_tokens(CHAT, message) == 10 + MESSAGE_OVERHEAD_TOKENS
    assert policy("max").message_tokens(CHAT, message) == 14


def test_hashes_of_the_source_conversation_are_reused_as_cache_keys() -> None:
    counter = TokenCounter(WordEncoding())
    budget = ContextBudgetPolicy(estimator="tokenizer", counter=counter)
    counter.message_tokens(CHAT, {"role": "user", "content": "w " * 50}, "known digest")
    message = {"role": "user", "content": "one"}
    clipped = {"role": "tool", "content": "two words"}
    estimate = budget.estimate(CHAT, [message, clipped], source=([message], ["known digest"]))
    assert estimate.tokenizer == (50 + MESSAGE_OVERHEAD_TOKENS) + (2 + MESSAGE_OVERHEAD_TOKENS) + REPLY_PRIMING_TOKENS


def test_the_soft_threshold_is_a_share_of_the_room_beside_the_tools_and_a_step_before_the_trigger() -> None:
    budget = ContextBudgetPolicy(16_000)
    assert budget.soft_threshold(0.6, 12_800) == 9_600, "no fixed part: a share of the window, as before"
    # 9,000 of tools: the soft threshold sits three quarters of the way through the 3,800 tokens beside them.
    assert budget.soft_threshold(0.6, 12_800, fixed=9_000) == 9_000 + 2_850
    assert budget.soft_threshold(0.6, 12_800, fixed=9_000, growth=2_500) == 10_300, "a step before the trigger"
    assert budget.soft_threshold(0.6, 12_800, fixed=13_000) == 9_600


def test_the_reduced_target_leaves_steps_of_growth_below_the_soft_threshold() -> None:
    budget = ContextBudgetPolicy(16_000)
    measured = Estimate(10_000, None, None, 10_000)
    assert budget.reduced_target(measured, 12_800, None) == 7_680, "no growth known: 60 % of the threshold"
    # Growth of 1,000 a step and a soft threshold at 9,600: the view goes down to 9,600 - 5 x 1,000.
    assert budget.reduced_target(measured, 12_800, None, soft=9_600, growth=1_000) == 4_600
    # Never below a quarter of the room, whatever the growth.
    assert budget.reduced_target(measured, 12_800, None, soft=9_600, growth=5_000) == 3_200


def test_the_leading_system_messages_are_part_of_what_no_compaction_frees() -> None:
    """Codex sends 5.8k of developer and environment messages beside 2.2k of tools: counted as room to compact,
    the soft threshold sat one step above where a summary left the view (9 summaries in 30 steps)."""
    budget = ContextBudgetPolicy(16_000)
    measured = Estimate(10_000, None, None, 10_000)
    # 5,000 of leading messages: 60 % of the 7,800 beside them, the messages' target counting them.
    assert budget.reduced_target(measured, 12_800, None, head=5_000) == 5_000 + 4_680
    assert budget.reduced_target(measured, 12_800, None, head=5_000) > budget.reduced_target(measured, 12_800, None)


def test_the_fixed_part_weighs_against_a_compaction_on_the_scale_its_gain_is_measured_in() -> None:
    """Issue 35: a compaction's gain is measured on the local count of the messages; where the upstream counts them
    three times that (Claude Code's thinking signatures and block structure, on the fake), the fixed part (tools,
    system prompt, the answer's room) weighs a third as much beside them, as the upstream sees it."""
    budget = policy("tokenizer", context_window=8_000)
    tools = ["word " * 2_000]  # about 2,000 tokens of tools and system prompt, the answer's room 1,600 besides
    beside = budget.tools_tokens(tools) + REPLY_PRIMING_TOKENS
    fixed = budget.fixed_tokens(tools)
    assert fixed == budget.tools_tokens(tools) + 1_600
    local = Estimate(beside + 700, None, None, beside + 700)
    assert budget.fixed_beside(local, tools) == fixed, "no usage figure: the fixed part as counted"
    measured = Estimate(beside + 2_100, None, beside + 2_100, beside + 700)
    assert budget.fixed_beside(measured, tools) == fixed // 3
    assert budget.fixed_beside(Estimate(beside, None, beside, beside), tools) == fixed, "no messages"
