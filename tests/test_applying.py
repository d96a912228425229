"""Which checkpoint a view uses (``proxy.context.view.applying``): the request's own lineage's, never another
credential's on the strength of a link alone, on each store."""

from __future__ import annotations

import random
from typing import Any

import orjson

from proxy.context.view.applying import LiveCheckpoint, Requester, choose
from proxy.keys import engine_key, store_key
from proxy.sessions import tenant_of
from proxy.settings import Secret
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import MASKING_OFF, read_log
from tests.test_admin import TOKEN, chat
from tests.test_compaction_e2e import prose
from tests.test_undo import ADMIN_TENANT, compact, rounds

OTHER_KEY = "sk-tenant-b"
#: The other tenant's tools: their descriptions name a fact only its summary model can have seen.
B_TOOLS = [{"type": "function", "function": {
    "name": f"b_tool_{n}", "description": f"FACT-BTOOLS{n} " + prose(random.Random(n), 700),
    "parameters": {"type": "object", "properties": {}}}} for n in range(3)]


async def owner_steps(proxy: Any, fake: FakeUpstream, session: str) -> list[dict[str, Any]]:
    """The owner's session: four rounds, a compaction, four more rounds (what it holds when the other tenant comes)."""
    messages = await rounds(proxy, fake, session, [{"role": "system", "content": "You are helpful."}], 4, seed=11)
    await compact(proxy, ADMIN_TENANT, session)
    return await rounds(proxy, fake, session, messages, 4, seed=12)


async def next_owner_request(proxy: Any, fake: FakeUpstream, session: str,
                             messages: list[dict[str, Any]]) -> dict[str, Any]:
    fake.script.append(Reply(content="Next."))
    await chat(proxy, [*messages, {"role": "user", "content": "And now the tests."}], session)
    body: dict[str, Any] = fake.requests[-1]
    return body


async def test_another_tenants_compaction_of_a_shared_start_never_becomes_the_owners_view(make_proxy,
                                                                                        fake: FakeUpstream) -> None:
    proxy = await make_proxy(admin_token=Secret(TOKEN), min_retain_rounds=1, context_window=6_000, **MASKING_OFF)
    fake.echo_tools = True
    alone = await next_owner_request(proxy, fake, "solo", await owner_steps(proxy, fake, "solo"))

    messages = await owner_steps(proxy, fake, "shared")
    # The other credential proves the whole conversation (linked to the owner's session) and sends its own tools,
    # which put its view over the trigger: its compaction summarises the shared start with its tools in the call.
    fake.script.append(Reply(content="Done on B's side."))
    body = {"model": "gpt-4o", "tools": B_TOOLS,
            "messages": [*messages, {"role": "user", "content": "B asks something else."}]}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={"Authorization": f"Bearer {OTHER_KEY}", "X-Session-Id": "shared"})
    assert resp.status == 200, await resp.text()
    assert resp.headers["X-Ctxproxy-Compacted"] == "proactive", resp.headers["X-Ctxproxy-View-Tokens"]
    key = SessionKey(ADMIN_TENANT, "shared")
    await proxy.app[engine_key].background.join(key)
    made = [f for f in await read_log(proxy.app[store_key], key) if f.kind == "checkpoint"]
    assert [f.extra.get("tenant") for f in made] == [None, tenant_of(OTHER_KEY)], "the maker is on the entry"
    assert "FACT-BTOOLS0" in made[-1].extra["checkpoint"]["summary"], "the other tenant's summary saw its tools"
    assert made[-1].extra["made_from"] == made[0].seq

    mine = await next_owner_request(proxy, fake, "shared", messages)
    assert orjson.dumps(mine["messages"]) == orjson.dumps(alone["messages"]), "the owner's view is its own"
    assert "FACT-BTOOLS" not in orjson.dumps(mine).decode()


async def test_a_linked_request_gets_the_owners_checkpoint_its_history_covers(make_proxy, fake: FakeUpstream) -> None:
    """A refreshed credential (a new tenant proving the session) keeps the owner's compaction as its view."""
    proxy = await make_proxy(admin_token=Secret(TOKEN), min_retain_rounds=1, **MASKING_OFF)
    messages = await owner_steps(proxy, fake, "refresh")
    owner = await next_owner_request(proxy, fake, "refresh", messages)
    messages = [*messages, {"role": "user", "content": "And now the tests."}, {"role": "assistant",
                                                                              "content": "Next."}]
    fake.script.append(Reply(content="After the refresh."))
    await chat(proxy, [*messages, {"role": "user", "content": "go on"}], "refresh", key="sk-refreshed")
    refreshed = fake.requests[-1]["messages"]
    assert refreshed[:len(owner["messages"])] == owner["messages"], "the same checkpoint, the same view"


def live(seq: int, covers: int, maker: str | None = None, made_from: int | None = None) -> LiveCheckpoint:
    return LiveCheckpoint(seq, {"covers": covers}, covers, maker, made_from, ceiling=1_000)


def test_the_checkpoint_covering_most_of_the_request_wins_and_one_made_from_another_supersedes_it() -> None:
    every = lambda entry: True  # noqa: E731 - the request holds every covered prefix here
    entries = [live(1, 10), live(2, 30, made_from=1), live(3, 20)]  # 3: another lineage's, of the shared start
    assert choose(entries, every, Requester()) == 1, "the own lineage's (covers most), not the newest"
    entries = [live(1, 30), live(2, 20, made_from=1)]  # a later one covering less, made from the first
    assert choose(entries, every, Requester()) == 1, "made from it: it replaced it"
    assert choose(entries, lambda entry: entry.seq == 1, Requester()) == 0


def test_another_credentials_checkpoint_serves_only_within_the_requests_proof() -> None:
    every = lambda entry: True  # noqa: E731
    entries = [live(1, 10), live(2, 30, maker="b", made_from=1)]
    assert choose(entries, every, Requester("a")) == 0, "the owner never gets the linked tenant's"
    assert choose(entries, every, Requester("b")) == 1
    assert choose(entries, every, Requester("c", proved=29)) == 0, "its proof covers the owner's, not b's"
    assert choose(entries, every, Requester("c", proved=9)) is None
    assert choose(entries, every, Requester("c", proved=30)) == 1
    assert choose(entries, every, Requester()) == 1, "the default: any, as in a session one credential uses"
