"""What the proxy saved, folded from a log whose figures are known: per session, incrementally, in dollars."""

from __future__ import annotations

import asyncio
import random
import re
from html import escape as html_escape
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from proxy.cli import main
from proxy.context.view.tokens import RUNNING_FROM
from proxy.context.view.window import input_price_for
from proxy.dialects import CHAT
from proxy.http.turn import CLIENT_SUM
from proxy.keys import engine_key, store_key
from proxy.savings import SavingsCache, UsageTotals, saved_text
from proxy.store.base import FactLog, NewFact, SessionKey, StoredFact
from tests.fakeupstream import Reply, is_summary_request
from tests.proxyfixtures import read_log, replay
from tests.test_compaction_e2e import prose
from tests.test_run_agents import litellm_price
from tests.test_ui import KEY as KEY_UI
from tests.test_ui import ROOT, TENANT, TOKEN, TOOLS, agent_session, page, session_path, sign_in, ui_proxy

KEY = SessionKey("t", "s")


def output_price(model: str) -> float:
    """litellm's own output price, from its bundled map (offline, as ``litellm_price`` reads it)."""
    litellm_price(model)
    import litellm

    return float(litellm.model_cost[model]["output_cost_per_token"])


def reply(n: int, client: int, view: int, usage: dict[str, Any] | None, model: str = "gpt-4o",
          dialect: str = "chat") -> NewFact:
    extra: dict[str, Any] = {"dialect": dialect, "view": {"key": f"v{n}"}, "tokens": {"client": client,
                                                                                      "view": view}, "model": model}
    if usage is not None:
        extra["usage"] = usage
    return NewFact("message", n, "upstream", {"role": "assistant", "content": f"r{n}"}, f"h{n}", extra)


def question(n: int) -> NewFact:
    return NewFact("message", n, "client", {"role": "user", "content": f"q{n}"}, f"q{n}")


def summary(n: int, usage: dict[str, Any] | None, model: str = "gpt-4o", calls: int = 1,
            dialect: str = "chat") -> NewFact:
    """A compaction's summary entry, carrying its calls' usage as the engine logs it."""
    extra: dict[str, Any] = {"dialect": dialect, "calls": calls, "model": model}
    if usage is not None:
        extra["usage"] = usage
    return NewFact("summary", n, "proxy", {"role": "system", "content": f"summary {n}"}, None, extra)


def fold(*facts: NewFact) -> UsageTotals:
    return fold_stored([StoredFact(str(seq), seq, fact.kind, fact.index, fact.source, fact.message, 0.0, fact.hash,
                                   dict(fact.extra)) for seq, fact in enumerate(facts)])


def fold_stored(facts: list[StoredFact]) -> UsageTotals:
    totals = UsageTotals()
    for fact in facts:
        totals.add(fact)
    return totals


def test_usage_where_reported_the_view_where_not_and_the_saved_part_at_the_models_price() -> None:
    totals = fold(question(0), reply(1, 1_000, 1_000, {"prompt_tokens": 1_100}),
                  question(2), reply(3, 5_000, 2_000, {"prompt_tokens": 2_200,
                                                       "prompt_tokens_details": {"cached_tokens": 1_024}}),
                  question(4), reply(5, 6_000, 2_500, None))
    saved = 3_000 + 3_500
    dollars = pytest.approx(saved * litellm_price("gpt-4o"))
    assert totals.to_json() == {"replies": 3, "prompt_tokens": 3_300, "cached_tokens": 1_024,
                                "model_tokens": 1_100 + 2_200 + 2_500, "saved_tokens": saved,
                                "client_tokens": 1_100 + 2_200 + 2_500 + saved, "cost_saved": dollars,
                                "gross_saved_tokens": saved, "gross_cost_saved": dollars,
                                "summary_calls": 0, "summary_tokens": 0, "summary_cost": None,
                                # the peak context: the client's largest request, not the largest view
                                "cache_write_tokens": 0, "ttl_write_tokens": 0, "peak_tokens": 6_000,
                                "rewrite_factor": None,
                                "prefix_changes": {"compaction": 0, "masking": 0, "client": 0, "ttl": 0},
                                "caused_write_tokens": 0, "caused_write_cost": None}
    assert saved_text(totals) == ("12,300 tokens sent by the client, 5,800 seen by the model (1,024 cached), "
                                  f"6,500 saved, about ${saved * litellm_price('gpt-4o'):,.2f}")


def test_the_summary_calls_are_subtracted_from_what_was_saved_in_tokens_and_dollars() -> None:
    """The issue's reproduction: 18,504 tokens taken out of requests by one compaction whose summary call read
    3,144 and wrote 300 is a saving of 15,060, and so is reported; the gross and the cost stand beside it."""
    totals = fold(question(0), reply(1, 9_000, 9_000, {"prompt_tokens": 9_000}),
                  summary(2, {"prompt_tokens": 3_144, "completion_tokens": 300, "total_tokens": 3_444}),
                  question(3), reply(4, 20_000, 1_496, {"prompt_tokens": 1_496}))
    assert (totals.gross_saved_tokens, totals.summary_calls, totals.summary_tokens, totals.saved_tokens) == (
        18_504, 1, 3_444, 15_060)
    summary_dollars = 3_144 * litellm_price("gpt-4o") + 300 * output_price("gpt-4o")
    assert totals.summary_cost == pytest.approx(summary_dollars)
    assert totals.cost_saved == pytest.approx(18_504 * litellm_price("gpt-4o") - summary_dollars)
    assert saved_text(totals).endswith(f"15,060 saved, about ${totals.cost_saved:,.2f} (net: 18,504 taken out of "
                                       "requests, 3,444 spent on 1 summary call)")


def test_a_summary_that_has_not_paid_for_itself_is_a_loss_and_one_without_usage_counts_its_calls() -> None:
    totals = fold(question(0), reply(1, 2_000, 1_500, {"prompt_tokens": 1_500}),
                  summary(2, {"input_tokens": 1_800, "output_tokens": 200}, model="claude-opus-5-5", calls=2,
                          dialect="messages"),
                  summary(3, None, model="house-model-7"))
    assert (totals.saved_tokens, totals.summary_calls, totals.summary_tokens) == (500 - 2_000, 3, 2_000)
    assert totals.cost_saved is not None and totals.cost_saved < 0


def test_an_unknown_model_shows_tokens_only() -> None:
    totals = fold(reply(0, 9_000, 3_000, {"prompt_tokens": 3_000}, model="house-model-7"))
    assert input_price_for("house-model-7") is None
    assert (totals.saved_tokens, totals.cost_saved) == (6_000, None)
    assert saved_text(totals).endswith("6,000 saved")


def test_the_items_of_one_reply_count_once_and_anthropic_usage_adds_its_cache_parts() -> None:
    usage = {"input_tokens": 10, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 90}
    one = reply(1, 2_000, 1_000, usage, model="claude-opus-5-5", dialect="messages")
    totals = fold(question(0), one, NewFact("message", 2, "upstream", {"role": "assistant", "content": "more"}, "x",
                                            dict(one.extra)))
    assert (totals.replies, totals.model_tokens, totals.cached_tokens, totals.saved_tokens) == (1, 1_000, 900, 1_000)
    assert totals.cost_saved == pytest.approx(1_000 * litellm_price("claude-opus-5-5"))


def test_a_reply_logged_before_the_counts_were_recorded_counts_the_upstreams_figures() -> None:
    old = NewFact("message", 1, "upstream", {"role": "assistant", "content": "r"}, "h",
                  {"dialect": "chat", "usage": {"prompt_tokens": 70}})
    totals = fold(old)
    assert (totals.replies, totals.client_tokens, totals.model_tokens, totals.saved_tokens) == (1, 70, 70, 0)


async def test_the_cache_folds_only_what_was_appended_since(store: FactLog) -> None:
    await store.append(KEY, 0, [question(0), reply(1, 3_000, 1_000, {"prompt_tokens": 1_000})], 1.0)
    cache = SavingsCache()
    assert (await cache.totals(store, KEY)).saved_tokens == 2_000
    await store.append(KEY, 2, [question(2), reply(3, 4_000, 1_500, {"prompt_tokens": 1_500})], 2.0)
    [info] = [i async for i in store.sessions()]
    totals = await cache.of(store, info)
    assert (totals.replies, totals.saved_tokens, totals.model_tokens) == (2, 4_500, 2_500)


# -- through the proxy: recorded per request, shown by the admin API, the CLI, the inspector and /metrics ---------


async def test_a_long_compacted_sessions_whole_request_is_summed_from_where_it_parts_from_its_last(
        make_proxy, fake) -> None:
    """Each reply's count of the client's request is the whole request's, though the sum carries over steps."""
    proxy = await ui_proxy(make_proxy, context_window=4000, min_retain_rounds=2)
    rounds = RUNNING_FROM // 4 + 3  # four messages a round: the last requests have RUNNING_FROM messages or more
    await agent_session(proxy, fake, "long", rounds)
    key = SessionKey(TENANT, "long")
    facts = await read_log(proxy.app[store_key], key)
    replies = [f for f in facts if f.kind == "message" and f.source == "upstream"]
    policy = proxy.app[engine_key].policy(4000)
    long_ones = [r for r in replies if r.index >= RUNNING_FROM]
    assert len(long_ones) >= 4
    for fact in long_ones:
        assert fact.extra["tokens"]["client"] == policy.estimate(CHAT, replay(facts)[: fact.index], tools=TOOLS).local
    kept = proxy.app[engine_key].counter.views.get((CLIENT_SUM, key))
    assert kept is not None and len(kept.digests) == replies[-1].index


async def test_every_surface_shows_what_the_log_says_was_saved(make_proxy, fake, store_url: str) -> None:
    proxy = await ui_proxy(make_proxy, context_window=4000, min_retain_rounds=2)
    await sign_in(proxy)
    fake.cached_tokens = 512
    await agent_session(proxy, fake, "s1", 10)
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "s1"))
    assert any(f.kind == "checkpoint" for f in facts), "the session compacted"
    replies = [f for f in facts if f.kind == "message" and f.source == "upstream"]

    # Each reply records the proxy's count of what the client sent and of the view that went instead.
    policy = proxy.app[engine_key].policy(4000)
    last = replies[-1]
    assert last.extra["tokens"] == {
        "client": policy.estimate(CHAT, replay(facts)[: last.index], tools=TOOLS).local,
        "view": policy.estimate(CHAT, fake.requests[-1]["messages"], tools=TOOLS).local}
    assert last.extra["model"] == "gpt-4o"
    totals = UsageTotals()
    for fact in facts:
        totals.add(fact)
    assert totals.replies == len(replies) == 20 and totals.saved_tokens > 0
    reported = [fake.count(r) for r in fake.requests  # the fake's usage: its tokenizer's count of each request
                if not is_summary_request(r["messages"])]
    assert (totals.model_tokens, totals.cached_tokens) == (sum(reported), sum(min(p, 512) for p in reported))
    expected = totals.to_json()

    admin = {"Authorization": f"Bearer {TOKEN}"}
    listed = await (await proxy.get("/admin/savings", headers=admin)).json()
    assert listed == {"sessions": [{"tenant": TENANT, "session": "s1", **expected}], "total": expected}
    view = await (await proxy.get(f"/admin/sessions/{TENANT}/s1/view", headers=admin)).json()
    assert view["usage"] == expected

    shown = await asyncio.to_thread(CliRunner().invoke, main, ["sessions", "show", "s1", "--json", "--store",
                                                               store_url])
    assert orjson.loads(shown.output) == {"tenant": TENANT, "session": "s1", **expected}
    text = await asyncio.to_thread(CliRunner().invoke, main, ["sessions", "show", "s1", "--store", store_url])
    assert text.output == f"# Session s1 (tenant {TENANT})\n20 requests: {saved_text(totals)}.\n"

    html = await page(proxy, "/ui")
    assert (f'<td data-sort="{totals.client_tokens}">{totals.client_tokens:,}</td>'
            f'<td data-sort="{totals.model_tokens}">{totals.model_tokens:,}</td>'
            f'<td data-sort="{totals.saved_tokens}">{totals.saved_tokens:,} (${totals.cost_saved:,.2f})</td>') in html
    assert f"Over the sessions shown: {html_escape(saved_text(totals))}." in html
    assert f"<dt>Saved</dt><dd>{html_escape(saved_text(totals))}</dd>" in await page(proxy, session_path("s1"))

    metrics = (await (await proxy.get("/metrics")).text()).splitlines()
    assert f"ctxproxy_tokens_saved_total {float(totals.saved_tokens)}" in metrics
    cost = next(line for line in metrics if line.startswith("ctxproxy_cost_saved_dollars_total "))
    assert float(cost.split()[1]) == pytest.approx(totals.cost_saved)


async def test_dollars_follow_the_model_the_upstream_answered_with(make_proxy, fake) -> None:
    """A client naming gpt-4o-mini to a gateway that routes it to gpt-4o is billed, and priced, as gpt-4o."""
    proxy = await ui_proxy(make_proxy, context_window=4000, min_retain_rounds=2)
    fake.answer_model = "gpt-4o"
    await agent_session(proxy, fake, "routed", 10, model="gpt-4o-mini")
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "routed"))
    replies = [f for f in facts if f.kind == "message" and f.source == "upstream"]
    assert {f.extra["model"] for f in replies} == {"gpt-4o"}
    totals = fold_stored(facts)
    assert totals.gross_saved_tokens > 0 and litellm_price("gpt-4o") != litellm_price("gpt-4o-mini")
    assert totals.gross_cost_saved == pytest.approx(totals.gross_saved_tokens * litellm_price("gpt-4o"))
    metrics = (await (await proxy.get("/metrics")).text()).splitlines()
    cost = next(line for line in metrics if line.startswith("ctxproxy_cost_saved_dollars_total "))
    assert float(cost.split()[1]) == pytest.approx(totals.cost_saved)


async def test_each_summary_entry_carries_its_calls_usage_and_every_surface_subtracts_it(
        make_proxy, fake, store_url: str) -> None:
    """The summary calls' tokens, as the upstream reported them, come off the savings everywhere they are shown."""
    proxy = await ui_proxy(make_proxy, context_window=4000, min_retain_rounds=2)
    fake.answer_model = "gpt-4o-2024-08-06"
    await agent_session(proxy, fake, "net", 10)
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "net"))
    summaries = [f for f in facts if f.kind == "summary"]
    assert summaries and len(fake.summary_requests) == sum(f.extra["calls"] for f in summaries)
    billed = [(fake.count(body), fake._counter.text_tokens(answer)) for body, answer in
              zip(fake.summary_requests, fake.summary_answers, strict=True)]
    assert [f.extra["model"] for f in summaries] == ["gpt-4o-2024-08-06"] * len(summaries)
    assert sum(f.extra["usage"]["prompt_tokens"] + f.extra["usage"]["completion_tokens"] for f in summaries) == sum(
        p + c for p, c in billed)

    totals = fold_stored(facts)
    assert totals.summary_tokens == sum(p + c for p, c in billed) > 0
    assert totals.saved_tokens == totals.gross_saved_tokens - totals.summary_tokens - totals.caused_write_tokens
    model = "gpt-4o-2024-08-06"
    summary_dollars = sum(p * litellm_price(model) + c * output_price(model) for p, c in billed)
    assert totals.cost_saved == pytest.approx(totals.gross_saved_tokens * litellm_price(model) - summary_dollars
                                              - (totals.caused_write_cost or 0.0))

    admin = {"Authorization": f"Bearer {TOKEN}"}
    listed = await (await proxy.get("/admin/savings", headers=admin)).json()
    assert listed["total"] == totals.to_json()
    shown = await asyncio.to_thread(CliRunner().invoke, main, ["sessions", "show", "net", "--json", "--store",
                                                               store_url])
    assert orjson.loads(shown.output)["saved_tokens"] == totals.saved_tokens
    metrics = (await (await proxy.get("/metrics")).text()).splitlines()
    assert f"ctxproxy_tokens_saved_total {float(totals.saved_tokens)}" in metrics
    cost = next(line for line in metrics if line.startswith("ctxproxy_cost_saved_dollars_total "))
    assert float(cost.split()[1]) == pytest.approx(totals.cost_saved)


async def test_a_streamed_summary_call_is_counted_as_a_whole_one_is(make_proxy, fake) -> None:
    """A streaming client's summary call is streamed too (with the usage the client asks for): its usage (the last
    chunk) and the model its chunks name are what the summary entry carries."""
    proxy = await ui_proxy(make_proxy, context_window=4000, min_retain_rounds=2)
    fake.answer_model = "gpt-4o-2024-08-06"
    rng = random.Random(7)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for n in range(12):
        messages.append({"role": "user", "content": f"Round {n}: " + prose(rng, 300)})
        answer = prose(rng, 60)
        fake.script.append(Reply(content=answer))
        resp = await proxy.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEY_UI}",
                                                                 "X-Session-Id": "streamed"},
                                data=orjson.dumps({"model": "gpt-4o", "messages": messages, "stream": True,
                                                   "stream_options": {"include_usage": True}}))
        assert resp.status == 200 and b"data: [DONE]" in await resp.read()
        messages.append({"role": "assistant", "content": answer})
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "streamed"))
    summaries = [f for f in facts if f.kind == "summary"]
    assert summaries and all(body.get("stream") is True for body in fake.summary_requests)
    assert [f.extra["model"] for f in summaries] == ["gpt-4o-2024-08-06"] * len(summaries)
    assert sum(f.extra["usage"]["prompt_tokens"] for f in summaries) == sum(map(fake.count, fake.summary_requests))


def panel_expr(title: str) -> str:
    """The PromQL of the Grafana dashboard's panel ``title`` (its one target)."""
    dashboard = orjson.loads((ROOT / "deploy" / "grafana" / "ctxproxy-dashboard.json").read_bytes())
    panel = next(p for p in dashboard["panels"] if p["title"] == title)
    (target,) = panel["targets"]
    return str(target["expr"])


def evaluate(expr: str, scraped: str) -> float:
    """``sum(metric{job=~"$job"})`` or ``metric{…}`` over one scrape: the sum of the metric's samples (the one job
    there is); any other form is not what a figure that agrees with the closing line needs."""
    found = re.fullmatch(r'(?:sum\()?([a-z_]+)\{job=~"\$job"\}\)?', expr)
    assert found is not None, f"not a plain metric or its sum: {expr}"
    return sum(s.value for family in text_string_to_metric_families(scraped) for s in family.samples
               if s.name == found[1])


async def test_the_dashboards_tokens_saved_is_the_closing_lines_figure(make_proxy, fake) -> None:
    """A compacting run with summary calls: the dashboard's panel over a scrape equals what the closing line, the
    inspector and /admin/savings report (net of the summary calls, not the views' before - after)."""
    proxy = await ui_proxy(make_proxy, context_window=4000, min_retain_rounds=2)
    await agent_session(proxy, fake, "dash", 10)
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "dash"))
    totals = fold_stored(facts)
    assert totals.summary_tokens > 0 and totals.saved_tokens != totals.gross_saved_tokens
    scraped = await (await proxy.get("/metrics")).text()
    listed = await (await proxy.get("/admin/savings", headers={"Authorization": f"Bearer {TOKEN}"})).json()
    assert evaluate(panel_expr("Tokens saved (net)"), scraped) == listed["total"]["saved_tokens"] == (
        totals.saved_tokens)
    assert f"{totals.saved_tokens:,} saved" in saved_text(totals)  # the closing line's words
    assert evaluate(panel_expr("Dollars saved (net)"), scraped) == pytest.approx(listed["total"]["cost_saved"])
