"""What a link to another tenant's session serves: only conversations that extend what proved it (issue 35).

Tenant B proves the short stock start of tenant A's session (a long stock prompt, A's first reply), or replays
a Codex ``compaction`` item A was handed; A works on, and its later summary holds a fact B never held. B's later
requests (an empty Gemini compression call, a prefix-only one of the proved start, its own conversation on from
the start) get nothing of it, on both stores; the OAuth refresh these links exist for is tests/test_continuity.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.constants import HEADER_SESSION
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import FactLog, SessionKey
from tests.fakegemini import FakeGemini
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script
from tests.proxyfixtures import read_log
from tests.scripted import Codex
from tests.test_gemini import SYSTEM, TOOLS
from tests.test_gemini_compaction import ASK, compression_call

RUN = "run-shared"
OWNER, OTHER = "key-of-the-owner-4f1c", "key-of-another-9a0b"
LATER = "FACT-ownerlater"
MODEL = "gemini-test"
GENERATE = f"/v1beta/models/{MODEL}:generateContent"
#: A stock opening anyone may know: long enough (with the stock first reply) to prove a session that holds only it.
STOCK = "You are a coding agent. Follow the house rules. " * 40


class Rig(NamedTuple):
    client: TestClient[Any, Any]
    responses: FakeResponses
    gemini: FakeGemini


async def proxy_on(aiohttp_server: Any, aiohttp_client: Any, store_url: str, **overrides: Any) -> Rig:
    """The proxy over a fake Gemini and a fake Responses API, small enough a window to compact."""
    gemini = FakeGemini(Script(steps=40))
    responses = FakeResponses(Script(steps=40))
    first: TestServer = await aiohttp_server(gemini.app())
    second: TestServer = await aiohttp_server(responses.app())
    app = create_app(Settings(gemini_upstream=str(first.make_url("")).rstrip("/"),
                              upstream=str(second.make_url("/v1")), store=store_url, precompact_threshold=1.0,
                              context_window=4_000, min_retain_rounds=1, keep_tool_output_share=1.0, **overrides))
    client: TestClient[Any, Any] = await aiohttp_client(app)
    return Rig(client, responses, gemini)


@dataclass
class Gemini:
    """A Gemini client under ``key``: ``contents`` grows by each reply and its calls' outputs."""

    client: TestClient[Any, Any]
    key: str
    contents: list[dict[str, Any]] = field(default_factory=list)

    async def turn(self) -> dict[str, Any]:
        resp = await self.client.post(GENERATE, headers={"x-goog-api-key": self.key, HEADER_SESSION: RUN},
                                      json={"contents": self.contents, "systemInstruction": SYSTEM, "tools": TOOLS})
        assert resp.status == 200, await resp.text()
        content: dict[str, Any] = (await resp.json())["candidates"][0]["content"]
        self.contents.append(content)
        for part in content["parts"]:
            if "functionCall" in part:
                call = part["functionCall"]
                self.contents.append({"role": "user", "parts": [{"functionResponse": {
                    "id": call.get("id"), "name": call["name"], "response": {"output": "done " + "ok " * 150}}}]})
        return content


async def compress(client: TestClient[Any, Any], key: str, history: list[dict[str, Any]]) -> str:
    """Gemini CLI's compression call under ``key``: what the answer (the proxy's, or the upstream's) says."""
    resp = await client.post(GENERATE, headers={"x-goog-api-key": key, HEADER_SESSION: RUN},
                             json=compression_call(history, {"role": "user", "parts": [{"text": ASK}]}))
    assert resp.status == 200, await resp.text()
    return orjson.dumps(await resp.json()).decode()


async def summaries(store: FactLog, tenant: str) -> str:
    facts = await read_log(store, SessionKey(tenant, RUN))
    return " ".join(str(f.extra["checkpoint"].get("summary")) for f in facts if f.kind == "checkpoint")


async def until_summarised(step: Callable[[], Awaitable[Any]], store: FactLog) -> None:
    """The owner's steps until a checkpoint of its session holds its later fact."""
    for _ in range(30):
        await step()
        if LATER in await summaries(store, tenant_of(OWNER)):
            return
    raise AssertionError("the owner's later work was never summarised")


async def test_a_link_proved_by_a_stock_start_serves_nothing_of_the_owners_later_work(
        aiohttp_server, aiohttp_client, store_url: str) -> None:
    client, _, fake = await proxy_on(aiohttp_server, aiohttp_client, store_url)
    store = client.app[store_key]
    owner = Gemini(client, OWNER, [{"role": "user", "parts": [{"text": STOCK}]}])
    await owner.turn()
    start = owner.contents[:2]  # the stock prompt and the stock first reply: all the session holds yet

    other = Gemini(client, OTHER, [*start, {"role": "user", "parts": [{"text": "Now list the files."}]}])
    await other.turn()
    link = await store.link_of(SessionKey(tenant_of(OTHER), RUN))
    assert link is not None and link.tenant == tenant_of(OWNER), "the start proved the session, as it stood"

    owner.contents.append({"role": "user", "parts": [{"text": f"Remember {LATER}: the deploy key rotates."}]})
    await until_summarised(owner.turn, store)

    assert LATER not in await compress(client, OTHER, []), "an empty history proves nothing"
    assert LATER not in await compress(client, OTHER, start), "the proved start is not the owner's later work"
    other.contents.append({"role": "user", "parts": [{"text": "What did we settle?"}]})
    sent = len(fake.turns())
    await other.turn()
    assert all(LATER not in orjson.dumps(turn.body).decode() for turn in fake.turns()[sent:]), "nor in its view"
    assert LATER not in await summaries(store, tenant_of(OTHER))


async def test_a_replayed_compaction_item_proves_what_it_covers_and_no_more(
        aiohttp_server, aiohttp_client, store_url: str) -> None:
    client, fake, _ = await proxy_on(aiohttp_server, aiohttp_client, store_url)
    store = client.app[store_key]
    owner = Codex(client, session=RUN, headers={"Authorization": f"Bearer {OWNER}"})
    for _ in range(30):
        await owner.step()
        if await summaries(store, tenant_of(OWNER)):
            break
    resp = await client.post("/v1/responses/compact", headers={"Authorization": f"Bearer {OWNER}", "session_id": RUN},
                             json={"model": "gpt-5.5", "input": owner.items})
    [item] = (await resp.json())["output"]
    assert item["encrypted_content"].startswith("ctxproxy."), "the proxy answered, with a reference"
    go_on = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]}
    replayer = Codex(client, session=RUN, headers={"Authorization": f"Bearer {OTHER}"}, items=[item, go_on])
    await replayer.step()  # the item is a bearer token for its own summary: it expands, for this request
    assert await store.link_of(SessionKey(tenant_of(OTHER), RUN)) is None, "no link for good"

    owner.items = [item, go_on, {"type": "message", "role": "user",
                                 "content": [{"type": "input_text", "text": f"Remember {LATER}."}]}]
    await until_summarised(owner.step, store)

    assert LATER not in await compress(client, OTHER, []), "without the item, the key holds nothing of the session"
    sent = len(fake.turns())
    replayer.items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And?"}]})
    await replayer.step()
    assert all(LATER not in orjson.dumps(turn.body).decode() for turn in fake.turns()[sent:])
