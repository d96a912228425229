"""When a background summary starts: learned from how fast a session steps and how long its summaries take.

A summary started one step before the trigger is in time only when it takes
less than a step: 0.6 s steps beside 3 s summaries made a step wait 2.2 s.
"""

from __future__ import annotations

from proxy.context.engine import ContextEngine, EngineSettings, step_tokens
from proxy.context.log.history import HistoryManager
from proxy.context.view.budget import ContextBudgetPolicy
from proxy.context.view.pace import IDLE_SECONDS, MAX_STEPS_AHEAD, SessionPace
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.store.base import SessionKey
from proxy.store.sqlite import SqliteFactLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stepped(pace: SessionPace, clock: Clock, key: str, seconds: float, steps: int) -> None:
    for _ in range(steps):
        pace.step(key)
        clock.now += seconds


def test_a_summary_starts_as_many_steps_ahead_as_it_takes() -> None:
    clock = Clock()
    pace = SessionPace(clock)
    assert pace.steps_ahead("s") == 1, "nothing known: one step, as before"
    stepped(pace, clock, "s", 0.6, 5)
    assert pace.steps_ahead("s") == 1, "no summary seen yet"
    pace.summarised("s", 3.0)
    assert pace.steps_ahead("s") == 1 + 5, "3 s of summary is 5 steps of 0.6 s, and one more"
    pace.summarised("s", 300.0)
    assert pace.steps_ahead("s") == MAX_STEPS_AHEAD, "bounded: a summary never starts right after the last"


def test_a_pause_is_not_a_step_and_a_new_session_borrows_the_process_summary_time() -> None:
    clock = Clock()
    pace = SessionPace(clock)
    stepped(pace, clock, "a", 2.0, 3)
    pace.summarised("a", 3.0)
    assert pace.steps_ahead("a") == 1 + 2
    pace.step("a")
    clock.now += IDLE_SECONDS + 1  # the user went to lunch
    pace.step("a")
    assert pace.steps_ahead("a") == 1 + 2, "the pause changed nothing"
    stepped(pace, clock, "b", 0.5, 3)
    assert pace.steps_ahead("b") == 1 + 6, "b's first summary is taken to be as slow as the process's"


def test_the_paces_are_bounded_by_a_count() -> None:
    clock = Clock()
    pace = SessionPace(clock, max_sessions=2)
    for key in ("a", "b", "c"):
        stepped(pace, clock, key, 1.0, 2)
    assert len(pace) == 2
    pace.summarised("c", 4.0)
    assert pace.steps_ahead("a") == 1, "the least recently seen session was dropped"
    assert pace.steps_ahead("c") == 1 + 4


def test_without_tools_the_soft_threshold_keeps_the_growth_below_the_trigger() -> None:
    budget = ContextBudgetPolicy(16_000)
    assert budget.soft_threshold(0.6, 12_800, growth=2_000) == 9_600, "the share is lower still"
    assert budget.soft_threshold(0.6, 12_800, growth=4_000) == 8_800, "a slow summary starts earlier"


async def test_the_engine_starts_a_slow_sessions_summary_earlier(tmp_path) -> None:
    log = await SqliteFactLog.open(tmp_path / "facts.db")
    engine = ContextEngine(HistoryManager(log, clock=lambda: 0.0), EngineSettings(context_window=16_000),
                           clock=lambda: 0.0)
    clock = Clock()
    engine.pace = SessionPace(clock)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"},
                {"role": "assistant", "content": "word " * 1_000}]
    hashes = [message_hash(m) for m in messages]
    fast, slow = SessionKey("t", "fast"), SessionKey("t", "slow")
    for key, summary in ((fast, 0.1), (slow, 4.0)):
        stepped(engine.pace, clock, key, 1.0, 3)  # type: ignore[arg-type]
        engine.pace.summarised(key, summary)

    def soft(key: SessionKey) -> int:
        view = engine.view(messages, hashes, None, dialect=CHAT, window=16_000, tools=None, max_output=None)
        assert view.threshold == 12_800
        return engine.soft_threshold(key, 16_000, view, CHAT, messages, hashes)

    growth = step_tokens(engine.policy(16_000), CHAT, messages, hashes)
    head = engine.head_tokens(16_000, CHAT, messages, hashes)
    assert soft(fast) == head + 9_600 * (12_800 - head) // 12_800, "a fast summary: the share decides"
    assert soft(slow) == 12_800 - 5 * growth < 9_600, "4 s of summary over 1 s steps: five steps of growth ahead"
    await engine.aclose()
    await log.aclose()


async def test_the_soft_threshold_leaves_the_leading_system_messages_out_of_the_room(tmp_path) -> None:
    log = await SqliteFactLog.open(tmp_path / "facts.db")
    engine = ContextEngine(HistoryManager(log, clock=lambda: 0.0), EngineSettings(context_window=16_000),
                           clock=lambda: 0.0)
    short = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    long = [{"role": "system", "content": "rule " * 5_000}, {"role": "user", "content": "go"}]
    key = SessionKey("t", "s")

    def soft(messages: list[dict[str, str]]) -> int:
        hashes = [message_hash(m) for m in messages]
        view = engine.view(messages, hashes, None, dialect=CHAT, window=16_000, tools=None, max_output=None)
        assert view.threshold == 12_800
        return engine.soft_threshold(key, 16_000, view, CHAT, messages, hashes)

    head = engine.head_tokens(16_000, CHAT, long, [message_hash(m) for m in long])
    assert head > 5_000
    assert soft(long) == head + 9_600 * (12_800 - head) // 12_800 > soft(short) + 1_000, "the room beside the head"
    await engine.aclose()
    await log.aclose()
