"""Who broke the prompt cache, and what it cost: prefix changes by cause, the cache writes they billed, the
re-write factor, and savings net of the writes the proxy's own changes caused (proxy.prefixes, proxy.savings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.context.view.pace import SessionPace
from proxy.keys import engine_key, prefixes_key, store_key
from proxy.savings import UsageTotals, cache_write_price, saved_text
from proxy.sessions import tenant_of
from proxy.store.base import NewFact, SessionKey
from tests.fakemessages import FakeMessages, uncontrolled
from tests.fakescript import Recorded, Script
from tests.prefixchanges import MESSAGES, proxy_made
from tests.proxyfixtures import read_log
from tests.scripted import KEY, TASK, Claude, rig
from tests.test_savings import fold, question, reply
from tests.test_savings import summary as summary_entry

TOKEN = "admin-secret"


@dataclass
class Marking(Claude):
    """Claude Code's caching: content as blocks, a ``cache_control`` breakpoint on the last block of the last message,
    moved each turn."""

    #: Every body sent, in order: the client's own requests, as the fake would count them.
    sent: list[dict[str, Any]] = field(default_factory=list)

    def body(self, **extra: Any) -> dict[str, Any]:
        body = super().body(**extra)
        *earlier, last = [{**m, "content": m["content"] if isinstance(m["content"], list) else [
            {"type": "text", "text": m["content"]}]} for m in body["messages"]]
        marked = [*last["content"][:-1], {**last["content"][-1], "cache_control": {"type": "ephemeral"}}]
        self.sent.append(body := {**body, "messages": [*earlier, {**last, "content": marked}]})
        return body


async def figures(proxy: Any) -> dict[str, float]:
    """``/metrics`` as ``name{labels}`` → value."""
    text = await (await proxy.get("/metrics")).text()
    return {sample.name + "".join(f"{{{k}={v}}}" for k, v in sample.labels.items()): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


async def totals_of(proxy: Any, session: str) -> UsageTotals:
    totals = UsageTotals()
    for fact in await read_log(proxy.server.app[store_key], SessionKey(tenant_of(KEY), session)):
        totals.add(fact)
    return totals


def added(prompt: list[Any], counts: list[int], previous: list[Any]) -> int:
    """The fake's count of what ``prompt`` adds past ``previous``: its parts after the previous prompt's last
    message (the reply to it and the client's new messages), which an unchanged prefix would have written too."""
    last = max(index for index, part in enumerate(prompt) if part == previous[-1])
    return sum(counts[last + 1:])


def client_peak(fake: FakeMessages, client: Marking) -> int:
    """The client's largest request, as the fake counts it (breakpoints included, as it bills them)."""
    return max(sum(fake.prompt_counts(body)[1]) for body in client.sent)


def billed(record: Recorded, *parts: str) -> int:
    assert record.usage is not None
    return sum(int(record.usage.get(part) or 0) for part in parts)


async def test_the_proxys_prefix_changes_are_counted_by_cause_and_their_billed_cache_writes_come_off_the_savings(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """Through the Messages door, against a fake that bills cache creation as Anthropic does (tokens past the longest
    cached prefix): the requests whose prompt (breakpoints aside) does not extend the previous one are the prefix
    changes the metric counts (all the proxy's: the client only appends), the cache writes they were billed less
    what their prompt added past the previous one (which an unchanged prompt would have written too) are, within the
    proxy's estimate of the latter, what the savings are net of, beside the summary calls' billed tokens, and
    /admin/savings shows the re-write factor (and /metrics the peak it is over)."""
    fake = FakeMessages(Script(steps=20))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=3000, admin_token=TOKEN)
    client = Marking(proxy)
    for _ in range(12):
        await client.step()
    turns = fake.turns()
    assert len(turns) == 12
    counts = [fake.prompt_counts(turn.body)[1] for turn in turns]  # as billed: breakpoints included
    prompts = [uncontrolled(fake.prompt_counts(turn.body)[0]) for turn in turns]
    changed = [index for index, (previous, prompt) in enumerate(pairwise(prompts), 1)
               if prompt[:len(previous)] != previous]
    caused = sum(max(0, billed(turns[index], "cache_creation_input_tokens")
                     - added(prompts[index], counts[index], prompts[index - 1])) for index in changed)
    summaries = [r for r in fake.requests if r.kind == "summary"]
    assert changed and caused > 0 and summaries

    metrics = await figures(proxy)
    by_cause = {cause: metrics.get(f"ctxproxy_prefix_changes_total{{cause={cause}}}", 0.0)
                for cause in ("compaction", "masking", "client", "ttl")}
    assert sum(by_cause.values()) == len(changed) and by_cause["compaction"] >= 1
    assert by_cause["client"] == by_cause["ttl"] == 0
    written = sum(billed(turn, "cache_creation_input_tokens") for turn in turns)
    assert metrics["ctxproxy_cache_write_tokens_total"] == written

    totals = await totals_of(proxy, client.session)
    # the proxy counts the new items with its own tokenizer, scaled to the upstream's by the two counts of what the
    # session's last unchanged request wrote (its new items): an estimate of the fake's count (within 1% here; scaled
    # by the prompt's two counts, a summary's text beside padded outputs, 9% over; charging the whole writes 45%)
    caused_by = totals.caused_write_tokens
    assert caused_by == pytest.approx(caused, rel=0.02)
    prompts = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    assert all(billed(r, *prompts) == sum(fake.prompt_counts(r.body)[1]) > 0 for r in summaries), "billed as counted"
    summary_tokens = sum(billed(r, *prompts, "output_tokens") for r in summaries)
    assert totals.summary_tokens == summary_tokens
    assert totals.saved_tokens == totals.gross_saved_tokens - summary_tokens - caused_by
    assert metrics["ctxproxy_tokens_saved_total"] == totals.saved_tokens
    price = cache_write_price("claude-opus-5-5")
    assert price is not None and totals.caused_write_cost == pytest.approx(caused_by * price)

    listed = await (await proxy.get("/admin/savings", headers={"Authorization": f"Bearer {TOKEN}"})).json()
    row = listed["sessions"][0]
    # the peak context is the client's largest request (not the largest the proxy sent): the proxy's count of it,
    # the part left out of the view scaled to the upstream's tokenizer by what the last unchanged request wrote:
    # within 5% of the fake's count here (scaled by the prompt's two counts, a summary beside padded outputs, 13%)
    peak = client_peak(fake, client)
    assert peak > max(turn.tokens or 0 for turn in turns)
    assert row["cache_write_tokens"] == written and row["peak_tokens"] == pytest.approx(peak, rel=0.1)
    assert row["rewrite_factor"] == written / row["peak_tokens"] == pytest.approx(written / peak, rel=0.1)
    assert metrics["ctxproxy_peak_context_tokens_total"] == row["peak_tokens"]  # the factor in /metrics: writes over it
    assert row["prefix_changes"] == {cause: int(count) for cause, count in by_cause.items()}
    assert row["saved_tokens"] == totals.saved_tokens and row["caused_write_tokens"] == caused_by


async def test_a_prefix_whose_cache_lapsed_counts_as_ttl_not_as_the_proxys(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """With the clock moved past the cache's five minutes between two requests (an injected clock, no sleep), the
    second one's rewrite is the TTL's: counted as ``ttl`` and not subtracted from what was saved."""
    fake = FakeMessages(Script(steps=20))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake)
    now = [1_000.0]
    proxy.server.app[prefixes_key].clock = lambda: now[0]
    client = Marking(proxy)
    await client.step()
    now[0] += 60
    await client.step()
    now[0] += 301
    await client.step()
    metrics = await figures(proxy)
    assert metrics.get("ctxproxy_prefix_changes_total{cause=ttl}") == 1
    assert all(metrics.get(f"ctxproxy_prefix_changes_total{{cause={cause}}}", 0.0) == 0
               for cause in ("compaction", "masking", "client"))
    replies = [f for f in await read_log(proxy.server.app[store_key], SessionKey(tenant_of(KEY), client.session))
               if f.source == "upstream"]
    assert [f.extra["prefix"]["cause"] for f in replies] == [None, None, "ttl"]
    totals = await totals_of(proxy, client.session)
    assert totals.prefix_changes["ttl"] == 1 and totals.caused_write_tokens == 0


def test_a_session_whose_cache_writes_outweigh_what_it_saved_says_it_cost_more() -> None:
    """A compaction that took 100 tokens out of a request but made it rewrite 2,000 to the cache: net below 0, in
    dollars at the model's cache-write price, and the line for people says the proxy cost more than it saved."""
    usage = {"input_tokens": 10, "cache_creation_input_tokens": 2_000, "cache_read_input_tokens": 0,
             "output_tokens": 5}
    prefix = {"changed": True, "cause": "compaction", "kept_tokens": 0}
    answered = reply(1, 2_110, 2_010, usage, model="claude-opus-5-5", dialect="messages")
    answered.extra["prefix"] = prefix
    totals = fold(question(0), answered, summary_entry(2, None, model="claude-opus-5-5", calls=0))
    assert totals.caused_write_tokens == 2_000 and totals.saved_tokens == 100 - 2_000
    price = cache_write_price("claude-opus-5-5")
    assert price is not None and totals.cost_saved is not None and totals.cost_saved < 0
    assert "cache writes caused: 2,000 tokens" in saved_text(totals)
    assert "1 compaction" in saved_text(totals) and "cost more than it saved" in saved_text(totals)


async def test_a_client_that_rewinds_its_history_broke_the_prefix_itself(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """A client that drops its last turn and asks again changed the prefix: ``client``, not the proxy's cost."""
    fake = FakeMessages(Script(steps=20))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake)
    client = Marking(proxy)
    for _ in range(3):
        await client.step()
    del client.messages[-4:]  # two answers and their tool results: the client rewinds to before its last request
    await client.step()
    metrics = await figures(proxy)
    assert metrics.get("ctxproxy_prefix_changes_total{cause=client}") == 1
    assert all(metrics.get(f"ctxproxy_prefix_changes_total{{cause={cause}}}", 0.0) == 0
               for cause in ("compaction", "masking", "ttl"))
    totals = await totals_of(proxy, client.session)
    assert totals.prefix_changes["client"] == 1 and totals.caused_write_tokens == 0


def next_speaker(client: Claude) -> dict[str, Any]:
    """A side call on the run's history, as Gemini CLI's next-speaker check makes one: the conversation so far and
    a question, the run's system prompt, no tools."""
    body = Claude.body(client)
    del body["tools"]
    question = {"role": "user", "content": "Who speaks next? Answer as JSON."}
    return {**body, "messages": [*client.messages, question]}


async def test_side_calls_between_the_runs_requests_are_no_change_of_the_run_and_hide_none_of_the_proxys(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """Between two requests of its run the client sends, under the same session id, a title call (a conversation
    of its own: its own system prompt, no tools) and a question on the run's history (no tools): each of the run's
    requests is compared with the run's previous one, so the changes the proxy made to the run (a compaction right
    after a side call among them) are counted as its own, as many as the fake saw, and nobody's is the client's."""
    fake = FakeMessages(Script(steps=20))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=2000)
    client = Marking(proxy)
    title = {"model": "claude-opus-5-5", "max_tokens": 4096, "stream": False,
             "system": [{"type": "text", "text": "Write a five-word title for the conversation."}],
             "messages": [{"role": "user", "content": TASK}]}
    for step in range(12):
        if step:
            for side in (title, next_speaker(client)):
                resp = await proxy.post("/v1/messages", data=orjson.dumps(side), headers=client.request_headers())
                assert resp.status == 200, await resp.text()
        await client.step()
    runs = [turn.body for turn in fake.turns() if turn.body.get("tools")]
    assert len(runs) == len(client.sent) == 12 and len(fake.turns()) == 12 + 2 * 11
    changed = proxy_made(runs, client.sent, MESSAGES)
    metrics = await figures(proxy)
    by_cause = {cause: metrics.get(f"ctxproxy_prefix_changes_total{{cause={cause}}}", 0.0)
                for cause in ("compaction", "masking", "client", "ttl")}
    assert changed and by_cause["compaction"] + by_cause["masking"] == len(changed), (changed, by_cause)
    assert by_cause["client"] == by_cause["ttl"] == 0


async def test_a_long_session_rewrites_its_conversation_about_once_whatever_the_window(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """A session whose client's context grows to five times the window, through compactions and masking batches,
    with one idle gap past the cache's life (an injected clock for the proxy and the fake's cache, no sleep): the
    re-write factor is the fake's billed cache writes, less those the lapse made beyond the gap request's new
    items, over the client's largest request as the fake counts it: near 1, and the proxy's figure agrees with it
    (the writes over the largest prompt the proxy sent read more than 7)."""
    fake = FakeMessages(Script(steps=45))
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=16_000)
    now = [1_000.0]

    def clock() -> float:
        return now[0]

    fake.clock = proxy.server.app[prefixes_key].clock = clock
    engine = proxy.server.app[engine_key]
    engine.pace = SessionPace(clock, ttl=engine.pace.ttl)
    output = "\n" + " ".join(f"word{n % 97} line {n}" for n in range(60))
    client = Marking(proxy, output=lambda command: command.removeprefix("echo ") + output * 6)
    gap = 20
    for step in range(40):
        now[0] += 360 if step == gap else 20
        await client.step()
    turns = fake.turns()
    written = sum(billed(turn, "cache_creation_input_tokens") for turn in turns)
    new = sum(fake.prompt_counts(client.sent[gap])[1][len(fake.prompt_counts(client.sent[gap - 1])[0]):])
    lapsed = billed(turns[gap], "cache_creation_input_tokens") - new  # what the gap request wrote past its new items
    peak = client_peak(fake, client)
    assert peak > 5 * 16_000 and lapsed > 0
    factor = (written - lapsed) / peak
    assert factor <= 1.2

    totals = await totals_of(proxy, client.session)
    assert totals.prefix_changes["ttl"] == 1 and totals.prefix_changes["compaction"] >= 1
    assert totals.cache_write_tokens == written and totals.ttl_write_tokens == pytest.approx(lapsed, rel=0.02)
    assert totals.rewrite_factor == pytest.approx(factor, rel=0.05)
    assert written / max(turn.tokens or 0 for turn in turns) > 7
    metrics = await figures(proxy)
    assert metrics["ctxproxy_cache_write_tokens_total"] == written
    assert metrics["ctxproxy_ttl_write_tokens_total"] == totals.ttl_write_tokens
    assert metrics["ctxproxy_peak_context_tokens_total"] == totals.peak_tokens


def test_the_factor_is_the_writes_less_the_expired_caches_over_the_clients_largest_request_in_the_writes_units(
        ) -> None:
    """Folded from a log (proxy.savings): the client's requests, counted by the proxy, are scaled to the upstream's
    tokenizer by what the last unchanged request wrote (its new items, 2 upstream tokens per proxy token here), not
    by the prompt's two counts (a compaction's view tokenizes otherwise); the writes after the cache expired, past
    the request's new items, are the TTL's and are left out."""
    def answered(n: int, client: int, view: int, prompt: int, written: int, cause: str | None) -> NewFact:
        fact = reply(n, client, view, {"input_tokens": prompt - written, "cache_creation_input_tokens": written,
                                       "cache_read_input_tokens": 0, "output_tokens": 5}, "claude-opus-5-5",
                     "messages")
        fact.extra["prefix"] = {"changed": cause is not None, "cause": cause, "kept_tokens": 0, "added_tokens": 500}
        return fact

    totals = fold(question(0), answered(1, 1_000, 1_000, 2_000, 2_000, None),
                  question(2), answered(3, 1_500, 1_500, 3_000, 1_000, None),
                  question(4), answered(5, 2_000, 800, 1_800, 1_800, "compaction"),
                  question(6), answered(7, 2_500, 1_300, 2_800, 2_800, "ttl"))
    assert totals.cache_write_tokens == 7_600
    assert totals.caused_write_tokens == 1_800 - 2 * 500 and totals.ttl_write_tokens == 2_800 - 2 * 500
    assert totals.peak_tokens == 2_800 + 2 * (2_500 - 1_300)
    assert totals.rewrite_factor == (7_600 - 1_800) / 5_200
    assert totals.to_json()["ttl_write_tokens"] == 1_800 and "re-write factor 1.12" in saved_text(totals)

