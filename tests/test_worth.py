"""Cache-aware timing (issue 34): a reduction nothing forces waits mid-burst and lands when the provider's cache is
cold, on a simulated clock (no sleeps): the engine's injected clock drives its pace and the cache's life."""

from __future__ import annotations

import random
from typing import Any

from proxy.app import engine_settings
from proxy.context.engine import ContextEngine, EngineSettings
from proxy.context.log.history import HistoryManager
from proxy.context.log.lineage import TOOLS
from proxy.context.view.prepared import PreparedView
from proxy.context.view.worth import COLD, WARM, CacheRates, Moment, cache_rates, timely
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.settings import Settings
from proxy.store.base import FactLog, SessionKey
from tests.proxyfixtures import MASKING_OFF, read_log
from tests.test_compaction_e2e import prose
from tests.test_engine import Summariser

KEY = SessionKey("tenant", "worth")
WINDOW = 16_000
#: Seconds between the requests of a burst.
PACE = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def engine_over(store: FactLog, clock: Clock, **overrides: Any) -> ContextEngine:
    settings = EngineSettings(**{"context_window": WINDOW, "precompact_threshold": 1.0, **overrides})
    return ContextEngine(HistoryManager(store, clock=clock), settings, clock=clock)


class Agent:
    """A tool loop of ~530-token outputs, one request per step, on the simulated clock."""

    def __init__(self, engine: ContextEngine, clock: Clock, summariser: Any = None,
                 conversation: str | None = None) -> None:
        self.engine, self.clock, self.conversation = engine, clock, conversation
        self.summariser = summariser or Summariser()
        self.rng = random.Random(7)
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
        self.views: list[PreparedView] = []

    async def step(self, after: float = PACE) -> PreparedView:
        """The next request, ``after`` seconds after the previous one; its tool output is appended after it."""
        self.clock.now += after
        hashes = [message_hash(m) for m in self.messages]
        state = await self.engine.history.sync(KEY, self.messages, hashes)
        view = await self.engine.prepare(KEY, self.messages, hashes, state, dialect=CHAT, model="m", tools=None,
                                         max_output=None, complete=self.summariser, conversation=self.conversation)
        n = len(self.views)
        reply = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{n}", "type": "function", "function": {"name": "run", "arguments": f'{{"n": {n}}}'}}]}
        if self.conversation is not None:  # the reply logged as a turn logs it, naming the request's conversation
            await self.engine.history.sync(KEY, [*self.messages, reply], [*hashes, message_hash(reply)],
                                           upstream_from=len(self.messages),
                                           extra_upstream={"view": {"conversation": self.conversation}})
        self.messages += [reply, {"role": "tool", "tool_call_id": f"c{n}", "content": prose(self.rng, 400)}]
        self.views.append(view)
        return view

    def kept_prefix(self) -> bool:
        """Whether the last view begins with the whole view before it (the provider's cache still serves it)."""
        last, before = self.views[-1].messages, self.views[-2].messages
        return list(last[: len(before)]) == list(before)


async def burst_near_the_trigger(agent: Agent) -> None:
    """Steps a few seconds apart until the view is within a few steps of the trigger: a masking batch has long been
    there to make (the outputs older than the kept ones would free far more than one), and none is made."""
    await agent.step()
    while agent.views[-1].estimate.tokens < agent.views[-1].threshold - 3 * 600:
        await agent.step()
        assert agent.views[-1].compacted == "none" and agent.kept_prefix(), "no reduction while the cache is warm"
    assert len(agent.views) > 10


async def test_a_due_reduction_waits_mid_burst_and_lands_at_the_first_request_after_an_idle_gap(
        store: FactLog) -> None:
    clock = Clock()
    agent = Agent(engine_over(store, clock), clock)
    await burst_near_the_trigger(agent)
    assert [f.kind for f in await read_log(store, KEY)].count("checkpoint") == 0
    before = agent.views[-1].estimate.tokens
    view = await agent.step(after=301.0)  # past Anthropic's 5-minute cache life: the provider writes it all anyway
    assert view.compacted == "proactive" and view.checkpoint is not None and view.checkpoint.masked_until > 0
    assert view.estimate.tokens < before - 2_000, "masked at the gap"
    await agent.step()
    assert agent.views[-1].compacted == "none" and agent.kept_prefix(), "then the prefix holds again"


async def test_a_title_call_after_an_idle_gap_leaves_the_cold_moment_to_the_run(store: FactLog) -> None:
    """A run offering tools bursts near the trigger, pauses past the cache's life, and a title call (the run's first
    message under a system prompt of its own, no tools) comes first: it is no step of the run, so the run's request
    a few seconds later still finds its cache cold and the due reduction lands there, not a whole burst later."""
    clock = Clock()
    engine = engine_over(store, clock)
    agent = Agent(engine, clock, conversation="run" + TOOLS)
    await burst_near_the_trigger(agent)
    clock.now += 301.0
    title = [{"role": "system", "content": "Write a five-word title."}, agent.messages[1]]
    hashes = [message_hash(m) for m in title]
    state = await engine.history.sync(KEY, title, hashes)
    side = await engine.prepare(KEY, title, hashes, state, dialect=CHAT, model="m", tools=None, max_output=None,
                                complete=agent.summariser, conversation="title")
    assert side.compacted == "none"
    view = await agent.step(after=5.0)
    assert view.compacted == "proactive" and view.checkpoint is not None and view.checkpoint.masked_until > 0


async def test_a_forced_reduction_happens_whatever_the_cache_holds(store: FactLog) -> None:
    clock = Clock()
    agent = Agent(engine_over(store, clock), clock)
    await burst_near_the_trigger(agent)
    while agent.views[-1].compacted == "none":
        await agent.step()
        assert len(agent.views) < 40
    view = agent.views[-1]
    assert view.estimate.tokens <= view.threshold, "the view never goes out over the trigger"
    hashes = [message_hash(m) for m in agent.messages[:-2]]
    unreduced = agent.engine.view(agent.messages[:-2], hashes, None, dialect=CHAT, window=WINDOW, tools=None,
                                  max_output=None, fit=False)
    assert unreduced.estimate.tokens > view.threshold, "reduced mid-burst only once the trigger forced it"
    # Deep: the outputs kept whole before the newest (which the provider writes again) take a fifth of the room.
    kept = [m["content"] for m in view.messages if m["role"] == "tool" and not m["content"].startswith("[output")]
    assert 0 < sum(agent.engine.counter.text_tokens(text) for text in kept[:-1]) <= (view.threshold - view.unfreed) // 5


async def test_the_cache_ttl_setting_decides_what_a_gap_is(store: FactLog) -> None:
    assert engine_settings(Settings.from_env({"CTXPROXY_CACHE_TTL": "3600"})).cache_ttl == 3600.0
    clock = Clock()
    agent = Agent(engine_over(store, clock, cache_ttl=3_600.0), clock)  # Anthropic's 1-hour cache
    await burst_near_the_trigger(agent)
    await agent.step(after=600.0)
    assert agent.views[-1].compacted == "none" and agent.kept_prefix(), "10 minutes idle: the 1-hour cache is warm"
    await agent.step(after=3_601.0)
    assert agent.views[-1].compacted == "proactive", "past the hour it is cold: the due reduction lands"


async def test_a_ready_background_summary_is_applied_at_a_cold_moment_not_mid_burst(store: FactLog) -> None:
    clock = Clock()
    summariser = Summariser()
    engine = engine_over(store, clock, precompact_threshold=0.6, **MASKING_OFF)  # the summary tier alone
    agent = Agent(engine, clock, summariser)
    await agent.step()
    while engine.background.running(KEY) is None:
        await agent.step()
        assert len(agent.views) < 40
    await engine.background.join(KEY)
    assert summariser.calls == 1 and [f.kind for f in await read_log(store, KEY)][-1] == "checkpoint"
    view = await agent.step()
    assert view.compacted == "none" and view.checkpoint is None and agent.kept_prefix(), "mid-burst it waits"
    assert view.estimate.tokens <= view.threshold
    view = await agent.step(after=301.0)
    assert view.compacted == "background" and view.checkpoint is not None and view.checkpoint.summary
    assert view.estimate.tokens < agent.views[-2].estimate.tokens - 2_000


def test_the_cost_model_weighs_reads_saved_against_the_rewrite() -> None:
    def made(moment: Moment, tokens: int, freed: int, rewritten: int) -> bool:
        return timely(moment, tokens=tokens, threshold=12_800, growth=1_000, freed=freed,
                      rewritten=lambda: rewritten, rates=CacheRates())

    near, far = 10_000, 4_000  # 2 and 8 steps of 1,000 tokens below the trigger
    assert made(WARM, near, freed=20_000, rewritten=1_000), "saves 4,000 tokens' reads, rewrites 1,250's"
    assert not made(WARM, near, freed=5_000, rewritten=1_000), "saves 1,000, rewrites 1,250"
    assert not made(WARM, far, freed=50_000, rewritten=0), "far from the trigger the prefix stays"
    assert made(WARM, 13_000, freed=1, rewritten=10**6), "past the trigger: forced"
    assert made(COLD, far, freed=1, rewritten=10**6), "a session's first request: no gap known"
    assert made(Moment(True, 2.0), near, freed=1, rewritten=10**6), "cold, due within DUE_STEPS"
    assert not made(Moment(True, 2.0), far, freed=1, rewritten=0), "cold, but 8 steps off is not due"
    assert made(Moment(True, 20.0), far, freed=1, rewritten=10**6), "the next gap is 20 steps off"
    assert made(WARM, near, freed=10_000, rewritten=1_000), "2,000 tokens' reads saved before the trigger"
    assert not made(Moment(False, 1.0), near, freed=10_000, rewritten=1_000), "1,000 before the next gap: it waits"
    assert cache_rates("claude-sonnet-4-5").write == 1.25 and round(cache_rates("claude-sonnet-4-5").read, 6) == 0.1
    assert cache_rates("gpt-4o") == CacheRates(1.0, 0.5), "OpenAI bills no write premium, reads at half"
    assert cache_rates("no-such-model") == CacheRates(), "unpriced: Anthropic's"


def test_a_prompt_not_cached_to_its_end_is_reduced_at_once() -> None:
    """A client of Anthropic's without breakpoints near its prompt's end reads its tail at the full input price
    (``tail_cached=False``): a reduction that frees tokens saves them at once, warm or not, far from the trigger."""
    uncached = cache_rates("claude-sonnet-4-5", tail_cached=False)
    assert uncached.read == 1.0 and uncached.write == 1.25 and not uncached.cached
    assert cache_rates("claude-sonnet-4-5").cached and cache_rates("no-such-model", tail_cached=False).read == 1.0
    assert timely(WARM, tokens=4_000, threshold=12_800, growth=1_000, freed=1_000, rewritten=lambda: 10**6,
                  rates=uncached)
