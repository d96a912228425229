"""The proxy process is killed with SIGKILL mid-session and restarted on the same store.

A real ``ctxproxy serve`` child runs a 100-step agent session (tool calls,
streaming and not) against a fake upstream in the test process. It is killed
while the upstream is answering, while a summary is being written, right after
a step, and at a random instant of a step; each time it is restarted on the same
store and the client retries the step it did not get an answer for. Afterwards:

- the log replays to exactly the conversation the client holds;
- every checkpoint written before a kill is still in the log, unchanged;
- no finished compaction is redone: after a restart no summary request covers a
  message index below the last checkpoint stored before the kill, and the first
  request after the restart is sent with the stored summary (or, when the kill
  interrupted a summary, redoes only that one, on top of the stored summary);
- a compaction interrupted by the kill does not hold its session's lock past the
  process: the retried step compacts.

A second test kills Redis itself (SIGKILL) mid-session and restarts it from its AOF.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.context.view.projection import SUMMARY_HEADER
from proxy.sessions import tenant_of
from proxy.store import FactLog, StoredFact, open_store
from proxy.store.base import SessionKey
from tests.fakeupstream import FACT, FakeUpstream, Reply, full_summary, is_summary_request, summary_response
from tests.proxyfixtures import read_log, replay, same_conversation
from tests.proxyproc import ProxyProcess
from tests.redisproc import RedisProcess, free_port
from tests.test_chat import assemble, sse_events
from tests.test_compaction_e2e import prose

pytestmark = pytest.mark.slow

STEPS = 100
WINDOW = 4096
API_KEY = "sk-crash-test"
SESSION = "crash-run"
KEY = SessionKey(tenant_of(API_KEY), SESSION)
HEADERS = {"Authorization": f"Bearer {API_KEY}", "X-Session-Id": SESSION}
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
NEW_MESSAGES = re.compile(r"<new-messages>\n(.*)\n</new-messages>", re.S)
INDEX = re.compile(r"^\[#(\d+) ", re.M)

# Steps at which the proxy dies (the session compacts every few steps, so each kill has checkpoints behind it).
HANG_UPSTREAM_STEP = 17
ARM_SUMMARY_HANG_STEP = 35
BETWEEN_STEPS_KILL = 60
RANDOM_KILL_STEP = 81
# Kept tool outputs counted, not capped at a share of the window, and outputs of 250 words: with honest usage,
# masking under the default share keeps 4,096 below the threshold for 35 steps, so the first kill found no summary.
PROXY_ARGS = ["--context-window", str(WINDOW), "--min-retain-rounds", "2", "--summary-timeout", "0.5",
              "--keep-tool-output-share", "1"]


def summarised_indices(body: dict[str, Any]) -> list[int]:
    """Conversation indices a summary request carries (the transcript labels each message ``[#i …]``)."""
    match = NEW_MESSAGES.search(body["messages"][-1]["content"])
    return [int(i) for i in INDEX.findall(match.group(1))] if match else []


class CrashUpstream(FakeUpstream):
    """Records chat and summary requests in one timeline; can hang the next N summary requests."""

    def __init__(self) -> None:
        super().__init__()
        self.timeline: list[tuple[str, dict[str, Any]]] = []
        self.hang_summaries = 0
        self.summary_entered = asyncio.Event()
        self.release = asyncio.Event()
        self._summary_ids = itertools.count(1)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json(loads=orjson.loads)
        if not is_summary_request(body["messages"]):
            self.timeline.append(("chat", body))
        return await super().chat(request)

    async def summary(self, body: dict[str, Any]) -> web.Response:
        self.timeline.append(("summary", body))
        self.summary_requests.append(body)
        if self.hang_summaries > 0:
            self.hang_summaries -= 1
            self.summary_entered.set()
            await self.release.wait()  # released at teardown; the proxy that sent it is dead by then
            return web.json_response({"error": {"message": "too late"}}, status=500)
        facts = " ".join(sorted(set(FACT.findall(body["messages"][-1]["content"]))))
        text = full_summary(f"Keep going (summary {next(self._summary_ids)}).", facts)
        return summary_response(text, model=body.get("model"))


@dataclass
class Crash:
    """What the store held when the proxy died, and where the fake's timeline stood."""

    checkpoints: dict[int, StoredFact]
    covered: int
    summary: str | None
    timeline_mark: int


@dataclass
class Agent:
    """The client: keeps the conversation, sends it whole each step, retries a step the proxy died on."""

    http: aiohttp.ClientSession
    proxy: ProxyProcess
    fake: CrashUpstream
    rng: random.Random
    messages: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 0
    compacted: str = ""

    def script(self, step: int, hang: asyncio.Event | None = None) -> None:
        self.attempts += 1
        self.fake.script.clear()  # an attempt killed before reaching the upstream leaves its reply unused
        if step % 10 == 9:
            reply = Reply(content=f"Finished part {step // 10}. " + prose(self.rng, 40), hang=hang)
        else:
            reply = Reply(hang=hang, tool_calls=[{"id": f"call_{step}_{self.attempts}", "type": "function",
                                                  "function": {"name": "read_file",
                                                               "arguments": orjson.dumps({"step": step}).decode()}}])
        self.fake.script.append(reply)

    async def send(self, step: int) -> dict[str, Any]:
        body = {"model": "gpt-4o", "messages": self.messages, "tools": TOOLS, "stream": step % 3 == 0}
        async with self.http.post(self.proxy.url + "/v1/chat/completions", data=orjson.dumps(body),
                                  headers=HEADERS) as resp:
            raw = await resp.read()
            assert resp.status == 200, raw[:300]
            self.compacted = resp.headers["X-Ctxproxy-Compacted"]
        if body["stream"]:
            events = sse_events(raw)
            assert events[-1] == "[DONE]"
            return assemble(events)
        message: dict[str, Any] = orjson.loads(raw)["choices"][0]["message"]
        return message

    def accept(self, step: int, reply: dict[str, Any]) -> None:
        self.messages.append(reply)
        if reply.get("tool_calls"):
            fact = " The deploy key lives in FACT-Vault9." if step == 3 else ""
            self.messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                                  "content": f"contents for step {step}: " + prose(self.rng, 250) + fact})
        else:
            self.messages.append({"role": "user", "content": f"Now part {step // 10 + 1}: " + prose(self.rng, 30)})


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Bounded poll for a condition another process makes true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.01)


async def kill(proxy: ProxyProcess, store: FactLog, fake: CrashUpstream) -> Crash:
    proxy.kill()
    facts = await read_log(store, KEY)
    checkpoints = {f.seq: f for f in facts if f.kind == "checkpoint"}
    latest = max(checkpoints.values(), key=lambda f: f.seq, default=None)
    payload = latest.extra["checkpoint"] if latest is not None else None
    return Crash(checkpoints, payload["retain_start_idx"] if payload else 0, payload["summary"] if payload else None,
                 len(fake.timeline))


def check_restart(crash: Crash, fake: CrashUpstream, final: dict[int, StoredFact]) -> None:
    for seq, fact in crash.checkpoints.items():
        assert final.get(seq) == fact, f"checkpoint at seq {seq} lost or changed after a restart"
    after = fake.timeline[crash.timeline_mark:]
    for kind, body in after:
        if kind == "summary":
            assert min(summarised_indices(body)) >= crash.covered, "a finished compaction was redone"
    if crash.summary is not None:
        kind, body = after[0]
        if kind == "chat":  # sent with the stored summary
            views = [m["content"] for m in body["messages"] if str(m.get("content")).startswith(SUMMARY_HEADER)]
            assert len(views) == 1 and crash.summary in views[0]
        else:  # an interrupted compaction redone: it builds on the stored summary, not from scratch
            assert f"<previous-summary>\n{crash.summary}\n</previous-summary>" in body["messages"][-1]["content"]


async def test_sigkill_at_any_point_loses_nothing_and_redoes_no_compaction(aiohttp_server, tmp_path: Path,
                                                                          durable_store_url: str) -> None:
    fake = CrashUpstream()
    upstream = await aiohttp_server(fake.app())
    proxy = ProxyProcess(str(upstream.make_url("/v1")), durable_store_url, tmp_path, PROXY_ARGS)
    store = await open_store(durable_store_url)
    crashes: list[Crash] = []
    rng = random.Random(20240611)
    try:
        await proxy.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            agent = Agent(http, proxy, fake, rng, [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Audit the repository, one file at a time."}])
            for step in range(STEPS):
                reply = await one_step(agent, step, store, crashes)
                agent.accept(step, reply)
        proxy.stop()
        facts = await read_log(store, KEY)
    finally:
        fake.release.set()
        proxy.close()
        await store.aclose()

    assert proxy.starts == 1 + len(crashes) == 5
    assert [f.seq for f in facts] == list(range(len(facts)))
    conversation = agent.messages[:-1]  # the last tool result / user message was never sent
    assert same_conversation(replay(facts), conversation)
    final = {f.seq: f for f in facts}
    assert sum(1 for f in facts if f.kind == "checkpoint") >= 3, "the run compacted several times"
    assert any(c.checkpoints for c in crashes), "at least one kill found checkpoints to keep"
    for crash in crashes:
        check_restart(crash, fake, final)


async def one_step(agent: Agent, step: int, store: FactLog, crashes: list[Crash]) -> dict[str, Any]:
    fake, proxy = agent.fake, agent.proxy
    if step == HANG_UPSTREAM_STEP:
        hang = asyncio.Event()
        agent.script(step, hang)
        sent = len(fake.requests)
        task = asyncio.create_task(agent.send(step))
        await until(lambda: len(fake.requests) > sent)  # the proxy is waiting on the upstream now
        return await crash_and_retry(agent, step, task, store, crashes, after_kill=hang.set)
    if step >= ARM_SUMMARY_HANG_STEP and not fake.summary_entered.is_set():
        if step == BETWEEN_STEPS_KILL:
            raise AssertionError(f"no compaction started in steps {ARM_SUMMARY_HANG_STEP}-{step}")
        fake.hang_summaries = 1
        agent.script(step)
        task = asyncio.create_task(agent.send(step))
        if not await summary_started(fake, task):
            return await task
        fake.hang_summaries = 0
        reply = await crash_and_retry(agent, step, task, store, crashes)
        # The summary died with the process (and its lock with it): the retried step compacts again.
        assert agent.compacted == "proactive"
        return reply
    agent.script(step)
    if step == RANDOM_KILL_STEP:
        task = asyncio.create_task(agent.send(step))
        await asyncio.sleep(agent.rng.uniform(0.0, 0.03))  # a random instant of the step, not a synchronisation
        return await crash_and_retry(agent, step, task, store, crashes)
    reply = await agent.send(step)
    if step == BETWEEN_STEPS_KILL:
        crashes.append(await kill(proxy, store, fake))
        await proxy.restart()
    return reply


async def summary_started(fake: CrashUpstream, task: asyncio.Task[dict[str, Any]]) -> bool:
    """Wait until either the step finished or a summary request is hanging in the fake."""
    entered = asyncio.create_task(fake.summary_entered.wait())
    await asyncio.wait([task, entered], timeout=30, return_when=asyncio.FIRST_COMPLETED)
    entered.cancel()
    return fake.summary_entered.is_set()


async def crash_and_retry(agent: Agent, step: int, task: asyncio.Task[dict[str, Any]], store: FactLog,
                          crashes: list[Crash], after_kill: Callable[[], None] | None = None) -> dict[str, Any]:
    """Kill the proxy with ``task`` in flight; restart it; the client retries unless the answer got through."""
    answered = task.done()  # kill() blocks the loop, so the task cannot finish in between
    crashes.append(await kill(agent.proxy, store, agent.fake))
    if after_kill is not None:
        after_kill()
    if answered:
        reply: dict[str, Any] | None = task.result()
    else:
        try:
            reply = await task
        except aiohttp.ClientError:
            reply = None  # the answer died with the proxy
    await agent.proxy.restart()
    if reply is not None:
        return reply
    agent.script(step)
    return await agent.send(step)


async def test_redis_killed_and_restarted_from_its_aof_mid_session_loses_nothing(aiohttp_client, upstream,
                                                                                tmp_path: Path) -> None:
    """Redis dies with SIGKILL (no shutdown, no final fsync) and comes back from its append-only file.

    The client keeps working through the outage (every step 200), what was logged before the kill is read back
    from the AOF unchanged, and the steps served during the outage are logged once Redis is back.
    """
    from proxy.app import create_app
    from proxy.keys import store_key
    from proxy.settings import Settings

    redis = RedisProcess(free_port(), tmp_path / "redis", ["--appendonly", "yes"])  # default fsync: everysec
    redis.start()
    try:
        proxy = await aiohttp_client(create_app(Settings(upstream=str(upstream.make_url("/v1")), store=redis.url)))
        store = proxy.app[store_key]
        messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]

        async def step(stream: bool) -> None:
            body = {"model": "m", "messages": messages, "stream": stream}
            resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body), headers=HEADERS)
            raw = await resp.read()
            assert resp.status == 200, raw[:300]
            messages.append(assemble(sse_events(raw)) if stream else orjson.loads(raw)["choices"][0]["message"])
            messages.append({"role": "user", "content": f"next {len(messages)}"})

        for i in range(6):
            await step(stream=bool(i % 2))
        before = await read_log(store, KEY)
        assert len(before) == 13  # system, first user message, 6 replies, 5 follow-ups

        redis.kill()
        loop = asyncio.get_running_loop()
        down_since, steps_down = loop.time(), 0
        # Some seconds of outage, bounded in steps as well as in time.
        while steps_down < 3 or (loop.time() - down_since < 2.0 and steps_down < 40):
            await step(stream=bool(steps_down % 2))
            steps_down += 1
        assert (await proxy.get("/readyz")).status == 503

        redis.start()  # same dir: loads the AOF written before the kill
        await until_ready(proxy)
        for i in range(3):
            await step(stream=bool(i % 2))

        facts = await read_log(store, KEY)
        assert facts[:len(before)] == before, "the AOF gave back every fact written before the kill"
        assert [f.seq for f in facts] == list(range(len(facts)))
        assert same_conversation(replay(facts), messages[:-1])
        assert [f.source for f in facts if f.message and f.message["role"] == "assistant"] == \
            ["upstream"] * (6 + steps_down + 3), "replies given during the outage were kept and logged as such"
    finally:
        if redis.proc is not None:
            redis.stop()


async def until_ready(proxy: Any) -> None:
    for _ in range(200):
        if (await proxy.get("/readyz")).status == 200:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the proxy never saw the restarted Redis")
