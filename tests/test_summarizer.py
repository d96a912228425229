from __future__ import annotations

import asyncio

import pytest

from proxy.context.summary.summarizer import (
    SECTIONS,
    SYSTEM_PROMPT,
    SummaryAnswer,
    SummaryGenerator,
    SummaryInputTooLong,
    SummaryResult,
    build_prompt,
    serialise_message,
)
from proxy.context.summary.summaryprompt import REMINDER, UPDATE, summary_words
from proxy.dialects import CHAT
from proxy.types import Message
from tests.fakeupstream import full_summary

MESSAGES: list[Message] = [
    {"role": "user", "content": "fix the parser"},
    {
        "role": "assistant",
        "content": "reading it",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "p.py"}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "def parse(): ..."},
]


UPDATE_ASK = UPDATE.format(identifiers="8. Identifiers worth keeping")


def S(tag: str) -> str:
    """A complete summary whose goals section is ``tag``: summaries of equal-length tags are equally long."""
    return full_summary(tag)


class Recorder:
    """A summary model that answers from a script (text that finished normally, or an answer) and records calls."""

    def __init__(self, *answers: str | SummaryAnswer) -> None:
        self.answers = [a if isinstance(a, SummaryAnswer) else SummaryAnswer(a) for a in answers]
        self.prompts: list[list[Message]] = []
        self.max_tokens: list[int] = []

    async def __call__(self, prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        self.prompts.append(prompt)
        self.max_tokens.append(max_tokens)
        return self.answers.pop(0)

    def user_texts(self) -> list[str]:
        return [prompt[1]["content"] for prompt in self.prompts]


def test_serialise_message() -> None:
    assert serialise_message(CHAT, MESSAGES[0], 4, 100) == "[#4 user]\nfix the parser"
    assert serialise_message(CHAT, MESSAGES[1], 5, 100) == (
        '[#5 assistant]\nreading it\n-> call read {"path": "p.py"} (id c1)')
    assert serialise_message(CHAT, MESSAGES[2], 6, 100) == "[#6 tool result for call c1]\ndef parse(): ..."


def test_serialise_clips_tool_output_and_arguments() -> None:
    tool = {"role": "tool", "tool_call_id": "c1", "name": "read", "content": "x" * 30}
    assert serialise_message(CHAT, tool, 9, 10) == (
        "[#9 tool result for call c1]\n"
        "xxxxx\n[… 20 characters elided by ctxproxy; full text in the fact log, message index 9 …]\nxxxxx"
    )
    call = {"id": "c", "function": {"name": "write", "arguments": "y" * 30}}
    assert serialise_message(CHAT, {"role": "assistant", "content": None, "tool_calls": [call]}, 3, 10) == (
        "[#3 assistant]\n-> call write "
        "yyyyy\n[… 20 characters elided by ctxproxy; full text in the fact log, message index 3 …]\nyyyyy (id c)"
    )


def test_prompt_names_every_section() -> None:
    for section in SECTIONS:
        assert section in SYSTEM_PROMPT
    assert "## 8. Identifiers worth keeping" in SYSTEM_PROMPT


def test_build_prompt() -> None:
    assert build_prompt(None, "T") == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "<new-messages>\nT\n</new-messages>\n\nWrite the summary."},
    ]
    assert build_prompt("P", "T", "keep the SQL")[1]["content"] == (
        "<previous-summary>\nP\n</previous-summary>\n\n<new-messages>\nT\n</new-messages>\n\n"
        f"{UPDATE_ASK}\n\nAdditional instructions for this summary:\nkeep the SQL"
    )


def chars(text: str) -> int:
    return len(text)


async def test_rolling_input_is_previous_summary_plus_new_messages() -> None:
    model = Recorder(f"  {S('NEW SUMMARY')} \n")
    result = await SummaryGenerator(model).summarise("OLD SUMMARY", MESSAGES[1:], CHAT, first_index=12)
    # The previous summary had no sections: the update's sections come after it, which is kept.
    assert result == SummaryResult("ok", summary="OLD SUMMARY\n" + S("NEW SUMMARY"), calls=1, folded=2)
    assert model.user_texts() == [
        "<previous-summary>\nOLD SUMMARY\n</previous-summary>\n\n<new-messages>\n"
        '[#12 assistant]\nreading it\n-> call read {"path": "p.py"} (id c1)\n'
        "[#13 tool result for call c1]\ndef parse(): ...\n</new-messages>\n\n"
        f"{UPDATE_ASK} Keep it to at most 3686 words."
    ]


async def test_instructions_steer_the_summary() -> None:
    model = Recorder(S("S"))
    await SummaryGenerator(model).summarise(None, MESSAGES, CHAT, instructions="focus on tests")
    assert model.user_texts()[0].endswith("Additional instructions for this summary:\nfocus on tests")


def generator_with_room(model: object, room: int, previous: str | None = None, **kwargs: object) -> SummaryGenerator:
    """Token = character, and ``room`` tokens for the transcript in a prompt beside ``previous``."""
    options: dict[str, object] = {"min_chunk_tokens": 10, "count_text": chars, **kwargs}
    probe = SummaryGenerator(model, **options)  # type: ignore[arg-type]
    overhead = probe.max_input_tokens - probe.room(previous, None)
    return SummaryGenerator(model, max_input_tokens=overhead + room, **options)  # type: ignore[arg-type]


def small_generator(model: object, **kwargs: object) -> SummaryGenerator:
    """Room for one message of MESSAGES per call besides a summary as long as S("S0")."""
    return generator_with_room(model, 80, S("S0"), **kwargs)


async def test_large_input_is_folded_chunk_by_chunk_in_order() -> None:
    model = Recorder(S("S1"), S("S2"), S("S3"))
    result = await small_generator(model).summarise(S("S0"), MESSAGES, CHAT)
    assert result == SummaryResult("ok", summary=S("S3"), calls=3, folded=3)
    texts = model.user_texts()
    assert [t.split("</previous-summary>")[0] for t in texts] == [
        f"<previous-summary>\n{S('S0')}\n",
        f"<previous-summary>\n{S('S1')}\n",
        f"<previous-summary>\n{S('S2')}\n",
    ]
    assert ["[#0 user]" in texts[0], "[#1 assistant]" in texts[1], "[#2 tool result" in texts[2]] == [True] * 3
    assert "[#1" not in texts[0] and "[#2" not in texts[1]


async def test_prompt_too_long_halves_the_chunk_and_retries() -> None:
    transcripts: list[str] = []

    async def picky(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        transcript = prompt[1]["content"].split("<new-messages>\n")[1].split("\n</new-messages>")[0]
        transcripts.append(transcript)
        if len(transcript) > 40:
            raise SummaryInputTooLong("prompt is too long")
        return SummaryAnswer(S(f"S{len(transcripts)}"))

    result = await small_generator(picky).summarise(S("S0"), [*MESSAGES[:1], {"role": "user", "content": "z" * 60}],
                                                 CHAT)
    assert result.outcome == "ok"
    assert [len(t) for t in transcripts] == [
        len("[#0 user]\nfix the parser"),  # 24: accepted
        len("[#1 user]\n") + 60,  # 70: the second message, whole: rejected
        35,  # the chunk limit halved from 80 to 40, so the message is cut in two equal pieces: accepted
        35,  # the other piece
    ]
    assert result.summary == S("S4")
    assert result.calls == 4


async def test_prompt_too_long_gives_up_at_the_minimum_chunk() -> None:
    async def never_fits(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        raise SummaryInputTooLong("prompt is too long")

    result = await small_generator(never_fits, min_chunk_tokens=30).summarise(S("S0"), MESSAGES, CHAT)
    assert result.outcome == "failed"
    assert result.summary is None
    assert result.error == "chunk limit 20 under the minimum"
    assert result.calls == 2  # 80, then 40; 20 is under 30


async def test_timeout_gives_timeout_and_no_summary() -> None:
    never = asyncio.Event()

    async def hangs(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        await never.wait()
        return SummaryAnswer("unreachable")

    result = await SummaryGenerator(hangs, timeout=0.01).summarise("OLD", MESSAGES, CHAT)
    assert result == SummaryResult("timeout", calls=1, error="no summary within 0.01 s")


async def test_exception_gives_failed() -> None:
    async def broken(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        raise ConnectionError("upstream reset")

    result = await SummaryGenerator(broken).summarise("OLD", MESSAGES, CHAT)
    assert result == SummaryResult("failed", calls=1, error="ConnectionError: upstream reset")


async def test_nothing_to_summarise_is_a_failure_without_a_call() -> None:
    model = Recorder()
    result = await SummaryGenerator(model).summarise("OLD", [], CHAT)
    assert result == SummaryResult("failed", error="nothing to summarise")
    assert model.prompts == []


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        SummaryGenerator(Recorder(), timeout=0)


async def test_the_output_bound_goes_with_every_call() -> None:
    model = Recorder(S("S1"), S("S2"), S("S3"))
    await small_generator(model, max_output_tokens=333).summarise(S("S0"), MESSAGES, CHAT)
    assert model.max_tokens == [333, 333, 333]


# ---- issue 18, item 1: a finished, non-empty answer that is not a refusal is a summary ----------------------------


BOLD = "**Goals**\nFix the parser.\n\n**Work completed**\nRead p.py.\n\n**Next steps**\nEdit parse()."
NUMBERED = "1. Goals: fix the parser\n2. Work completed: read p.py\n3. Next steps: edit parse()"
STATUS_ONLY = "## 6. Current status\nThe agent has read p.py and is about to edit parse()."
GERMAN = "## 1. Ziele und Vorgaben\nDen Parser reparieren.\n## 2. Erledigte Arbeit\np.py gelesen."
CHINESE = "## 1. 目标与约束\n修复解析器。\n## 2. 已完成的工作\n读取了 p.py。"
PROSE = "The user asked the agent to fix the parser; it read p.py and found parse() unfinished."
LONG_WITH_CANT = ("## 1. Goals\nFix the parser. The user said: I can't ship until the parser handles tabs.\n"
                  + "## 2. Work completed\n" + "Read p.py, traced parse() through the tokenizer. " * 20).strip()


@pytest.mark.parametrize("text", [BOLD, NUMBERED, STATUS_ONLY, GERMAN, CHINESE, PROSE, LONG_WITH_CANT],
                         ids=["bold", "numbered", "status-only", "german", "chinese", "prose", "long-with-cant"])
async def test_any_finished_answer_that_is_not_a_refusal_is_a_summary(text: str) -> None:
    model = Recorder(text)
    result = await SummaryGenerator(model).summarise(None, MESSAGES, CHAT)  # a first summary: the answer itself
    assert result == SummaryResult("ok", summary=text, calls=1, folded=3)


REFUSALS = [
    "I'm sorry, I can't help with that.",
    "I\u2019m sorry, but I can\u2019t assist with that request.",
    "I cannot help with that.",
    "I can't assist with this.",
    "As an AI language model, I am not able to summarise private conversations.",
    "I\u2019m unable to comply with this request.",
    "Sorry, but I can't do that.",
    "**I apologize, but I won't summarise this conversation.**",
]


@pytest.mark.parametrize("refusal", REFUSALS)
async def test_a_refusal_is_asked_once_more_with_a_reminder_then_fails(refusal: str) -> None:
    model = Recorder(refusal, refusal)
    result = await SummaryGenerator(model).summarise("OLD", MESSAGES, CHAT)
    assert result == SummaryResult("failed", calls=2, error="summary was a refusal, twice")
    first, second = model.user_texts()
    assert second == f"{first}\n\n{REMINDER.format(words=summary_words(8_192))}"


async def test_a_refusal_then_a_summary_is_a_summary() -> None:
    model = Recorder(REFUSALS[0], PROSE)
    result = await SummaryGenerator(model).summarise("OLD", MESSAGES, CHAT)
    assert result == SummaryResult("ok", summary=PROSE, calls=2, folded=3)


@pytest.mark.parametrize("answer", ["", "   \n\t"])
async def test_an_empty_answer_is_asked_once_more_then_fails(answer: str) -> None:
    result = await SummaryGenerator(Recorder(answer, answer)).summarise("OLD", MESSAGES, CHAT)
    assert result == SummaryResult("failed", calls=2, error="empty summary, twice")


@pytest.mark.parametrize(("reason", "error"), [
    ("length", "summary did not finish (finish_reason 'length'), twice"),
    ("content_filter", "summary did not finish (finish_reason 'content_filter'), twice"),
])
async def test_an_answer_that_did_not_finish_is_asked_once_more_then_fails(reason: str, error: str) -> None:
    cut = SummaryAnswer(S("cut"), finished=False, reason=reason)
    result = await SummaryGenerator(Recorder(cut, cut)).summarise("OLD", MESSAGES, CHAT)
    assert result == SummaryResult("failed", calls=2, error=error)


async def test_a_cut_answer_is_asked_again_for_half_the_words() -> None:
    model = Recorder(SummaryAnswer(S("cut"), finished=False, reason="length"), S("short"))
    result = await SummaryGenerator(model, max_output_tokens=1_000).summarise("OLD", MESSAGES, CHAT)
    assert result == SummaryResult("ok", summary="OLD\n" + S("short"), calls=2, folded=3)
    assert model.user_texts()[0].endswith("Keep it to at most 450 words.")
    assert model.user_texts()[1].endswith(REMINDER.format(words=225))


async def test_a_refusal_then_a_cut_answer_says_both() -> None:
    model = Recorder(REFUSALS[0], SummaryAnswer("## 1. Go", finished=False, reason="length"))
    result = await SummaryGenerator(model).summarise("OLD", MESSAGES, CHAT)
    assert result.error == "summary was a refusal, then summary did not finish (finish_reason 'length')"


# ---- issue 18, item 5: the rolling summary stays bounded ------------------------------------------------------------


@pytest.mark.parametrize(("max_output", "words"), [(8_192, 3_686), (4_096, 1_843), (1_000, 450)])
async def test_the_prompt_gives_a_word_budget_from_the_output_bound(max_output: int, words: int) -> None:
    model = Recorder(S("S"))
    await SummaryGenerator(model, max_output_tokens=max_output).summarise(None, MESSAGES, CHAT)
    assert model.user_texts()[0].endswith(f"Write the summary. Keep it to at most {words} words.")
    assert words / 0.75 <= 0.6 * max_output, "the summary itself takes at most 60 % of the output bound"


SUMMARY_16K = "s" * 3_568  # token = character: the run's previous summary of 3,568 tokens


def crowding_instructions() -> str:
    """Instructions that, beside SUMMARY_16K, left the run's 743-token chunk limit under the old sizing."""
    skeleton = "\n".join(m["content"] for m in build_prompt(SUMMARY_16K, "", "i"))
    instructions = "i" * (8_192 - 16 - 743 - len(skeleton) + 1)
    old_limit = 8_192 - 16 - len("\n".join(m["content"] for m in build_prompt(SUMMARY_16K, "", instructions)))
    assert old_limit == 743  # window // 2 for the prompt: under the 2,000-token minimum, so no call was made
    return instructions


async def test_16k_window_with_a_3568_token_summary_folds_in_one_call() -> None:
    model = Recorder(S("NEW"))
    generator = SummaryGenerator.for_window(model, 16_384, max_output_tokens=8_192, count_text=chars)
    result = await generator.summarise(SUMMARY_16K, MESSAGES, CHAT, instructions=crowding_instructions())
    # Merged, the unsectioned previous summary took the summary over its budget (60 % of the 4,096-token output
    # bound): it is the longest section, so it is the one trimmed, and the summary says so.
    assert result == SummaryResult("ok", summary="[ctxproxy] 1 older line trimmed\n" + S("NEW"), calls=1, folded=3)
    assert generator.room(SUMMARY_16K, crowding_instructions()) >= generator.min_chunk_tokens


async def test_a_previous_summary_that_crowds_out_its_input_is_condensed_first() -> None:
    model = Recorder("c" * 1_500, S("NEW"))
    generator = SummaryGenerator.for_window(model, 16_384, max_output_tokens=8_192, count_text=chars)
    previous = "p" * 10_000  # written under a larger summary model, or before the word budget
    assert generator.room(previous, None) < generator.min_chunk_tokens
    result = await generator.summarise(previous, MESSAGES, CHAT)
    assert result == SummaryResult("ok", summary="c" * 1_500 + "\n" + S("NEW"), calls=2, folded=3)
    condense, fold = model.user_texts()
    assert condense.startswith(f"<previous-summary>\n{previous}\n</previous-summary>")
    assert "Condense it to at most 1842 words" in condense and "<new-messages>" not in condense
    assert fold.startswith(f"<previous-summary>\n{'c' * 1_500}\n</previous-summary>")


async def test_a_failed_condensation_fails() -> None:
    model = Recorder(REFUSALS[0])
    generator = SummaryGenerator.for_window(model, 16_384, max_output_tokens=8_192, count_text=chars)
    result = await generator.summarise("p" * 10_000, MESSAGES, CHAT)
    assert result == SummaryResult("failed", calls=1, error="condensing the summary: summary was a refusal")


async def test_a_condensed_summary_still_too_long_fails() -> None:
    model = Recorder("c" * 10_000)  # ignored the budget
    generator = SummaryGenerator.for_window(model, 16_384, max_output_tokens=8_192, count_text=chars)
    result = await generator.summarise("p" * 10_000, MESSAGES, CHAT)
    assert result.outcome == "failed" and result.calls == 1
    assert result.error is not None and result.error.endswith("under the minimum after condensing the summary")


async def test_instructions_that_leave_no_room_fail_without_a_call() -> None:
    model = Recorder()
    generator = SummaryGenerator.for_window(model, 16_384, max_output_tokens=8_192, count_text=chars)
    result = await generator.summarise("p" * 100, MESSAGES, CHAT, instructions="i" * 11_000)
    assert result.outcome == "failed" and result.calls == 0  # no summary, however short, makes room
    assert model.prompts == []


# ---- issue 18, item 6: chunks sized for the summary model's real room, balanced, each one kept -------------------


@pytest.mark.parametrize(("window", "bounds"), [
    (128_000, (113_408, 8_192, 2_000)),  # the default bound, and the rest less 5 % for the prompt
    (1_047_576, (987_006, 8_192, 2_000)),
    (16_384, (11_469, 4_096, 2_000)),  # a quarter of a small window for the answer
    (8_192, (5_735, 2_048, 1_433)),
    (4_096, (2_868, 1_024, 717)),
    (1_500, (1_050, 375, 262)),
])
def test_calls_leave_room_for_the_answer_in_the_window(window: int, bounds: tuple[int, int, int]) -> None:
    generator = SummaryGenerator.for_window(Recorder(), window, max_output_tokens=8_192, timeout=7.0,
                                            count_text=chars)
    assert (generator.max_input_tokens, generator.max_output_tokens, generator.min_chunk_tokens) == bounds
    assert generator.max_input_tokens + generator.max_output_tokens + window // 20 <= window
    assert generator.timeout == 7.0
    assert generator.count_text is chars


def messages_of(total: int) -> list[Message]:
    """Fifty user messages whose transcript (joined by newlines) is ``total`` characters."""
    messages: list[Message] = [{"role": "user", "content": "w" * 90} for _ in range(50)]
    transcript = "\n".join(serialise_message(CHAT, m, i, 4_000) for i, m in enumerate(messages))
    messages[-1] = {"role": "user", "content": "w" * (90 + total - len(transcript))}
    return messages


@pytest.mark.parametrize(("room", "sizes"), [
    (4_500, [2_743, 2_697]),  # two chunks, cut at the message boundary nearest half (2,721), not 4,500 and 941
    (6_000, [5_441]),  # it fits: one call
])
async def test_chunks_are_balanced(room: int, sizes: list[int]) -> None:
    model = Recorder(*(S(f"S{n}") for n in range(1, 4)))
    result = await generator_with_room(model, room, S("S1")).summarise(S("S1"), messages_of(5_441), CHAT)
    transcripts = [t.split("<new-messages>\n")[1].split("\n</new-messages>")[0] for t in model.user_texts()]
    assert [len(t) for t in transcripts] == sizes
    assert result == SummaryResult("ok", summary=S(f"S{len(sizes)}"), calls=len(sizes), folded=50)


async def test_a_failure_after_some_chunks_keeps_the_chunks_done() -> None:
    async def fails_second(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        if "S1" in prompt[1]["content"]:
            raise RuntimeError("boom")
        return SummaryAnswer(S("S1"))

    result = await small_generator(fails_second).summarise(S("S0"), MESSAGES, CHAT)
    assert result == SummaryResult("ok", S("S1"), 2, "partial: 1 of 3 messages folded, then RuntimeError: boom", 1)


async def test_an_unusable_answer_mid_fold_keeps_the_chunks_done() -> None:
    model = Recorder(S("S1"), REFUSALS[0], REFUSALS[0], S("S3"))
    result = await small_generator(model).summarise(S("S0"), MESSAGES, CHAT)
    assert result == SummaryResult("ok", S("S1"), 3, "partial: 1 of 3 messages folded, then summary was a refusal, "
                                                     "twice", 1)


async def test_the_time_left_bounds_each_call_and_the_chunks_done_are_kept() -> None:
    """The first chunk answers at once, the second never: the timeout ends it and the first chunk is kept."""
    never = asyncio.Event()
    started: list[str] = []

    async def hangs_on_the_second(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        started.append(prompt[1]["content"])
        if len(started) == 2:
            await never.wait()
        return SummaryAnswer(S(f"S{len(started)}"))

    result = await small_generator(hangs_on_the_second, timeout=0.05).summarise(S("S0"), MESSAGES, CHAT)
    assert result == SummaryResult("ok", S("S1"), 2, "partial: 1 of 3 messages folded, then no summary within "
                                                     "0.05 s", 1)
    assert len(started) == 2, "the third chunk never starts"


async def test_a_message_cut_in_pieces_is_folded_only_with_its_last_piece() -> None:
    async def fails_third(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        calls.append(prompt[1]["content"])
        if len(calls) == 3:
            raise RuntimeError("boom")
        return SummaryAnswer(S(f"S{len(calls)}"))

    calls: list[str] = []
    messages: list[Message] = [MESSAGES[0], {"role": "user", "content": "z" * 200}]  # 210: three pieces of 70
    result = await small_generator(fails_third).summarise(S("S0"), messages, CHAT)
    assert result == SummaryResult("ok", S("S1"), 3, "partial: 1 of 2 messages folded, then RuntimeError: boom", 1)
    assert "[#1 user]" in calls[1] and "[#1 user]" not in calls[2], "the second call had the first piece"


async def test_nothing_folded_before_a_failure_is_a_failure() -> None:
    async def cut(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        if len(calls) == 2:
            raise RuntimeError("boom")
        calls.append(1)
        return SummaryAnswer(S("piece"))

    calls: list[int] = []
    result = await small_generator(cut).summarise(S("S0"), [{"role": "user", "content": "z" * 300}], CHAT)
    assert result == SummaryResult("failed", calls=3, error="RuntimeError: boom")
