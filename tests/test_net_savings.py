"""Savings counted net on the Responses and Gemini doors (issue 34), against what the fake upstream billed.

A scripted Codex (tests/scripted.py) and a scripted Gemini CLI (tests/test_gemini.py) run through the proxy in a
window small enough that it compacts with summary calls shaped like its requests, then an admin compacts it once
more (the canonical summary call). The fakes bill every answer as their tokenizer counts the
prompt and what the model wrote, and keep the usage with each request's record: an independent count, made
without the proxy's dialects. Each summary entry carries what its calls were billed, the totals' summary tokens are
the fake's, and the net figure (gross less the summary calls and the cache writes the proxy caused) is the one
``/admin/savings``, ``ctxproxy sessions show --json`` and ``/metrics`` show, on either store. The Chat and Messages
doors are held to the same in tests/test_savings.py and tests/test_cachewrites.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from click.testing import CliRunner

from proxy.cli import main
from proxy.constants import HEADER_SESSION
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.fakegemini import FakeGemini
from tests.fakeresponses import FakeResponses
from tests.fakescript import Recorded, Script
from tests.proxyfixtures import read_log
from tests.scripted import KEY as CODEX_KEY
from tests.scripted import Codex
from tests.scripted import rig as codex_rig
from tests.test_gemini import KEY as GEMINI_KEY
from tests.test_gemini import GeminiClient
from tests.test_gemini import rig as gemini_rig
from tests.test_run_agents import litellm_price
from tests.test_savings import fold_stored, output_price

TOKEN = "admin-secret"
#: Priced in litellm's bundled map, so the dollars are checked too.
GEMINI_MODEL = "gemini-2.5-flash"
CODEX_MODEL = "gpt-5.5"


@dataclass
class Run:
    """A compacted session through one door: the fake it ran against, the proxy, the session, its model, and how
    the door's API spells a usage object's input and output tokens (read here, not by the proxy's dialects)."""

    fake: FakeResponses | FakeGemini
    proxy: TestClient[Any, Any]
    key: SessionKey
    model: str
    billed: Callable[[Mapping[str, Any]], tuple[int, int]]
    #: The tenant's upstream credential, as the admin compact endpoint takes it.
    credential: str

    def prompt_tokens(self, record: Recorded) -> int:
        """The fake's tokenizer count of a request's prompt as its model reads it."""
        return sum(self.fake.prompt_counts(record.body)[1])


def responses_usage(usage: Mapping[str, Any]) -> tuple[int, int]:
    return int(usage["input_tokens"]), int(usage["output_tokens"])


def gemini_usage(usage: Mapping[str, Any]) -> tuple[int, int]:
    return int(usage["promptTokenCount"]), int(usage.get("candidatesTokenCount", 0)) + int(
        usage.get("thoughtsTokenCount", 0))


async def codex_run(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path, store_url: str) -> Run:
    fake = FakeResponses(Script(steps=20))
    proxy = await codex_rig(aiohttp_server, aiohttp_client, tmp_path, fake, store=store_url, context_window=3_000,
                            admin_token=TOKEN)
    codex = Codex(proxy, session="codex-net")
    for _ in range(12):
        await codex.step()
    return Run(fake, proxy, SessionKey(tenant_of(CODEX_KEY), codex.session), CODEX_MODEL, responses_usage,
               f"Bearer {CODEX_KEY}")


async def gemini_run(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path, store_url: str) -> Run:
    fake = FakeGemini(Script(steps=12))
    parts = await gemini_rig(aiohttp_server, aiohttp_client, tmp_path, fake, store=store_url,
                             context_window=4_000, min_retain_rounds=1, keep_tool_output_share=1.0,
                             admin_token=TOKEN)
    agent = GeminiClient(parts.client, padding=" lorem ipsum" * 150, model=GEMINI_MODEL)
    await agent.run("Run the steps.", 12)
    await agent.run("Once more.", 0)  # a round past the last compaction's, for the admin's to summarise
    session = agent.answers[-1].headers[HEADER_SESSION]
    return Run(fake, parts.client, SessionKey(tenant_of(GEMINI_KEY), session), GEMINI_MODEL, gemini_usage,
               GEMINI_KEY)


DOORS = {"responses": codex_run, "gemini": gemini_run}


@pytest.mark.parametrize("door", list(DOORS))
async def test_net_savings_equal_the_fakes_billed_usage_on_every_surface(
        aiohttp_server, aiohttp_client, tmp_path: Path, store_url: str, door: str) -> None:
    run = await DOORS[door](aiohttp_server, aiohttp_client, tmp_path, store_url)
    admin = {"Authorization": f"Bearer {TOKEN}"}
    compacted = await run.proxy.post(f"/admin/sessions/{run.key.tenant}/{run.key.session}/compact?model={run.model}",
                                     headers={**admin, "X-Upstream-Authorization": run.credential})
    result = await compacted.json()
    assert result["outcome"] == "ok", result
    facts = await read_log(run.proxy.app[store_key], run.key)
    summaries = [f for f in facts if f.kind == "summary"]
    calls = [r for r in run.fake.requests if r.kind == "summary"]
    assert len(summaries) >= 2 and len(calls) == sum(f.extra["calls"] for f in summaries), "it compacted, twice"
    # the run's calls were its requests reshaped (their tools kept), the admin's the canonical call (none)
    assert ["tools" in r.body for r in calls] == [True] * (len(calls) - 1) + [False]

    # the fake billed each summary call as its tokenizer counts the prompt, and something for the answer
    billed = [run.billed(r.usage or {}) for r in calls]
    assert [tokens_in for tokens_in, _ in billed] == [run.prompt_tokens(r) for r in calls]
    assert all(tokens_in > 0 and tokens_out > 0 for tokens_in, tokens_out in billed)
    # each summary entry carries what its calls were billed (the calls in order, ``calls`` of them per entry)
    start = 0
    for entry in summaries:
        mine = billed[start:start + entry.extra["calls"]]
        start += entry.extra["calls"]
        assert run.billed(entry.extra["usage"]) == (sum(i for i, _ in mine), sum(o for _, o in mine))
        assert entry.extra["model"] == run.model

    totals = fold_stored(facts)
    turns = [r for r in run.fake.requests if r.kind == "turn"]
    assert totals.prompt_tokens == sum(run.billed(r.usage or {})[0] for r in turns)
    assert (totals.summary_calls, totals.summary_tokens) == (len(calls), sum(i + o for i, o in billed))
    assert totals.gross_saved_tokens > 0 and totals.summary_tokens > 0
    assert totals.saved_tokens == totals.gross_saved_tokens - totals.summary_tokens - totals.caused_write_tokens
    # in dollars at the model's list prices; a token the implicit cache no longer serves is billed as plain input
    price = litellm_price(run.model)
    summary_dollars = sum(i * price + o * output_price(run.model) for i, o in billed)
    assert totals.caused_write_tokens > 0 and totals.caused_write_cost == pytest.approx(
        totals.caused_write_tokens * price)
    assert totals.cost_saved == pytest.approx(totals.gross_saved_tokens * price - summary_dollars
                                              - totals.caused_write_tokens * price)

    listed = await (await run.proxy.get("/admin/savings", headers=admin)).json()
    assert listed["total"] == totals.to_json()
    assert listed["total"]["saved_tokens"] == totals.saved_tokens
    shown = await asyncio.to_thread(CliRunner().invoke, main, ["sessions", "show", run.key.session, "--json",
                                                               "--store", store_url])
    assert shown.exit_code == 0, shown.output
    assert orjson.loads(shown.output)["saved_tokens"] == totals.saved_tokens
    metrics = (await (await run.proxy.get("/metrics")).text()).splitlines()
    assert f"ctxproxy_tokens_saved_total {float(totals.saved_tokens)}" in metrics
    cost = next(line for line in metrics if line.startswith("ctxproxy_cost_saved_dollars_total "))
    assert float(cost.split()[1]) == pytest.approx(totals.cost_saved)
