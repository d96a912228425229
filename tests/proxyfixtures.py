"""Fixtures that run the proxy against the fake upstream: loaded from conftest via ``pytest_plugins``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import redis.asyncio
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.dialects.chat import message_hash
from proxy.settings import Settings
from proxy.store.base import FactLog, SessionKey, StoredFact
from tests.fakeupstream import FakeUpstream
from tests.redisproc import RedisProcess, free_port

#: Settings that mask no tool output (tier 1 off): more outputs kept than any test's run makes, and no share of the
#: window capping them. For a test about summaries, which masking alone would otherwise make unnecessary.
MASKING_OFF: dict[str, Any] = {"keep_tool_outputs": 1_000, "keep_tool_output_share": 1.0}


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
async def upstream(aiohttp_server: Any, fake: FakeUpstream) -> TestServer:
    server: TestServer = await aiohttp_server(fake.app())
    return server


@pytest.fixture
async def redis_flush(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/facts.db"
    url: str = request.getfixturevalue("redis_url")
    request.getfixturevalue("redis_flush")
    return url


@pytest.fixture(params=["sqlite", "redis"])
def durable_store_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A store of its own that outlives proxy processes: a SQLite file, or a private Redis with AOF on."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/store/facts.db"
        return
    with RedisProcess(free_port(), tmp_path / "redis", ["--appendonly", "yes"]) as server:
        yield server.url


ProxyFactory = Callable[..., Any]


@pytest.fixture
def make_proxy(aiohttp_client: Any, upstream: TestServer, store_url: str) -> ProxyFactory:
    async def make(**overrides: Any) -> TestClient[Any, Any]:
        # Background compaction is off unless a test turns it on (tests/test_background.py): most tests read the
        # log right after a request, when a background summary could still be on its way to it.
        settings = Settings(upstream=str(upstream.make_url("/v1")), store=store_url,
                            **{"precompact_threshold": 1.0, **overrides})
        client: TestClient[Any, Any] = await aiohttp_client(create_app(settings))
        return client

    return make


@pytest.fixture
async def proxy(make_proxy: ProxyFactory) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = await make_proxy()
    return client


async def read_log(store: FactLog, key: SessionKey) -> list[StoredFact]:
    facts: list[StoredFact] = []
    while True:
        page = await store.read(key, after=facts[-1].seq if facts else -1, limit=500)
        facts.extend(page)
        if len(page) < 500:
            return facts


def replay(facts: list[StoredFact]) -> list[dict[str, Any]]:
    """The conversation at a log's head, following each message's predecessor back (the contract's tree).

    A message continues the head; a rewind moves the head to the message entry
    its ``from_seq`` names (``None``: the start), or, in a log written before
    rewinds named one, to the message at ``index - 1`` of the current lineage.
    Every message's and rewind's ``index`` must be its position on its lineage.
    """
    parent: dict[int, int | None] = {}
    depth: dict[int | None, int] = {None: 0}
    message: dict[int, dict[str, Any]] = {}

    def path(head: int | None) -> list[int]:
        seqs: list[int] = []
        while head is not None:
            seqs.append(head)
            head = parent[head]
        return seqs[::-1]

    head: int | None = None
    for fact in facts:
        if fact.kind == "rewind":
            assert fact.index is not None
            if "from_seq" in fact.extra:
                head = fact.extra["from_seq"]
                assert head is None or head in message, f"rewind {fact.seq} names no message entry"
            else:
                head = path(head)[fact.index - 1] if fact.index else None
            assert fact.index == depth[head], (fact.seq, fact.index, depth[head])
        elif fact.kind == "message":
            assert fact.index == depth[head], (fact.seq, fact.index, depth[head])
            assert fact.message is not None
            parent[fact.seq], depth[fact.seq], message[fact.seq] = head, depth[head] + 1, dict(fact.message)
            head = fact.seq
    return [message[seq] for seq in path(head)]


async def sync_chat(history: Any, key: SessionKey, messages: list[dict[str, Any]], **options: Any) -> Any:
    """``HistoryManager.sync`` for a Chat Completions conversation, hashing it as the chat front door does."""
    return await history.sync(key, messages, [message_hash(m) for m in messages], **options)


def same_conversation(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return [message_hash(m) for m in a] == [message_hash(m) for m in b]


def assistant_from_sse(raw: bytes) -> dict[str, Any]:
    """The assistant message a client assembles from a streamed answer."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    calls: dict[int, dict[str, Any]] = {}
    for block in raw.split(b"\n\n"):
        if not block.startswith(b"data: {"):
            continue
        for choice in orjson.loads(block[6:])["choices"]:
            delta = choice["delta"]
            if delta.get("content"):
                message["content"] = (message["content"] or "") + delta["content"]
            for tc in delta.get("tool_calls") or []:
                call = calls.setdefault(tc["index"], {"id": tc.get("id"), "type": "function",
                                                      "function": {"name": tc["function"].get("name"),
                                                                   "arguments": ""}})
                call["function"]["arguments"] += tc["function"].get("arguments") or ""
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message
