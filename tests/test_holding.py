"""Holding a ready background summary back (proxy.context.view.holding): only over the view the session's last
request stood on, as this process saw it, when that is the checkpoint the ready one was made from, and only while the
provider's cache is warm and nothing forces it."""

from __future__ import annotations

import asyncio
import random

import pytest

from proxy.context.checkpoint import Checkpoint
from proxy.context.engine import active_checkpoint
from proxy.context.log.undo import uncompact
from proxy.context.view.budget import Estimate
from proxy.context.view.holding import ShownCheckpoints
from proxy.context.view.prepared import PreparedView
from proxy.context.view.worth import COLD, WARM, CacheRates
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.store.base import FactLog, SessionKey
from tests.proxyfixtures import MASKING_OFF, read_log
from tests.test_compaction_e2e import prose
from tests.test_engine import Summariser
from tests.test_worth import KEY as WORTH
from tests.test_worth import WINDOW as WORTH_WINDOW
from tests.test_worth import Agent, Clock, engine_over

KEY = SessionKey("tenant", "holding")


def view(tokens: int) -> PreparedView:
    return PreparedView([], True, Estimate(tokens, None, None, tokens), None, "none", 12_800, 12_800)


def held(shown: ShownCheckpoints, key: SessionKey = KEY, moment=WARM, tokens: int = 6_000,
         made_from: Checkpoint | None = None) -> PreparedView | None:
    return shown.held(key, moment, view(3_000), [], made_from, view_on=lambda checkpoint: view(tokens), growth=500,
                      rates=CacheRates())


def test_a_ready_summary_waits_only_over_a_view_this_process_sent_while_the_cache_is_warm() -> None:
    shown = ShownCheckpoints(size=2)
    assert held(shown) is None, "a session this process has not served: used at once"
    shown.remember(KEY, None)
    assert held(shown) == view(6_000), "warm, 13 steps from the trigger: the last view's checkpoint stays"
    assert held(shown, moment=COLD) is None, "the cache is cold: it costs no extra write now"
    assert held(shown, tokens=13_000) is None, "past the trigger: forced"
    other = Checkpoint("an admin's summary", 0, "", None, 0, 0, "m", 0.0)
    assert held(shown, made_from=other) is None, "made from a checkpoint the last view did not stand on"
    for n in range(2):
        shown.remember(SessionKey("tenant", str(n)), None)
    assert held(shown) is None, "bounded: the least recently seen session is forgotten"


@pytest.mark.parametrize("where", ["this process", "another replica"])
async def test_a_compaction_outside_the_request_path_drops_the_held_checkpoint(store: FactLog, where: str) -> None:
    """An admin ``/compact`` runs (holding the session's compaction lock) when a request with a large tool output
    passes the soft threshold: its background summary waits for the lock, then is made from the manual checkpoint.
    The last view stood on no checkpoint, but the next (warm, under the trigger) must not hold back to it: that
    would set the admin's compaction aside until the cache goes cold. It uses the background checkpoint, whether
    this process or another replica over the same store made the admin's (the log says what it was made from)."""
    clock = Clock()
    engine = engine_over(store, clock, precompact_threshold=0.5, **MASKING_OFF)  # the summary tier alone
    replica = engine if where == "this process" else engine_over(store, clock, **MASKING_OFF)
    agent = Agent(engine, clock)
    for _ in range(18):
        await agent.step()
    assert engine.background.running(WORTH) is None and agent.views[-1].checkpoint is None
    gate = asyncio.Event()
    manual = Summariser(gate=gate)
    logged = agent.messages[:-2]  # the conversation as logged: the new output comes with the next request
    admin = asyncio.create_task(replica.compact(WORTH, logged, [message_hash(m) for m in logged], trigger="manual",
                                               dialect=CHAT, model="m", complete=manual, window=WORTH_WINDOW))
    await manual.entered.wait()  # the admin's compaction holds the lock, its summary on the way
    agent.messages[-1]["content"] = prose(random.Random(3), 3_500)
    view = await agent.step()
    assert view.checkpoint is None and engine.background.running(WORTH) is not None
    gate.set()
    result, _ = await admin
    await engine.background.join(WORTH)
    entries = [f for f in await read_log(store, WORTH) if f.kind == "checkpoint"]
    assert result.outcome == "ok" and len(entries) == 2 and entries[1].extra["made_from"] == entries[0].seq, \
        "the background summary was made from the admin's checkpoint"
    view = await agent.step()
    assert view.estimate.tokens <= view.threshold
    state = await engine.history.state(WORTH, refresh=True)
    assert view.compacted == "background" and view.checkpoint is not None
    assert view.checkpoint == active_checkpoint(state, [message_hash(m) for m in agent.messages[:-2]])
    assert view.checkpoint.summary and view.estimate.tokens < agent.views[-2].estimate.tokens - 3_000


async def test_after_an_undo_the_view_never_holds_back_to_the_checkpoint_it_took_back(store: FactLog) -> None:
    """A ready background summary waits mid-burst; an admin ``/compact`` makes a checkpoint from it, which the next
    view uses; then the admin undoes that compaction. The view goes back to the background summary (what the
    compaction was made from), never to the undone checkpoint the last view stood on."""
    clock = Clock()
    summariser = Summariser()
    engine = engine_over(store, clock, precompact_threshold=0.6, **MASKING_OFF)
    agent = Agent(engine, clock, summariser)
    while engine.background.running(WORTH) is None:
        await agent.step()
        assert len(agent.views) < 40
    await engine.background.join(WORTH)
    view = await agent.step()
    assert view.checkpoint is None, "mid-burst the ready summary waits"
    logged = agent.messages[:-2]
    result, _ = await engine.compact(WORTH, logged, [message_hash(m) for m in logged], trigger="manual", dialect=CHAT,
                                     model="m", complete=summariser, window=WORTH_WINDOW)
    assert result.outcome == "ok"
    manual = (await agent.step()).checkpoint
    assert manual is not None and manual.summary, "the admin's compaction is used at once"
    await uncompact(engine.history, WORTH)
    view = await agent.step()
    ready = active_checkpoint(await engine.history.state(WORTH, refresh=True),
                              [message_hash(m) for m in agent.messages[:-2]])
    assert ready is not None and ready != manual
    assert view.checkpoint == ready, "the undo left the background summary: the view stands on it"
