"""Reactive compaction: the upstream's window is smaller than the proxy believes (128k vs 12k)."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakeresponses import FakeResponses
from tests.fakescript import Script
from tests.fakeupstream import FakeUpstream, Reply, overflow_body
from tests.scripted import Codex, rig
from tests.test_compaction_e2e import check_log, prose, send, tool_call

UPSTREAM_WINDOW = 12_000


def sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("style", ["openai", "anthropic", "vllm", "in-stream"])
async def test_twenty_rounds_complete_through_a_smaller_upstream(make_proxy, fake: FakeUpstream, style: str,
                                                                stream: bool) -> None:
    proxy = await make_proxy()  # believes gpt-4o's 128k window
    fake.window, fake.overflow_style = UPSTREAM_WINDOW, "openai" if style == "in-stream" else style
    fake.overflow_in_stream = style == "in-stream"
    rng = random.Random(3)
    session = f"reactive-{style}-{stream}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    outcomes = []
    for round_no in range(20):
        fact = " The deploy key id is FACT-Orca9." if round_no == 0 else ""
        messages.append({"role": "user", "content": f"Task {round_no}: " + prose(rng, 250) + fact})
        fake.script.append(tool_call(round_no))
        resp, call = await send(proxy, messages, session, stream)
        outcomes.append(resp.headers["X-Ctxproxy-Compacted"])
        messages.append(call)
        messages.append({"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": prose(rng, 350)})
        fake.script.append(Reply(content=prose(rng, 120)))
        resp, reply = await send(proxy, messages, session, stream)
        outcomes.append(resp.headers["X-Ctxproxy-Compacted"])
        messages.append(reply)

    assert fake.refused >= 1, "the upstream must have refused at least once for this test to mean anything"
    assert "reactive" in outcomes
    assert "FACT-Orca9" in orjson.dumps(fake.requests[-1]["messages"]).decode()
    await check_log(proxy, session, messages)
    text = await (await proxy.get("/metrics")).text()
    assert sample(text, "ctxproxy_compactions_total", trigger="reactive", outcome="ok") >= 1
    assert sample(text, "ctxproxy_reactive_retries_total", outcome="ok") >= 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_exhausted_retries_relay_the_original_refusal_byte_for_byte(make_proxy, fake: FakeUpstream,
                                                                         stream: bool) -> None:
    proxy = await make_proxy()
    fake.window, fake.summary_mode = 1_500, "fail"
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    rng = random.Random(5)
    for i in range(12):
        messages += [{"role": "user", "content": prose(rng, 200)}, {"role": "assistant", "content": f"ok {i}"}]
    messages.append({"role": "user", "content": "and now? " + prose(rng, 1_500)})  # no reduction can fit this
    body = {"model": "gpt-4o", "messages": messages, "stream": stream}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={"Authorization": "Bearer sk-e2e", "X-Session-Id": f"exhaust-{stream}"})
    raw = await resp.read()
    assert resp.status == 400
    assert raw == overflow_body("openai", fake.count(body), 1_500)[1]
    assert resp.headers["Content-Type"].startswith("application/json")
    assert fake.summary_requests, "the proxy tried to compact before giving up"
    text = await (await proxy.get("/metrics")).text()
    assert sample(text, "ctxproxy_reactive_retries_total", outcome="failed") >= 1
    assert sample(text, "ctxproxy_compactions_total", trigger="reactive", outcome="fallback") >= 1


@pytest.mark.parametrize("overflow", ["http", "event", "failed"])
async def test_a_refusal_without_a_figure_teaches_a_window_below_it(aiohttp_server, aiohttp_client, tmp_path,
                                                                   overflow: str) -> None:
    """Codex's Responses refusals name no window: told 4x the real one, the proxy is refused once, not every
    few steps, because it plans later views under a window below what was refused."""
    fake = FakeResponses(Script(steps=30), window=16_000, overflow=overflow)
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=64_000)

    def output(command: str) -> str:  # about 1,000 tokens
        return command.removeprefix("echo ") + "\n" + prose(random.Random(command), 900)

    codex = Codex(proxy, output=output)
    for _ in range(30):
        await codex.step()
    turns = fake.turns()
    assert len(turns) > 30 and all(t.tokens is not None for t in turns)
    refused = [n for n, t in enumerate(turns) if t.tokens is not None and t.tokens > 16_000]
    assert len(refused) == 1, f"refused at turns {refused} of {len(turns)}"
    assert codex.items[-1]["output"].startswith("step-30\n"), "every step ran: the run went on after the refusal"
