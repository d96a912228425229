from __future__ import annotations

import asyncio

import pytest

from proxy.context.summarizer import (
    SECTIONS,
    SYSTEM_PROMPT,
    SummaryAnswer,
    SummaryGenerator,
    SummaryInputTooLong,
    SummaryResult,
    build_prompt,
    missing_section,
    serialise_message,
    take_chunk,
)
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
        "Write the updated summary.\n\nAdditional instructions for this summary:\nkeep the SQL"
    )


def chars(text: str) -> int:
    return len(text)


def test_take_chunk() -> None:
    assert take_chunk(["aaa", "bbb", "ccc"], 7, chars) == ("aaa\nbbb", ["ccc"])
    assert take_chunk(["aaa", "bbb", "ccc"], 3, chars) == ("aaa", ["bbb", "ccc"])
    # A block larger than the limit is cut; its remainder comes first next time.
    assert take_chunk(["abcdefgh", "z"], 3, chars) == ("abc", ["def", "gh", "z"])


async def test_rolling_input_is_previous_summary_plus_new_messages() -> None:
    model = Recorder(f"  {S('NEW SUMMARY')} \n")
    result = await SummaryGenerator(model).summarise("OLD SUMMARY", MESSAGES[1:], CHAT, first_index=12)
    assert result == SummaryResult("ok", summary=S("NEW SUMMARY"), calls=1)
    assert model.user_texts() == [
        "<previous-summary>\nOLD SUMMARY\n</previous-summary>\n\n<new-messages>\n"
        '[#12 assistant]\nreading it\n-> call read {"path": "p.py"} (id c1)\n'
        "[#13 tool result for call c1]\ndef parse(): ...\n</new-messages>\n\nWrite the updated summary."
    ]


async def test_instructions_steer_the_summary() -> None:
    model = Recorder(S("S"))
    await SummaryGenerator(model).summarise(None, MESSAGES, CHAT, instructions="focus on tests")
    assert model.user_texts()[0].endswith("Additional instructions for this summary:\nfocus on tests")


def small_generator(model: Recorder | object, **kwargs: object) -> SummaryGenerator:
    """Token = character, and room for one message of MESSAGES per call besides the prompt."""
    overhead = len("\n".join(m["content"] for m in build_prompt(S("S0"), "")))
    options: dict[str, object] = {"max_input_tokens": overhead + 16 + 80, "min_chunk_tokens": 10, "count_text": chars}
    options.update(kwargs)
    return SummaryGenerator(model, **options)  # type: ignore[arg-type]


async def test_large_input_is_folded_chunk_by_chunk_in_order() -> None:
    model = Recorder(S("S1"), S("S2"), S("S3"))
    result = await small_generator(model).summarise(S("S0"), MESSAGES, CHAT)
    assert result == SummaryResult("ok", summary=S("S3"), calls=3)
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
        40,  # the chunk limit halved from 80 to 40, so the message is cut: accepted
        30,  # the 30 characters left
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


@pytest.mark.parametrize("answer", ["", "   \n\t"])
async def test_empty_answer_gives_failed(answer: str) -> None:
    result = await SummaryGenerator(Recorder(answer)).summarise("OLD", MESSAGES, CHAT)
    assert result == SummaryResult("failed", calls=1, error="empty summary")


async def test_a_failure_after_some_chunks_discards_the_partial_fold() -> None:
    async def fails_second(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        if "S1" in prompt[1]["content"]:
            raise RuntimeError("boom")
        return SummaryAnswer(S("S1"))

    result = await small_generator(fails_second).summarise(S("S0"), MESSAGES, CHAT)
    assert result == SummaryResult("failed", calls=2, error="RuntimeError: boom")


async def test_nothing_to_summarise_is_a_failure_without_a_call() -> None:
    model = Recorder()
    result = await SummaryGenerator(model).summarise("OLD", [], CHAT)
    assert result == SummaryResult("failed", error="nothing to summarise")
    assert model.prompts == []


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        SummaryGenerator(Recorder(), timeout=0)


# ---- item 11.9: only a finished answer with every section is a summary -------------------------------------------


REFUSAL = "I'm sorry, I can't help with that."


@pytest.mark.parametrize(("answer", "error"), [
    (REFUSAL, "summary lacks section 1 (Goals and constraints)"),
    (SummaryAnswer(S("cut"), finished=False, reason="length"), "summary did not finish (finish_reason 'length')"),
    (SummaryAnswer(S("filtered"), finished=False, reason="content_filter"),
     "summary did not finish (finish_reason 'content_filter')"),
    (S("x").replace("## 5. Errors\n", ""), "summary lacks section 5 (Errors met and how they were resolved (or that "
                                           "they are still open))"),
    ("## 1. Goals\nKeep going.\n## 8. Identifiers\nFACT-1", "summary lacks section 2 (Work completed)"),
], ids=["refusal", "length", "content-filter", "no-section-5", "two-sections"])
async def test_an_unusable_answer_is_a_failure(answer: str | SummaryAnswer, error: str) -> None:
    result = await SummaryGenerator(Recorder(answer)).summarise("OLD", MESSAGES, CHAT)
    assert result == SummaryResult("failed", calls=1, error=error)


async def test_an_unusable_answer_mid_fold_discards_the_partial_fold() -> None:
    model = Recorder(S("S1"), REFUSAL, S("S3"))
    result = await small_generator(model).summarise(S("S0"), MESSAGES, CHAT)
    assert result == SummaryResult("failed", calls=2, error="summary lacks section 1 (Goals and constraints)")


def test_section_headings_are_matched_leniently_but_all_and_in_order() -> None:
    assert missing_section(SYSTEM_PROMPT.split(":\n", 1)[1]) is None  # the prompt's own headings, full titles
    assert missing_section(S("x")) is None  # short titles
    lenient = "\n".join(f"{'#' * (1 + n % 3)}  {title.upper()}  \nNone" for n, title in enumerate(SECTIONS))
    assert missing_section(lenient) is None  # no numbers, any level, any case, extra spaces
    swapped = S("x").replace("## 6. Current state", "## 6. Next steps").replace("## 7. Next steps", "## 7. State")
    assert missing_section(swapped) == 7
    assert missing_section("Goals, work, decisions, files, errors, state, next, identifiers: all in prose.") == 1
    assert missing_section(S("x").replace("## 8. Identifiers", "Identifiers:")) == 8


async def test_the_output_bound_goes_with_every_call() -> None:
    model = Recorder(S("S1"), S("S2"), S("S3"))
    await small_generator(model, max_output_tokens=333).summarise(S("S0"), MESSAGES, CHAT)
    assert model.max_tokens == [333, 333, 333]


@pytest.mark.parametrize(("window", "bounds"), [
    (128_000, (64_000, 8_192, 2_000)),  # the default bound, and half the window for the prompt
    (1_047_576, (523_788, 8_192, 2_000)),
    (8_192, (4_096, 2_048, 1_024)),  # a quarter of a small window for the answer
    (4_096, (3_072, 1_024, 768)),  # up to 4,000 prompt tokens beside the answer
    (6_000, (4_000, 1_500, 1_000)),
    (1_500, (1_125, 375, 281)),
])
def test_calls_leave_room_for_the_answer_in_the_window(window: int, bounds: tuple[int, int, int]) -> None:
    generator = SummaryGenerator.for_window(Recorder(), window, max_output_tokens=8_192, timeout=7.0)
    assert (generator.max_input_tokens, generator.max_output_tokens, generator.min_chunk_tokens) == bounds
    assert generator.max_input_tokens + generator.max_output_tokens <= window
    assert generator.timeout == 7.0


# ---- item 11.10: the timeout bounds the whole fold ----------------------------------------------------------------


async def test_the_timeout_bounds_all_chunk_calls_together() -> None:
    """Seven chunks of 0.4 s each, 0.6 s in all: the second call is cut, the third never starts."""
    started: list[int] = []
    ended: list[int] = []

    async def slow(prompt: list[Message], max_tokens: int) -> SummaryAnswer:
        started.append(len(started) + 1)
        await asyncio.sleep(0.4)  # a summary model that takes its time, under the timeout per call
        ended.append(len(ended) + 1)
        return SummaryAnswer(S(f"S{len(started)}"))

    messages: list[Message] = [{"role": "user", "content": f"step {n} " + "w" * 50} for n in range(7)]
    result = await small_generator(slow, timeout=0.6).summarise(S("S0"), messages, CHAT)
    assert result == SummaryResult("timeout", calls=2, error="no summary within 0.6 s")
    assert (started, ended) == ([1, 2], [1])
