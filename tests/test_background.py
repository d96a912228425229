"""Background pre-compaction: the summary is written beside the requests, and a request waits only when it must.

The fake upstream's summary model is held (``summary_gate``) for as long as a
test likes: a slow summary, without sleeps. Requests between the soft threshold
and the hard limit must go out while it is held; the checkpoint it records is
used once the view reaches the trigger (mid-burst it waits: ``proxy.context.view.worth``);
and no request that did not have to wait waited (``ctxproxy_compaction_wait_seconds``
observes 0 for each).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from proxy.keys import engine_key, metrics_key
from proxy.sessions import tenant_of
from proxy.store import open_store
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import MASKING_OFF, read_log
from tests.test_compaction_e2e import prose, send, tool_call

WINDOW = 16_000
# Every test here keeps tool outputs unmasked (keep_tool_outputs): masking (tier 1) would free the window first,
# and these tests are about the summary (tier 2) written beside the requests.


def waits(proxy: Any) -> tuple[float, float]:
    """(count, sum) of ``ctxproxy_compaction_wait_seconds``."""
    samples = {s.name: s.value for m in proxy.app[metrics_key].registry.collect() for s in m.samples
               if s.name.startswith("ctxproxy_compaction_wait_seconds")}
    return samples["ctxproxy_compaction_wait_seconds_count"], samples["ctxproxy_compaction_wait_seconds_sum"]


def compactions(proxy: Any, trigger: str) -> float:
    return sum(s.value for m in proxy.app[metrics_key].registry.collect() for s in m.samples
               if s.name == "ctxproxy_compactions_total" and s.labels.get("trigger") == trigger)


async def background_proxy(make_proxy: Any, fake: FakeUpstream) -> Any:
    """A proxy compacting in the background past 0.6 of the window, in front of ``fake`` with that window."""
    fake.window = WINDOW
    return await make_proxy(context_window=WINDOW, precompact_threshold=0.6, **MASKING_OFF)  # the summary path


async def until_a_summary_is_held(make_proxy: Any, fake: FakeUpstream, session: str,
                                  seed: int) -> tuple[Any, list[dict[str, Any]]]:
    """Agent steps until the background summary has been asked for (and is held at ``fake.summary_gate``)."""
    proxy = await background_proxy(make_proxy, fake)
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Refactor the parser module."}]
    step = 0
    while not fake.summary_requests:
        fake.script.append(tool_call(step))
        _, reply = await send(proxy, messages, session, stream=False)
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": prose(rng, 300)}]
        step += 1
    return proxy, messages


async def test_requests_go_on_while_the_summary_is_written_and_use_it_when_ready(make_proxy,
                                                                                fake: FakeUpstream) -> None:
    """Between the soft threshold (0.6) and the trigger (0.8) requests go out while the summary is held."""
    proxy = await background_proxy(make_proxy, fake)
    fake.summary_gate = asyncio.Event()
    rng = random.Random(3)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Refactor the parser module."}]
    steps_while_held = 0
    step = 0
    while True:
        fake.script.append(tool_call(step))
        response, reply = await send(proxy, messages, "bg", stream=step % 2 == 0)
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                             "content": prose(rng, 120)}]
        steps_while_held += bool(fake.summary_requests)  # this step went out while the summary was held
        step += 1
        if int(response.headers["X-Ctxproxy-View-Tokens"]) > 0.72 * WINDOW:
            break  # close to the trigger: the next step might have to wait
    assert len(fake.summary_requests) == 1, "one background summary, started past the soft threshold"
    assert steps_while_held >= 3 and fake.summaries_answered == 0, "requests did not wait for the summary"

    fake.summary_gate.set()
    job = proxy.app[engine_key].background.running(SessionKey(tenant_of("sk-e2e"), "bg"))
    assert job is not None
    await job  # the held summary completes and records its checkpoint
    assert compactions(proxy, "background") == 1
    # Mid-burst the ready checkpoint waits (proxy.context.view.worth): the prompt prefix stays as it is until the
    # view reaches the trigger, where the checkpoint is there to use, no request waiting for it.
    held: list[int] = []
    while True:
        fake.script.append(tool_call(step))
        response, reply = await send(proxy, messages, "bg", stream=False)
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                             "content": prose(rng, 120)}]
        step += 1
        if response.headers["X-Ctxproxy-Compacted"] != "none":
            break
        held.append(int(response.headers["X-Ctxproxy-View-Tokens"]))
    assert held and held == sorted(held) and held[-1] <= 0.8 * WINDOW, "the held view grew up to the trigger"
    assert int(response.headers["X-Ctxproxy-View-Tokens"]) < 0.6 * WINDOW, "the ready checkpoint was applied"
    assert response.headers["X-Ctxproxy-Compacted"] == "background", "the first view using it says so"
    assert fake.requests[-1]["messages"][1]["content"].startswith("[ctxproxy] Summary of earlier work")
    fake.script.append(Reply(content="All done."))
    response, _ = await send(proxy, messages, "bg", stream=False)
    assert response.headers["X-Ctxproxy-Compacted"] == "none", "only the first one"
    assert fake.refused == 0 and max(fake.prompt_tokens) <= WINDOW
    assert waits(proxy) == (0.0, 0.0), "no request reached the trigger without its summary ready"


async def test_a_request_past_the_hard_limit_waits_for_the_running_summary(make_proxy, fake: FakeUpstream) -> None:
    """One big step jumps past the window while the summary is held: that request waits, and is the only one."""
    fake.summary_gate = asyncio.Event()
    proxy, messages = await until_a_summary_is_held(make_proxy, fake, "jump", seed=5)
    # 4,000 tokens on top of the 10,300 held when the summary starts: past the hard limit (12,800); counted
    # honestly, 2,400 words (12,700 in all) stay just under it and nothing waits.
    messages.append({"role": "user", "content": prose(random.Random(5), 4_000)})
    fake.script.append(Reply(content="Read it."))
    background = proxy.app[engine_key].background
    waiting = asyncio.create_task(send(proxy, messages, "jump", stream=False))
    await background.joined.wait()  # the request is waiting on the held summary
    fake.summary_gate.set()
    response, reply = await waiting
    assert response.status == 200 and response.headers["X-Ctxproxy-Compacted"] == "proactive"
    count, total = waits(proxy)
    assert count == 1 and total > 0.0, "the one request past the hard limit waited"
    assert fake.refused == 0
    fake.script.append(Reply(content="Next."))
    response, _ = await send(proxy, [*messages, reply, {"role": "user", "content": "Go on."}], "jump", stream=False)
    assert response.headers["X-Ctxproxy-Compacted"] == "none", "the summary it waited for is in use, not new"


async def test_shutdown_cancels_a_running_background_compaction_and_logs_nothing_of_it(make_proxy, fake: FakeUpstream,
                                                                                       store_url: str) -> None:
    fake.summary_gate = asyncio.Event()  # never set: the summary is still being written at shutdown
    proxy, _ = await until_a_summary_is_held(make_proxy, fake, "stop", seed=9)
    job = proxy.app[engine_key].background.running(SessionKey(tenant_of("sk-e2e"), "stop"))
    assert job is not None and not job.done()
    await proxy.close()  # the app's cleanup: background jobs first, then the store
    assert job.cancelled()
    store = await open_store(store_url)
    try:
        facts = await read_log(store, SessionKey(tenant_of("sk-e2e"), "stop"))
    finally:
        await store.aclose()
    assert facts and {f.kind for f in facts} == {"message"}, "no summary or checkpoint of the cancelled job"
