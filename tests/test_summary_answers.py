"""What the summary call's answer may do to the proxy: nothing (issue 35).

An answer that calls a tool is not a summary, at any door: a one-line preamble
beside the call ("Let me look at the files first.") would otherwise stand for
the whole compacted range. Each door's fake summary model answers that way in
its own API's shape (``PREAMBLE_CALL``), streamed when the client's request is
(the Gemini door's summary call is always ``:generateContent``): the
run goes on, compacted by masking or the model-free tier, each summary asked
once (a call is not a cut answer to ask again), and the preamble is nowhere in
the log.

An answer with no end, a 200 MiB body or an endless stream, is read only up to
its size cap and abandoned: the proxy (a ``ctxproxy serve`` child, so its
memory is its own) answers another tenant within a second meanwhile, its peak
memory barely moves, and the request that asked for the summary gets its
answer from the model-free tier.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.constants import HEADER_SESSION
from proxy.context.checkpoint import Checkpoint
from proxy.context.summary.summaryprompt import REMINDER
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import FactLog, SessionKey
from tests import test_gemini
from tests.fakegemini import FakeGemini
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script, final_text
from tests.fakeupstream import PREAMBLE, PREAMBLE_CALL, FakeUpstream, is_summary_request
from tests.proxyfixtures import read_log
from tests.proxyproc import ProxyProcess
from tests.scripted import KEY, Claude, Codex, rig
from tests.test_summary_call import API_KEY, history, send

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]


async def no_summary_was_taken(store: FactLog, key: SessionKey, asked: list[Any]) -> None:
    """Each summary request of ``asked`` was asked once (none is a second try, which ends with the format's
    reminder), no checkpoint holds a model's summary (each is masking or the model-free tier's), and the preamble
    reached no entry."""
    assert asked, "the summary model was asked"
    reminder = REMINDER.split("{")[0]
    assert not [body for body in asked if reminder in orjson.dumps(body).decode()], "a call is not asked again"
    facts = await read_log(store, key)
    checkpoints = [Checkpoint.from_json(f.extra["checkpoint"]) for f in facts if f.kind == "checkpoint"]
    assert checkpoints, "the proxy compacted all the same"
    assert all(not c.summary or c.elision for c in checkpoints), "only masking and the model-free tier"
    assert not [f for f in facts if PREAMBLE in orjson.dumps(f.to_json()).decode()]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_at_the_chat_door(make_proxy, fake: FakeUpstream, stream: bool) -> None:
    fake.summary_mode = PREAMBLE_CALL
    proxy = await make_proxy(context_window=4096, min_retain_rounds=2)
    fields: dict[str, Any] = {"stream": True} if stream else {}
    assert await send(proxy, "preamble", history(12), tools=TOOLS, **fields) == "proactive"
    assert all(body.get("stream", False) is stream for body in fake.summary_requests)
    await no_summary_was_taken(proxy.app[store_key], SessionKey(tenant_of(API_KEY), "preamble"),
                               fake.summary_requests)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("make_fake", "agent"), [(FakeResponses, Codex), (FakeMessages, Claude)],
                         ids=["responses", "messages"])
async def test_at_the_responses_and_messages_doors(aiohttp_server, aiohttp_client, tmp_path: Path, stream: bool,
                                                   make_fake: Any, agent: Any) -> None:
    fake = make_fake(Script(steps=20))
    fake.summary_style = PREAMBLE_CALL
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=3_000)
    client = agent(proxy)
    for _ in range(8):
        await client.step(stream=stream)
    summaries = [r.body for r in fake.requests if r.kind == "summary"]
    assert all(body["stream"] is stream for body in summaries)
    await no_summary_was_taken(proxy.app[store_key], SessionKey(tenant_of(KEY), client.session), summaries)


async def test_at_the_gemini_door(aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    fake = FakeGemini(Script(steps=14))
    fake.summary_style = PREAMBLE_CALL
    parts = await test_gemini.rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=4_000,
                                  min_retain_rounds=1)
    agent = test_gemini.GeminiClient(parts.client, padding=" lorem ipsum" * 150)
    assert await agent.run("Run the steps.", 14) == final_text(14)
    summaries = [r for r in fake.requests if r.kind == "summary"]
    assert all(r.path.endswith(":generateContent") for r in summaries)
    session = agent.answers[0].headers[HEADER_SESSION]
    await no_summary_was_taken(parts.store, SessionKey(tenant_of(test_gemini.KEY), session),
                               [r.body for r in summaries])


# -- an answer with no end ---------------------------------------------------------------------------

MIB = 1024 * 1024
#: A chat completion's opening, up to its content, and its closing: 200 MiB of content go between, made as sent.
HUGE_HEAD = b'{"id":"sum","object":"chat.completion","choices":[{"index":0,"finish_reason":"stop","message":{' \
            b'"role":"assistant","content":"'
HUGE_TAIL = b'"}}]}'


class FloodingSummariser(FakeUpstream):
    """A summary model whose answer has no end: ``huge``, a JSON body of 200 MiB, or ``endless``, a stream of
    text events that stops only when the proxy hangs up. Either is made as it is sent (one MiB, or one batch of
    events, written over and over), so the test never holds it. ``started`` is set once the answer is under way,
    ``ended`` once the fake stopped sending; ``sent`` counts the bytes written."""

    def __init__(self, flood: str) -> None:
        super().__init__()
        self.flood = flood
        self.started = asyncio.Event()
        self.ended = asyncio.Event()
        self.sent = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())  # read once: the parent's read gets the same bytes
        if not is_summary_request(body["messages"]):
            return await super().chat(request)
        self.summary_requests.append(body)
        endless = self.flood == "endless"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream" if endless else "application/json"})
        await resp.prepare(request)
        event = b"data: " + orjson.dumps({"id": "sum", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": "lorem ipsum "}, "finish_reason": None}]}) + b"\n\n"
        piece = event * (64 * 1024 // len(event)) if endless else b"a" * MIB
        try:
            await self.write(resp, HUGE_HEAD if not endless else piece)
            self.started.set()
            for _ in itertools.count() if endless else range(200):
                await self.write(resp, piece)
            await self.write(resp, HUGE_TAIL)
            await resp.write_eof()
        except ConnectionError:
            pass  # the proxy hung up: what it is meant to do
        finally:
            self.ended.set()
        return resp

    async def write(self, resp: web.StreamResponse, data: bytes) -> None:
        await resp.write(data)
        self.sent += len(data)
        await asyncio.sleep(0)  # a write the proxy keeps up with never waits: let the test's other tasks run


async def chat(http: aiohttp.ClientSession, proxy: ProxyProcess, key: str, session: str,
               messages: list[dict[str, Any]], stream: bool = False) -> tuple[int, str | None]:
    """One Chat Completions request: its status and what the proxy says it compacted."""
    body = {"model": "gpt-4o", "messages": messages, **({"stream": True} if stream else {})}
    async with http.post(proxy.url + "/v1/chat/completions", data=orjson.dumps(body),
                         headers={"Authorization": f"Bearer {key}", "X-Session-Id": session}) as resp:
        await resp.read()
        return resp.status, resp.headers.get("X-Ctxproxy-Compacted")


@pytest.mark.parametrize("flood", ["huge", "endless"])
async def test_a_summary_answer_past_its_cap_is_abandoned_and_hurts_no_tenant(aiohttp_server, tmp_path: Path,
                                                                            flood: str) -> None:
    fake = FloodingSummariser(flood)
    upstream = await aiohttp_server(fake.app())
    args = ["--context-window", "4096", "--min-retain-rounds", "2", "--summary-timeout", "20"]
    hello = [{"role": "user", "content": "Say hello."}]
    async with ProxyProcess(str(upstream.make_url("/v1")), f"sqlite:///{tmp_path}/facts.db", tmp_path, args) as proxy, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        assert await chat(http, proxy, "sk-bystander", "warm-up", hello) == (200, "none")
        before = proxy.rss_bytes()
        # The client streams in the endless case: its summary call is then streamed too, as the client's own is.
        flooded = asyncio.create_task(chat(http, proxy, API_KEY, "flooded", history(12), stream=flood == "endless"))
        await asyncio.wait_for(fake.started.wait(), 30)
        began = time.monotonic()
        assert await chat(http, proxy, "sk-bystander", "bystander", hello) == (200, "none")
        waited = time.monotonic() - began
        answered = await flooded
        await asyncio.wait_for(fake.ended.wait(), 30)
        peak = proxy.rss_bytes("VmHWM")
        log = proxy.log_bytes().decode()

    assert waited < 1.0, f"another tenant waited {waited:.2f} s on the summary answer"
    assert answered == (200, "proactive"), "the run goes on: the model-free tier stood in"
    assert len(fake.summary_requests) == 1
    assert fake.sent < 64 * MIB, "the proxy hung up past its cap"
    assert peak - before < 64 * MIB, f"the proxy's peak memory grew by {(peak - before) / MIB:.0f} MiB"
    assert log.count("summary answer abandoned: over") == 1, log[-2000:]
    assert "trigger=proactive outcome=fallback" in log
