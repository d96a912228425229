"""100 sessions in parallel through two proxy processes sharing one Redis, requests alternating between them.

Every message of a session carries the session's tag (``SESS-017``), and the
fake upstream echoes the tag of the conversation it was sent into its reply,
so a reply given to the wrong conversation, or a fact logged under the wrong
session, shows up as a foreign tag. The window is small, so sessions compact
many times; every fifth step the client sends the same request to both
proxies at once (a retry on the other replica), so two compactions of one
session can race. The fake counts summary requests in flight per tag: the
compaction lock must keep that at one.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.sessions import tenant_of
from proxy.store import open_store
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply, full_summary, summary_response
from tests.proxyfixtures import read_log, replay, same_conversation
from tests.proxyproc import ProxyProcess
from tests.redisproc import RedisProcess, free_port
from tests.test_compaction_e2e import prose

pytestmark = pytest.mark.slow

SESSIONS = 100
# 100 x 30 steps, measured on this 2-core machine: 22-37 s (3,000 chat requests, 600 of them sent twice, plus
# about 1,000 summaries, through two proxy processes, one Redis and the fake upstream sharing the 2 cores).
STEPS = 30
BURST_EVERY = 5
API_KEY = "sk-concurrency"
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
TAG = re.compile(r"SESS-\d{3}")


def tag_of(n: int) -> str:
    return f"SESS-{n:03d}"


class TaggingUpstream(FakeUpstream):
    """Replies carry the conversation's tag; summary requests are counted in flight per tag."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight: Counter[str] = Counter()
        self.max_in_flight: Counter[str] = Counter()
        self.mixed_prompts: list[set[str]] = []
        self.calls = itertools.count(1)

    def next_reply(self, body: dict[str, Any]) -> Reply:
        tags = set(TAG.findall(orjson.dumps(body["messages"]).decode()))
        tag = tags.pop() if len(tags) == 1 else "MIXED"
        n = next(self.calls)
        if n % 7 == 0:
            return Reply(content=f"Checked {tag}, next file please ({n}).")
        return Reply(tool_calls=[{"id": f"call_{n}", "type": "function", "function": {
            "name": "read_file", "arguments": orjson.dumps({"session": tag, "n": n}).decode()}}])

    async def summary(self, body: dict[str, Any]) -> web.Response:
        self.summary_requests.append(body)
        tags = set(TAG.findall(body["messages"][-1]["content"]))
        if len(tags) != 1:
            self.mixed_prompts.append(tags)
        key = min(tags, default="NONE")
        self.in_flight[key] += 1
        self.max_in_flight[key] = max(self.max_in_flight[key], self.in_flight[key])
        try:
            await asyncio.sleep(0.02)  # a summariser takes time; a racing second compaction would overlap it
        finally:
            self.in_flight[key] -= 1
        return summary_response(full_summary(f"Work on {key} continues.", key))


async def post(http: aiohttp.ClientSession, proxy: ProxyProcess, session: str,
               messages: list[dict[str, Any]], stream: bool) -> tuple[dict[str, Any], str]:
    """The reply, and whether the proxy compacted for it (``X-Ctxproxy-Compacted``)."""
    body = {"model": "gpt-4o", "messages": messages, "tools": TOOLS, "stream": stream}
    async with http.post(proxy.url + "/v1/chat/completions", data=orjson.dumps(body),
                         headers={"Authorization": f"Bearer {API_KEY}", "X-Session-Id": session}) as resp:
        raw = await resp.read()
        assert resp.status == 200, raw[:300]
        compacted = resp.headers["X-Ctxproxy-Compacted"]
    if not stream:
        message: dict[str, Any] = orjson.loads(raw)["choices"][0]["message"]
        return message, compacted
    reply: dict[str, Any] = {"role": "assistant", "content": None}
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: {"):
            for choice in orjson.loads(block[6:])["choices"]:
                delta = choice["delta"]
                if delta.get("content"):
                    reply["content"] = (reply["content"] or "") + delta["content"]
                for tc in delta.get("tool_calls") or []:
                    if tc.get("id"):
                        reply["tool_calls"] = [{"id": tc["id"], "type": "function",
                                                "function": {"name": tc["function"]["name"], "arguments": ""}}]
                    reply["tool_calls"][0]["function"]["arguments"] += tc["function"].get("arguments") or ""
    return reply, compacted


async def run_session(http: aiohttp.ClientSession, proxies: list[ProxyProcess], n: int,
                      stood_down: list[str]) -> list[dict[str, Any]]:
    """One client; ``stood_down`` collects bursts where one replica compacted and the other used its result."""
    tag, rng = tag_of(n), random.Random(n)
    session = f"conc-{n:03d}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": f"Audit repository {tag}, file by file."}]
    for step in range(STEPS):
        stream = (n + step) % 3 == 0
        if step % BURST_EVERY == BURST_EVERY - 1 and step < STEPS - 1:
            (first, how_first), (second, how_second) = await asyncio.gather(
                *(post(http, p, session, messages, stream) for p in proxies))
            reply = (first, second)[step % 2]
            if sorted((how_first, how_second)) == ["none", "proactive"]:
                stood_down.append(session)
        else:
            reply, _ = await post(http, proxies[(n + step) % 2], session, messages, stream)
        messages.append(reply)
        if reply.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                             "content": f"{tag} file {step}: " + prose(rng, 70)})
        else:
            messages.append({"role": "user", "content": f"{tag}: go on with the next file."})
    return messages[:-1]  # the last tool result or user message was never sent


async def test_hundred_sessions_through_two_replicas_stay_exact_and_separate(aiohttp_server, tmp_path: Path) -> None:
    fake = TaggingUpstream()
    upstream = await aiohttp_server(fake.app())
    redis = RedisProcess(free_port(), tmp_path / "redis")
    proxies = [ProxyProcess(str(upstream.make_url("/v1")), redis.url, tmp_path,
                            ["--context-window", "2048", "--min-retain-rounds", "2"], name=f"replica{i}")
               for i in range(2)]
    with redis:
        store = await open_store(redis.url)
        try:
            for proxy in proxies:
                await proxy.start()
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:
                stood_down: list[str] = []
                conversations = await asyncio.gather(*(run_session(http, proxies, n, stood_down)
                                                       for n in range(SESSIONS)))
            logs = [await read_log(store, SessionKey(tenant_of(API_KEY), f"conc-{n:03d}")) for n in range(SESSIONS)]
        finally:
            for proxy in proxies:
                proxy.close()
            await store.aclose()

    for n, (facts, conversation) in enumerate(zip(logs, conversations, strict=True)):
        assert [f.seq for f in facts] == list(range(len(facts))), n
        assert same_conversation(replay(facts), conversation), f"log of session {n} is not its conversation"
        for fact in facts:
            if fact.message is not None:
                found = set(TAG.findall(orjson.dumps(fact.message).decode()))
                assert found <= {tag_of(n)}, f"session {n} holds an entry of {found}"
        assert any(f.kind == "checkpoint" for f in facts), f"session {n} never compacted"
    assert fake.mixed_prompts == [], "a summary prompt mixed sessions"
    assert len(fake.max_in_flight) == SESSIONS
    assert max(fake.max_in_flight.values()) == 1, {k: v for k, v in fake.max_in_flight.items() if v > 1}
    # Both replicas got the same over-threshold step at once, one compacted and the other took its checkpoint:
    # the races the bound above is about did happen.
    assert len(stood_down) >= 10, stood_down
