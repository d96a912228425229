"""A summariser that hangs, fails or talks nonsense changes nothing: not the log, not the active checkpoint.

Each case first lets one compaction succeed (so there is an active checkpoint
to protect), then breaks the summariser in one way and keeps the session going
over the threshold: every request still gets a 200, is sent with the same
checkpoint's summary, and the log gains messages only.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.context.view.projection import SUMMARY_HEADER
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply, full_summary, summary_response
from tests.proxyfixtures import MASKING_OFF, read_log, replay, same_conversation
from tests.test_compaction_e2e import prose

API_KEY = "sk-summary-faults"
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]

def summary_body(content: str, finish_reason: str | None = "stop") -> tuple[int, bytes, str]:
    return 200, orjson.dumps({"choices": [{"index": 0, "finish_reason": finish_reason,
                                           "message": {"role": "assistant", "content": content}}]}), "application/json"


#: Broken answers to a summary request, beyond FakeUpstream's own "fail", "hang" and "empty".
GARBAGE: dict[str, tuple[int, bytes, str]] = {
    "not-json": (200, b"Sure! Here is your summary: everything went fine.", "text/plain"),
    "bad-json": (200, b'{"choices": [{"message": {"content": "cut off', "application/json"),
    "no-choices": (200, b'{"id": "x", "object": "chat.completion", "usage": {"prompt_tokens": 1}}', "application/json"),
    "empty-choices": (200, b'{"id": "x", "choices": []}', "application/json"),
    "null-content": (200, b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": null}}]}',
                     "application/json"),
    "number-content": (200, b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": 42}}]}',
                       "application/json"),
    "error-in-200": (200, b'{"error": {"message": "overloaded", "type": "server_error"}}', "application/json"),
    "not-an-object": (200, b'["## 1. Goals"]', "application/json"),
    # Well-formed answers that are not a summary (issue 11, item 9; issue 18, item 1): asked twice, then failed.
    "refusal": summary_body("I'm sorry, I can't help with that."),
    "refusal-curly": summary_body("I\u2019m sorry, but I can\u2019t assist with that request."),
    "as-an-ai": summary_body("As an AI language model, I cannot summarise this conversation."),
    "whitespace": summary_body(" \n\t "),
    "length": summary_body(full_summary("Keep going."), "length"),
    "no-finish-reason": summary_body(full_summary("Keep going."), None),
}
#: Answers in another shape than the one asked for, which are summaries all the same (issue 18, item 1).
OTHER_SHAPES = {
    "bold": "**Goals**\nRead every file.\n\n**Work completed**\nRead files 1 to 9.",
    "numbered": "1. Goals: read every file\n2. Work completed: files 1 to 9 read\n3. Next steps: the rest",
    "german": "## 1. Ziele\nJede Datei lesen.\n## 6. Aktueller Stand\nDateien 1 bis 9 gelesen.",
    "prose": "The user asked the agent to read every file; it has read the first nine and goes on.",
}


class BrokenSummariser(FakeUpstream):
    """FakeUpstream whose summary requests can also get garbage, or hang until the test ends."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def summary(self, body: dict[str, Any]) -> web.Response:
        if self.summary_mode == "hang":
            self.summary_requests.append(body)
            await self.release.wait()  # past the proxy's summary timeout; released at the end of the test
            return web.json_response({"error": {"message": "late"}}, status=500)
        if self.summary_mode in OTHER_SHAPES:
            self.summary_requests.append(body)
            return summary_response(OTHER_SHAPES[self.summary_mode])
        if self.summary_mode in GARBAGE:
            self.summary_requests.append(body)
            status, raw, content_type = GARBAGE[self.summary_mode]
            return web.Response(status=status, body=raw, content_type=content_type)
        return await super().summary(body)


@pytest.fixture
def fake() -> BrokenSummariser:
    return BrokenSummariser()


def compactions(text: str, outcome: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ctxproxy_compactions_total" and sample.labels.get("outcome") == outcome:
                total += sample.value
    return total


class Session:
    def __init__(self, proxy: Any, fake: BrokenSummariser, name: str) -> None:
        self.proxy, self.fake, self.name = proxy, fake, name
        self.rng = random.Random(name)
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                               {"role": "user", "content": "Read every file."}]
        self.step = 0

    async def send(self) -> None:
        self.step += 1
        call = {"id": f"call_{self.step}", "type": "function",
                "function": {"name": "read_file", "arguments": orjson.dumps({"n": self.step}).decode()}}
        self.fake.script.append(Reply(tool_calls=[call]))
        body = {"model": "gpt-4o", "messages": self.messages, "tools": TOOLS}
        resp = await self.proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                                     headers={"Authorization": f"Bearer {API_KEY}", "X-Session-Id": self.name})
        raw = await resp.read()
        assert resp.status == 200, raw[:300]
        reply = orjson.loads(raw)["choices"][0]["message"]
        self.messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                                  "content": prose(self.rng, 120)}]

    async def facts(self) -> list[Any]:
        return await read_log(self.proxy.app[store_key], SessionKey(tenant_of(API_KEY), self.name))


def summary_in_view(body: dict[str, Any]) -> str:
    found = [m["content"] for m in body["messages"] if str(m.get("content")).startswith(SUMMARY_HEADER)]
    assert len(found) == 1, "the view carries exactly one summary"
    return str(found[0])


@pytest.mark.parametrize("mode", ["fail", "hang", "empty", *GARBAGE])
async def test_a_broken_summariser_changes_nothing_and_the_session_keeps_working(
        make_proxy, fake: BrokenSummariser, mode: str) -> None:
    # Honest usage: masking alone keeps 4,096 under the threshold for 30 steps; at 2,048 a summary comes by step 20.
    proxy = await make_proxy(context_window=2048, min_retain_rounds=2, summary_timeout=0.3)
    session = Session(proxy, fake, f"broken-{mode}")
    try:
        while not any(f.kind == "summary" for f in await session.facts()):  # masking alone writes no summary
            assert session.step < 30, "no summary in 30 steps"
            await session.send()
        before = await session.facts()
        checkpoint = [f for f in before if f.kind == "checkpoint"][-1].extra["checkpoint"]
        asked = len(fake.summary_requests)
        fake.summary_mode = mode
        first_request = len(fake.requests)
        while len(fake.summary_requests) == asked:  # a compaction leaves room for several steps
            assert session.step < 60, "no compaction attempt in 30 steps"
            await session.send()
        for _ in range(3):
            await session.send()
        metrics = await (await proxy.get("/metrics")).text()
    finally:
        fake.release.set()

    assert len(fake.summary_requests) > asked, "the broken summariser was asked (and failed)"
    # The window is small enough that a view past the threshold is past the hard limit: the model-free tier stands
    # in for the summary the model could not write (proxy.context.summary.fallback).
    assert compactions(metrics, "fallback") >= 1
    facts = await session.facts()
    assert facts[:len(before)] == before
    added = facts[len(before):]
    for fact in added:  # masking and the model-free tier need no model and keep the model's summary as it was
        if fact.kind == "checkpoint":
            assert fact.extra["checkpoint"]["summary"] == checkpoint["summary"]
        elif fact.kind == "summary":
            kept = (fact.message or {})["content"]
            assert checkpoint["summary"] in kept, "the model-free tier keeps the previous summary"
        else:
            assert fact.kind == "message"
    assert same_conversation(replay(facts), session.messages[:-1])
    for body in fake.requests[first_request:]:
        assert checkpoint["summary"] in summary_in_view(body), "every request kept the active checkpoint"


@pytest.mark.parametrize("mode", [*OTHER_SHAPES])
async def test_a_summary_in_another_shape_is_a_summary(make_proxy, fake: BrokenSummariser, mode: str) -> None:
    # No output masked: with honest usage masking keeps 4,096 under the threshold until the history is too long to
    # fold in one call, and this is about the first answer being accepted.
    proxy = await make_proxy(context_window=4096, min_retain_rounds=2, **MASKING_OFF)
    fake.summary_mode = mode
    session = Session(proxy, fake, f"shape-{mode}")
    while not any(f.kind == "summary" for f in await session.facts()):
        assert session.step < 30, "no summary in 30 steps"
        await session.send()
    await session.send()
    checkpoint = [f for f in await session.facts() if f.kind == "checkpoint"][-1].extra["checkpoint"]
    assert checkpoint["summary"] == OTHER_SHAPES[mode]
    assert len(fake.summary_requests) == 1, "accepted at the first answer"
    assert OTHER_SHAPES[mode] in summary_in_view(fake.requests[-1])
