"""Issue 36: which tier made a checkpoint is recorded by the engine and read one way by the run's closing line, the
demo's report and the inspector."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from proxy.context.checkpoint import Checkpoint
from proxy.context.log.tiers import TierCounts, tier_of_entry, tiers_in_log
from proxy.demo.session import WINDOW, run_demo
from proxy.keys import store_key
from proxy.launch.run import Closing, exit_line, figures
from proxy.settings import Settings
from proxy.store.base import FactLog, NewFact, SessionKey, StoredFact
from proxy.ui.pages import summary_html
from proxy.ui.timeline import TimelineCache
from tests.fakeupstream import FakeUpstream
from tests.proxyfixtures import read_log
from tests.test_run_agents import closing_figures
from tests.test_ui import TENANT, agent_session, ui_proxy


def derived(facts: list[StoredFact]) -> list[str]:
    """Each checkpoint entry's tier as the reader derives it with the recorded ``tier`` taken away."""
    made: dict[int, Checkpoint] = {}
    tiers = []
    for fact in facts:
        if fact.kind == "checkpoint":
            checkpoint = made[fact.seq] = Checkpoint.from_json(fact.extra["checkpoint"])
            old = {k: v for k, v in fact.extra.items() if k != "tier"}
            tiers.append(tier_of_entry(old, checkpoint, made.get(fact.extra["made_from"])))
    return tiers


async def test_the_engine_records_the_tier_of_every_checkpoint_it_writes(make_proxy: Any, fake: FakeUpstream) -> None:
    # Masking batches and summaries in 4,000 tokens with the last output kept whole (tests/test_ui.py); the
    # model-free tier when every summary fails in 3,000, where each view past the threshold is past the hard limit.
    proxy = await ui_proxy(make_proxy, context_window=4000, min_retain_rounds=2, keep_tool_outputs=1)
    await agent_session(proxy, fake, "s1", 10)
    fake.summary_mode = "fail"
    failing = await ui_proxy(make_proxy, context_window=3000, min_retain_rounds=2, keep_tool_output_share=1.0)
    await agent_session(failing, fake, "s2", 12)

    store: FactLog = proxy.app[store_key]
    both = await read_log(store, SessionKey(TENANT, "s1"))
    left_out = await read_log(store, SessionKey(TENANT, "s2"))
    recorded = [f.extra.get("tier") for f in both if f.kind == "checkpoint"]
    assert set(recorded) == {"mask", "summary"}, recorded
    for before, fact in itertools.pairwise(both):  # a summary's checkpoint comes right after its item
        if fact.kind == "checkpoint":
            assert (before.kind == "summary") == (fact.extra["tier"] == "summary"), fact.extra
    fallbacks = [f for f in left_out if f.kind == "checkpoint"]
    assert len(fallbacks) >= 2 and {f.extra.get("tier") for f in fallbacks} == {"fallback"}
    assert all(f.extra["checkpoint"]["elision"] for f in fallbacks)
    # What an older entry's derivation says of the same checkpoints.
    assert derived(both) == recorded and derived(left_out) == ["fallback"] * len(fallbacks)


async def test_an_entry_logged_before_tiers_were_recorded_has_its_tier_derived(store: FactLog) -> None:
    key = SessionKey("t", "old")

    def entry(made_from: int | None, summary: str = "", split: int = 1, masked: int = 0,
              elision: str = "") -> NewFact:
        made = Checkpoint(summary, split, "p", None, 100, 50, "gpt-4o", 0.0, masked_until=masked, elision=elision)
        extra: dict[str, Any] = {"checkpoint": orjson.loads(made.to_json())}
        if made_from is not None:
            extra["made_from"] = made_from
        return NewFact(kind="checkpoint", index=split, source="proxy", extra=extra)

    item = NewFact(kind="summary", index=4, source="proxy", message={"role": "user", "content": "so far"})
    await store.append(key, 0, [
        entry(None, masked=3),  # 0: the first masking batch
        entry(0, masked=5),  # 1: a batch made from it
        item, entry(1, "so far", 4, masked=5),  # 2, 3: a summary
        item, entry(3, "so far", 6, elision="[messages 4-5 left out]"),  # 4, 5: the model-free tier
        entry(5, "so far", 6, masked=8, elision="[messages 4-5 left out]"),  # 6: a batch on top of it
    ], 1.0)
    facts = await read_log(store, key)
    without = {f.seq: f for f in facts if f.kind == "checkpoint"}
    assert "tier" not in without[6].extra
    counts = await tiers_in_log(store, key, page=2)
    assert (counts.mask, counts.summary, counts.fallback) == (3, 1, 1)
    assert counts.text() == "1 summary, 3 masking batches, 1 model-free checkpoint"
    # A recorded tier is taken as written.
    batch = Checkpoint.from_json(without[6].extra["checkpoint"])
    assert tier_of_entry({**without[6].extra, "tier": "summary"}, batch, None) == "summary"


async def test_the_demo_report_the_closing_line_and_the_inspector_count_the_same_tiers(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/demo.db"
    said: list[str] = []
    report = await run_demo(store, serve=False, out=said.append)
    demo = report.tiers
    assert demo.mask >= 1 and demo.summary >= 1 and demo.fallback >= 1, demo
    shown = "\n".join(said)
    assert not re.search(r"\b1 (masking batches|model summaries|model-free checkpoints)\b", shown), shown
    assert f"{demo.fallback} model-free checkpoint{'' if demo.fallback == 1 else 's'} (" in shown

    run = await figures(Settings(store=store), report.session)
    line = closing_figures(exit_line(Closing(report.session, "http://127.0.0.1:8787", store), run))
    assert (line["summaries"], line["masking"], line["model_free"]) == (demo.summary, demo.mask, demo.fallback)

    from proxy.store import open_store
    log = await open_store(store)
    try:
        async with TimelineCache().fold(log, SessionKey(report.tenant, report.session)) as timeline:
            marks = Counter(m.tier for m in timeline.marks)
            html = summary_html(SessionKey(report.tenant, report.session), timeline, [], WINDOW, WINDOW)
    finally:
        await log.aclose()
    assert (marks["summary"], marks["mask"], marks["fallback"]) == (demo.summary, demo.mask, demo.fallback)
    assert (f"<dt>Compactions by tier</dt><dd>outputs shortened: {demo.mask}, summarised: {demo.summary}, "
            f"left out: {demo.fallback}</dd>") in html
    assert isinstance(demo, TierCounts)
