"""Holding a ready background summary back (proxy.context.view.holding): only over the view the session's last
request stood on, as the log names it (any replica's) or else as this process sent it, when that is the checkpoint
the ready one was made from, and only while the provider's cache is warm and nothing forces it."""

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


READY = Checkpoint("a background summary", 0, "", None, 0, 0, "m", 0.0)


def view(tokens: int, checkpoint: Checkpoint | None = None) -> PreparedView:
    return PreparedView([], True, Estimate(tokens, None, None, tokens), checkpoint, "none", 12_800, 12_800)


def held(shown: ShownCheckpoints, key: SessionKey = KEY, moment=WARM, tokens: int = 6_000,
         made_from: Checkpoint | None = None, logged: str | None = None) -> PreparedView | None:
    return shown.held(key, moment, view(3_000, READY), [], made_from, view_on=lambda checkpoint: view(tokens),
                      growth=500, rates=CacheRates(), logged=logged)


def test_a_ready_summary_waits_only_over_the_view_last_sent_while_the_cache_is_warm() -> None:
    shown = ShownCheckpoints(size=2)
    assert held(shown) is None, "a session neither the log nor this process has seen served: used at once"
    assert held(shown, logged="") == view(6_000), "the log's last view (any replica's) stood on none: it stays"
    assert held(shown, logged=READY.view_key) is None, "the last view already used the ready checkpoint"
    shown.remember(KEY, None)
    assert held(shown) == view(6_000), "warm, 13 steps from the trigger: the last view's checkpoint stays"
    assert held(shown, logged=READY.view_key) is None, "another replica's view since used the ready checkpoint"
    assert held(shown, moment=COLD) is None, "the cache is cold: it costs no extra write now"
    assert held(shown, tokens=13_000) is None, "past the trigger: forced"
    other = Checkpoint("an admin's summary", 0, "", None, 0, 0, "m", 0.0)
    assert held(shown, made_from=other) is None, "made from a checkpoint the last view did not stand on"
    shown.remember(KEY, READY)
    assert held(shown, logged="") is None, "this process sent the ready one since the log's last reply"
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


@pytest.mark.parametrize("previous", ["this replica", "another replica"])
async def test_the_view_holds_back_to_the_checkpoint_the_last_logged_view_stood_on(store: FactLog,
                                                                                    previous: str) -> None:
    """Replica B's background summary is ready mid-burst. When B itself served the previous request (on no
    checkpoint, as its reply's log entry says) the next one holds back to that. When replica A over the same store
    served it, on the ready checkpoint (A made none of it, so nothing waits there), the next request back on B
    must use the ready checkpoint too: holding back to what B last sent would change the prompt prefix twice more."""
    clock = Clock()
    replica_b = engine_over(store, clock, precompact_threshold=0.6, **MASKING_OFF)
    replica_a = engine_over(store, clock, precompact_threshold=0.6, **MASKING_OFF)
    agent = Agent(replica_b, clock)
    while replica_b.background.running(WORTH) is None:
        await answered(agent)
        assert len(agent.views) < 40
    await replica_b.background.join(WORTH)
    agent.engine = replica_b if previous == "this replica" else replica_a
    served = await answered(agent)
    ready = active_checkpoint(await replica_b.history.state(WORTH, refresh=True),
                              [message_hash(m) for m in agent.messages[:-2]])
    assert ready is not None and ready.summary
    assert served.checkpoint == (None if previous == "this replica" else ready)
    agent.engine = replica_b
    view = await agent.step()
    assert view.checkpoint == served.checkpoint, "the view stands on what the last view sent, whichever replica sent it"
    assert agent.kept_prefix()


async def answered(agent: Agent) -> PreparedView:
    """A step whose reply (the tool call) is logged as the proxy logs it: with the view it answered and its usage."""
    view = await agent.step()
    hashes = [message_hash(m) for m in agent.messages[:-1]]
    await agent.engine.history.sync(WORTH, agent.messages[:-1], hashes, upstream_from=len(hashes) - 1,
                                    extra_upstream={"view": {"key": view.view_key, "length": len(view.messages),
                                                             "last": hashes[-2]},
                                                    "usage": {"prompt_tokens": view.estimate.tokens}})
    return view
