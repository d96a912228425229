"""What the summary call's answer may do to the proxy: nothing (issue 35).

An answer that calls a tool is not a summary, at any door: a one-line preamble
beside the call ("Let me look at the files first.") would otherwise stand for
the whole compacted range. Each door's fake summary model answers that way in
its own API's shape (``PREAMBLE_CALL``), streamed when the client's request is
(the Gemini door's summary call is always ``:generateContent``): the
run goes on, compacted by masking or the model-free tier, each summary asked
once (a call is not a cut answer to ask again), and the preamble is nowhere in
the log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.constants import HEADER_SESSION
from proxy.context.checkpoint import Checkpoint
from proxy.context.summaryprompt import REMINDER
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import FactLog, SessionKey
from tests import test_gemini
from tests.fakegemini import FakeGemini
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script, final_text
from tests.fakeupstream import PREAMBLE, PREAMBLE_CALL, FakeUpstream
from tests.proxyfixtures import read_log
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
