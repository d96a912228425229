"""Observability: the contract's Prometheus metrics, the overhead header, and the structured access line."""

from __future__ import annotations

import logging
import random
import re
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from proxy.keys import metrics_key, store_key
from proxy.logs import JsonFormatter
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import read_log
from tests.test_compaction_e2e import prose

AUTH = {"Authorization": "Bearer sk-metrics"}
TENANT = tenant_of("sk-metrics")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(proxy: Any) -> tuple[dict[str, str], Samples]:
    """``/metrics`` parsed: family types by name, and every sample keyed by name and labels."""
    resp = await proxy.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(await resp.text()):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return types, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def label_sets(samples: Samples, name: str) -> set[frozenset[str]]:
    return {frozenset(k for k, _ in labels) for n, labels in samples if n == name}


async def chat(proxy: Any, messages: list[dict[str, Any]], session: str) -> Any:
    body = {"model": "gpt-4o", "messages": messages}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={**AUTH, "X-Session-Id": session})
    assert resp.status == 200, await resp.text()
    return resp


async def long_conversation(proxy: Any, fake: FakeUpstream, session: str, rounds: int) -> list[str]:
    """Rounds of long user turns and long replies, non-streaming (so every metric is final at the response)."""
    rng = random.Random(17)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    compacted = []
    for n in range(rounds):
        messages.append({"role": "user", "content": f"Round {n}: " + prose(rng, 220)})
        fake.script.append(Reply(content=prose(rng, 160)))
        resp = await chat(proxy, messages, session)
        compacted.append(resp.headers["X-Ctxproxy-Compacted"])
        messages.append((await resp.json())["choices"][0]["message"])
    return compacted


async def test_contract_metric_names_types_and_labels(proxy) -> None:
    await chat(proxy, [{"role": "user", "content": "hi"}], "names")
    await proxy.get("/v1/models", headers=AUTH)
    types, samples = await scrape(proxy)
    expected = {
        "ctxproxy_requests": "counter", "ctxproxy_compactions": "counter", "ctxproxy_compaction_seconds": "histogram",
        "ctxproxy_tokens_before_compaction": "counter", "ctxproxy_tokens_after_compaction": "counter",
        "ctxproxy_reactive_retries": "counter", "ctxproxy_log_entries": "counter", "ctxproxy_store_errors": "counter",
        "ctxproxy_upstream_seconds": "histogram", "ctxproxy_overhead_seconds": "histogram",
        "ctxproxy_sessions_active": "gauge",
    }
    assert {name: types.get(name) for name in expected} == expected
    assert label_sets(samples, "ctxproxy_requests_total") == {frozenset({"route", "status"})}
    assert label_sets(samples, "ctxproxy_log_entries_total") == {frozenset({"kind"})}
    assert value(samples, "ctxproxy_requests_total", route="chat", status="200") == 1
    assert value(samples, "ctxproxy_requests_total", route="passthrough", status="200") == 1
    assert value(samples, "ctxproxy_log_entries_total", kind="message") == 2
    assert ("ctxproxy_store_errors_total", frozenset()) in samples
    assert ("ctxproxy_tokens_before_compaction_total", frozenset()) in samples
    assert ("ctxproxy_overhead_seconds_bucket", frozenset({("le", "+Inf")})) in samples
    assert value(samples, "ctxproxy_sessions_active") == 1
    assert value(samples, "process_resident_memory_bytes") > 0


CONTRACT_VALUES = {  # the label values CONTRACT.md names, by family and label
    "ctxproxy_requests": ("chat", "responses", "messages", "passthrough", "admin"),
    "ctxproxy_compactions": ("background", "proactive", "reactive", "manual", "client",
                             "ok", "failed", "timeout", "skipped", "fallback"),
    "ctxproxy_reactive_retries": ("ok", "failed"),
    "ctxproxy_literals": ("kept", "added", "dropped"),
}


async def test_help_texts_list_the_label_values_and_name_no_module(proxy) -> None:
    """What a dashboard author reads in /metrics: each label's values, and no internal module names."""
    await chat(proxy, [{"role": "user", "content": "hi"}], "help")
    resp = await proxy.get("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
    for name, values in CONTRACT_VALUES.items():
        listed = re.findall(r"[a-z]+", families[name].documentation)
        assert set(values) <= set(listed), (name, families[name].documentation)
    caches = proxy.app[metrics_key].caches()
    assert set(caches) <= set(re.findall(r"[a-z]+", families["ctxproxy_cache_bytes"].documentation))
    kinds = re.findall(r"[a-z]+", families["ctxproxy_log_entries"].documentation)
    assert {"message", "rewind", "summary", "checkpoint", "retire"} <= set(kinds)
    for family in families.values():
        assert not re.search(r"\bproxy\.[a-z]", family.documentation), (family.name, family.documentation)


async def test_compaction_metrics_move_with_proactive_compactions(make_proxy, fake: FakeUpstream) -> None:
    proxy = await make_proxy(context_window=4000)
    rounds = 14
    compacted = await long_conversation(proxy, fake, "compacts", rounds)
    await chat(proxy, [{"role": "user", "content": "another session"}], "second")
    _, samples = await scrape(proxy)

    ok = value(samples, "ctxproxy_compactions_total", trigger="proactive", outcome="ok")
    assert ok == compacted.count("proactive") >= 1
    assert label_sets(samples, "ctxproxy_compactions_total") == {frozenset({"trigger", "outcome"})}
    before = value(samples, "ctxproxy_tokens_before_compaction_total")
    after = value(samples, "ctxproxy_tokens_after_compaction_total")
    assert before > after > 0
    assert value(samples, "ctxproxy_compaction_seconds_count") == ok

    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "compacts"))
    by_kind = {kind: sum(1 for f in facts if f.kind == kind) for kind in ("message", "summary", "checkpoint")}
    assert by_kind["summary"] == by_kind["checkpoint"] == ok
    assert value(samples, "ctxproxy_log_entries_total", kind="message") == by_kind["message"] + 2  # + "second"
    assert value(samples, "ctxproxy_log_entries_total", kind="summary") == ok
    assert value(samples, "ctxproxy_log_entries_total", kind="checkpoint") == ok

    requests = rounds + 1
    assert value(samples, "ctxproxy_requests_total", route="chat", status="200") == requests
    assert value(samples, "ctxproxy_overhead_seconds_count") == requests
    assert value(samples, "ctxproxy_upstream_seconds_count") == requests
    assert value(samples, "ctxproxy_sessions_active") == 2


async def test_failed_reactive_retries_are_counted_by_outcome(make_proxy, fake: FakeUpstream) -> None:
    proxy = await make_proxy()
    fake.window, fake.summary_mode = 1_500, "fail"
    rng = random.Random(5)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for i in range(12):
        messages += [{"role": "user", "content": prose(rng, 200)}, {"role": "assistant", "content": f"ok {i}"}]
    messages.append({"role": "user", "content": "and now? " + prose(rng, 1_500)})  # no reduction can fit this
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps({"model": "gpt-4o", "messages": messages}),
                            headers={**AUTH, "X-Session-Id": "refused"})
    assert resp.status == 400
    _, samples = await scrape(proxy)
    assert label_sets(samples, "ctxproxy_reactive_retries_total") == {frozenset({"outcome"})}
    assert value(samples, "ctxproxy_reactive_retries_total", outcome="failed") == 1
    assert value(samples, "ctxproxy_compactions_total", trigger="reactive", outcome="fallback") >= 1
    assert value(samples, "ctxproxy_requests_total", route="chat", status="400") == 1


async def test_overhead_header_on_whole_and_streamed_answers(proxy) -> None:
    for stream in (False, True):
        body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
        resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body), headers=AUTH)
        await resp.read()
        assert resp.status == 200
        overhead = resp.headers["X-Ctxproxy-Overhead-Ms"]
        assert float(overhead) >= 0
        assert overhead == f"{float(overhead):.2f}", "milliseconds with two decimals"


async def test_access_line_carries_structured_fields(make_proxy, fake: FakeUpstream, caplog) -> None:
    proxy = await make_proxy(context_window=4000)
    caplog.set_level(logging.INFO, logger="proxy.access")
    # honest usage: 8 rounds (about 3,100 tokens) stay under 4,000's threshold; the 9th compacts
    compacted = await long_conversation(proxy, fake, "logged", 10)
    records = [r for r in caplog.records if r.name == "proxy.access"]
    assert len(records) == len(compacted)
    assert [r.fields["compacted"] for r in records] == compacted
    assert "proactive" in compacted

    line = orjson.loads(JsonFormatter().format(records[-1]))
    assert set(line) == {"ts", "level", "logger", "message", "event", "session", "tenant", "status", "view_tokens",
                         "compacted", "upstream_ms", "overhead_ms"}
    assert line["logger"] == "proxy.access" and line["level"] == "info"
    assert line["message"].startswith("chat session=logged status=200 ")
    assert (line["event"], line["session"], line["tenant"], line["status"]) == ("chat", "logged", TENANT, 200)
    assert isinstance(line["view_tokens"], int) and line["view_tokens"] > 0
    assert line["upstream_ms"] >= 0 and line["overhead_ms"] >= 0
    assert "sk-metrics" not in orjson.dumps([r.__dict__.get("fields") for r in records]).decode()


def test_json_formatter_fields_never_replace_core_keys() -> None:
    record = logging.LogRecord("proxy.access", logging.INFO, __file__, 1, "chat %s", ("x",), None)
    record.fields = {"message": "spoofed", "session": "s"}
    assert orjson.loads(JsonFormatter().format(record)) == {
        "ts": round(record.created, 3), "level": "info", "logger": "proxy.access", "message": "chat x", "session": "s"}
