from __future__ import annotations

import pytest

from proxy.context.summary.summaryprompt import (
    REFUSAL_MAX_CHARS,
    REMINDER,
    SummaryAnswer,
    is_refusal,
    reminder_for,
    summary_words,
    unusable,
)


@pytest.mark.parametrize("text", [
    "I'm sorry, I can't help with that.",
    "I\u2019m sorry, but I can\u2019t help with that.",
    "  I am sorry, I cannot do this.",
    "Sorry, but I can't assist with that.",
    "I cannot help with that.",
    "I can not summarise this.",
    "I cant do that.",
    "I can't assist.",
    "I won't summarise this conversation.",
    "I'm unable to help with this request.",
    "I\u2019m not able to provide that.",
    "I'm afraid I can't do that.",
    "As an AI, I cannot summarise private data.",
    "As a large language model, I don't have access to that.",
    "I apologize, but I cannot comply.",
    "Unfortunately, I can't help with that.",
    "**I'm sorry, but I can't help with that.**",
    "> I must decline.",
])
def test_refusals(text: str) -> None:
    assert is_refusal(text)
    assert unusable(SummaryAnswer(text)) == "summary was a refusal"


@pytest.mark.parametrize("text", [
    "## 1. Goals\nThe user said: I can't ship until tabs work.",
    "Unfortunately the build still fails on CI; the agent is bisecting.",
    "The agent said I'm sorry to the user and fixed the bug.",
    "I can't " + "x" * REFUSAL_MAX_CHARS,  # a long answer that opens so is meant as a summary
    "Icannot.py was edited.",
    "Sorryfile: none",
])
def test_not_refusals(text: str) -> None:
    assert not is_refusal(text)
    assert unusable(SummaryAnswer(text)) is None


def test_unusable() -> None:
    assert unusable(SummaryAnswer("x", finished=False, reason="length")) == (
        "summary did not finish (finish_reason 'length')")
    assert unusable(SummaryAnswer(" \n")) == "empty summary"
    assert unusable(SummaryAnswer("**Goals** fix it")) is None


def test_word_budget_and_reminders() -> None:
    assert summary_words(8_192) == 3_686 and summary_words(1) == 1
    assert reminder_for(SummaryAnswer("I'm sorry."), 400) == REMINDER.format(words=400)
    assert reminder_for(SummaryAnswer("x", finished=False, reason="length"), 400) == REMINDER.format(words=200)
