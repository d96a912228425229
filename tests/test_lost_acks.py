"""A lost acknowledgement: Redis ran the append, the reply never reached the proxy.

A TCP relay between the ``RedisFactLog`` and a real redis-server forwards
every byte, except that, once armed, it lets the next EVALSHA (the append
script) through and then drops the connection instead of relaying the reply.
redis-py resends the command after the connection error, which finds the log
moved and conflicts; the writer catches up and plans again. Whatever it plans
again must not be logged twice: the proxy's facts are skipped by their key,
a client's messages are recognised by their hash chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from proxy.context.log.history import HistoryManager
from proxy.store.base import NewFact, SessionKey
from proxy.store.redis import RedisFactLog
from tests.proxyfixtures import read_log, replay, same_conversation, sync_chat

KEY = SessionKey("t", "lost-ack")
BEGIN = [{"role": "user", "content": "begin"}, {"role": "assistant", "content": "first"}]
PAYLOAD = {"prefix_hash": "p", "retain_start_idx": 1, "summary": "s"}


class ReplyDropper:
    """A TCP relay to ``port`` that, when armed, drops the connection instead of relaying the next EVALSHA's reply."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.armed = False
        self.dropped = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self.target)
        drop_reply = asyncio.Event()

        async def requests() -> None:
            while data := await client_reader.read(65536):
                if self.armed and b"EVALSHA" in data:
                    self.armed = False
                    drop_reply.set()  # before the command goes on: its reply cannot arrive first
                server_writer.write(data)
                await server_writer.drain()

        async def replies() -> None:
            while data := await server_reader.read(65536):
                if drop_reply.is_set():
                    self.dropped += 1
                    return  # the server ran the command; the client never hears of it
                client_writer.write(data)
                await client_writer.drain()

        tasks = [asyncio.ensure_future(requests()), asyncio.ensure_future(replies())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in (client_writer, server_writer):
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@pytest.fixture
async def dropper(redis_store: RedisFactLog, redis_url: str) -> AsyncIterator[tuple[ReplyDropper, HistoryManager]]:
    """A relay in front of the test redis, and a HistoryManager whose store talks through it."""
    target = urlsplit(redis_url)
    relay = ReplyDropper(target.hostname or "127.0.0.1", target.port or 6379)
    port = await relay.start()
    auth = target.netloc.rpartition("@")[0]
    store = RedisFactLog.from_url(urlunsplit(target._replace(netloc=f"{auth}@" * bool(auth) + f"127.0.0.1:{port}")))
    history = HistoryManager(store, clock=time.time)
    try:
        await sync_chat(history, KEY, BEGIN, upstream_from=1)  # loads the script: the armed EVALSHA runs it
        yield relay, history
    finally:
        await history.aclose()
        await store.aclose()
        await relay.aclose()


async def test_a_summary_and_checkpoint_whose_reply_was_lost_are_logged_once(
        dropper: tuple[ReplyDropper, HistoryManager], redis_store: RedisFactLog) -> None:
    relay, history = dropper
    summary = NewFact(kind="summary", index=1, source="proxy", message={"role": "user", "content": "summary"})
    checkpoint = NewFact(kind="checkpoint", index=1, source="proxy", extra={"checkpoint": PAYLOAD})
    relay.armed = True

    state = await history.append_proxy_facts(KEY, [summary, checkpoint])

    assert relay.dropped == 1
    facts = await read_log(redis_store, KEY)
    assert [(f.seq, f.kind) for f in facts] == [(0, "message"), (1, "message"), (2, "summary"), (3, "checkpoint")]
    assert state.next_seq == 4 and state.checkpoints == [PAYLOAD]
    assert facts[2].key is not None and facts[3].key is not None


async def test_the_seq_of_a_proxy_fact_whose_reply_was_lost_is_the_one_logged(
        dropper: tuple[ReplyDropper, HistoryManager], redis_store: RedisFactLog) -> None:
    """A client-compaction answer is signed with its seq: it must name the entry that landed."""
    relay, history = dropper
    relay.armed = True
    seq = await history.append_proxy_fact(KEY, NewFact(kind="summary", index=2, source="proxy",
                                                       message={"role": "user", "content": "answer"}))
    assert relay.dropped == 1
    facts = await read_log(redis_store, KEY)
    assert [f.kind for f in facts] == ["message", "message", "summary"] and seq == 2


async def test_a_clients_messages_whose_reply_was_lost_are_logged_once(
        dropper: tuple[ReplyDropper, HistoryManager], redis_store: RedisFactLog) -> None:
    """No key needed: the retry catches up with its own messages, recognises them, and plans nothing."""
    relay, history = dropper
    conversation = [*BEGIN, {"role": "user", "content": "more"}, {"role": "assistant", "content": "second"}]
    relay.armed = True
    await sync_chat(history, KEY, conversation, upstream_from=3)
    assert relay.dropped == 1
    facts = await read_log(redis_store, KEY)
    assert len(facts) == 4 and same_conversation(replay(facts), conversation)


async def test_the_same_summary_planned_at_another_point_of_the_log_is_another_fact(
        dropper: tuple[ReplyDropper, HistoryManager], redis_store: RedisFactLog) -> None:
    _, history = dropper
    summary = NewFact(kind="summary", index=1, source="proxy", message={"role": "user", "content": "summary"})
    await history.append_proxy_facts(KEY, [summary])
    await sync_chat(history, KEY, [*BEGIN, {"role": "user", "content": "more"}])
    await history.append_proxy_facts(KEY, [summary])
    assert [f.kind for f in await read_log(redis_store, KEY)] == ["message", "message", "summary", "message",
                                                                  "summary"]
