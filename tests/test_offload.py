"""Issue 23: one request cannot hurt the others.

A large request's CPU-heavy work runs off the event loop (another session's
small request is answered while it is being counted), its own tokenizing is
bounded, a 300,000-message sync appends in batches, and the per-session caches
stay within their byte budgets, as ``/metrics`` reports them.
"""

from __future__ import annotations

import asyncio
import io
import re
import threading
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from proxy import offload
from proxy.context.log.history import HistoryManager
from proxy.context.view.tokens import BUDGET_CHARS, SAMPLE_CHARS, TokenCounter, bundled_encoding, chars_tokens
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.keys import engine_key
from proxy.render import PAGE, Lineage
from proxy.store.base import FactLog, SessionKey, StoredFact
from proxy.ui import timeline as timeline_module
from proxy.ui.timeline import Timeline, TimelineCache, extend_off_loop
from tests.fakeupstream import FakeUpstream
from tests.proxyfixtures import ProxyFactory, replay

#: Marks the large request's text: only its first tokenization is held at the gate.
MARK = "ctxproxy-large-request"
#: How long the gate waits for the test to open it: past it the request goes on (and the test fails).
GATE_TIMEOUT = 30.0
LARGEST_BODY = 32 * 1024 * 1024  # the default --max-body-bytes
WORDS = "the parser reads a config file then the handler retries the request when the socket closes early "


class GatedEncoding:
    """The bundled encoding, holding the first text that carries ``MARK`` until the test opens the gate."""

    def __init__(self) -> None:
        self.real = bundled_encoding()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.opened: bool | None = None

    def encode_ordinary(self, text: str) -> list[int]:
        if MARK in text and not self.entered.is_set():
            self.entered.set()
            self.opened = self.release.wait(GATE_TIMEOUT)
        result: list[int] = self.real.encode_ordinary(text)
        return result


def largest_body() -> bytes:
    """One user message as long as the largest accepted body allows."""
    envelope = len(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": ""}]}))
    text = MARK + " " + WORDS * (LARGEST_BODY // len(WORDS) + 1)
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text[:LARGEST_BODY - envelope]}]})
    assert len(body) == LARGEST_BODY
    return body


def long_history(n: int = 300_000, tag: str = MARK) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag} {i}"} for i in range(n)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("shape", ["largest body", pytest.param("300,000 messages", marks=pytest.mark.slow)])
async def test_another_sessions_small_request_is_answered_while_a_large_one_is_counted(
        make_proxy: ProxyFactory, fake: FakeUpstream, shape: str) -> None:
    proxy = await make_proxy(context_window=100_000_000)
    gate = GatedEncoding()
    proxy.app[engine_key].counter = TokenCounter(gate)
    body = largest_body() if shape == "largest body" else orjson.dumps({"model": "m", "messages": long_history()})
    headers = {"Content-Type": "application/json"}
    big = asyncio.create_task(proxy.post("/v1/chat/completions", data=io.BytesIO(body), headers={**headers,
                                                                                      "X-Session-Id": "big"}))
    # Until the gate opens, the large request's counting is held: on the event loop that would hold every request.
    assert await asyncio.get_running_loop().run_in_executor(None, gate.entered.wait, GATE_TIMEOUT)
    small = await proxy.post("/v1/chat/completions", headers={**headers, "X-Session-Id": "small"},
                             data=orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
    assert small.status == 200
    await small.read()
    big_done_first = big.done()
    gate.release.set()
    resp = await big
    assert resp.status == 200
    await resp.read()
    assert gate.opened is True  # the small request completed while the large one waited at the gate
    assert not big_done_first


class CountingEncoding:
    """The bundled encoding, noting how many characters it was given each time."""

    def __init__(self) -> None:
        self.real = bundled_encoding()
        self.given: list[int] = []

    def encode_ordinary(self, text: str) -> list[int]:
        self.given.append(len(text))
        result: list[int] = self.real.encode_ordinary(text)
        return result


def test_a_long_text_is_tokenized_in_samples_and_scaled() -> None:
    encoding = CountingEncoding()
    text = WORDS * (4 * SAMPLE_CHARS // len(WORDS))
    counted = TokenCounter(encoding).text_tokens(text)
    exact = len(encoding.real.encode_ordinary(text))
    assert sum(encoding.given) <= SAMPLE_CHARS
    assert abs(counted - exact) <= exact * 0.01


def test_a_view_tokenizes_up_to_its_budget_and_estimates_the_rest() -> None:
    encoding = CountingEncoding()
    chunk = SAMPLE_CHARS // 2
    messages = [{"role": "user", "content": f"{i} " + "x" * chunk} for i in range(2 * BUDGET_CHARS // chunk)]
    counter = TokenCounter(encoding)
    counter.count_many(CHAT, messages, [message_hash(m) for m in messages])
    assert BUDGET_CHARS <= sum(encoding.given) < BUDGET_CHARS + SAMPLE_CHARS
    last = messages[-1]
    assert counter.message_tokens(CHAT, last) == chars_tokens(len(str(last["content"]))) + 4


async def test_a_long_sync_appends_in_batches_each_its_own_transaction(store: FactLog) -> None:
    batches: list[int] = []
    history = HistoryManager(store, clock=lambda: 0.0, on_append=lambda facts: batches.append(len(facts)))
    key = SessionKey("t", "long")
    messages = long_history(2 * offload.APPEND_CHUNK + 10, tag="m")
    state = await history.sync(key, messages, [message_hash(m) for m in messages])
    assert batches == [offload.APPEND_CHUNK, offload.APPEND_CHUNK, 10]
    assert state.hashes == [message_hash(m) for m in messages]
    assert replay(await store.read(key)) == messages


def test_the_inspectors_lineage_grows_its_messages_in_place() -> None:
    """The head's messages are extended, not rebuilt, as the lineage grows: a first look is linear."""
    lineage = Lineage()
    messages = lineage.messages
    for seq in range(3):
        message = {"role": "user", "content": str(seq)}
        lineage.apply(StoredFact(id=str(seq), seq=seq, kind="message", index=seq, source="client", message=message,
                                 ts=0.0, hash=message_hash(message), extra={}))
        assert lineage.messages is messages
    assert messages == [{"role": "user", "content": str(seq)} for seq in range(3)]


def cache_bytes(metrics: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(r'^ctxproxy_cache_bytes\{cache="(\w+)"\} (\S+)$', metrics, re.M)}


@pytest.mark.timeout(600)
async def test_cached_states_stay_within_their_byte_budget_after_many_long_sessions(
        make_proxy: ProxyFactory, fake: FakeUpstream) -> None:
    budget = 12 * 1024 * 1024
    proxy = await make_proxy(context_window=100_000_000, state_cache_bytes=budget)
    headers = {"Content-Type": "application/json"}
    highest = 0.0
    for k in range(8):  # each about 5 MB of state: 40 MB without the bound
        body = orjson.dumps({"model": "m", "messages": long_history(20_000, tag=f"s{k}")})
        resp = await proxy.post("/v1/chat/completions", data=io.BytesIO(body),
                                headers={**headers, "X-Session-Id": f"s{k}"})
        assert resp.status == 200
        await resp.read()
        fake.requests.clear()
        sizes = cache_bytes(await (await proxy.get("/metrics")).text())
        assert sizes["states"] > 0
        highest = max(highest, sizes["states"])
    assert highest <= budget
    assert set(sizes) == {"states", "recent", "pending", "tokens", "timelines"}


async def test_a_fold_whose_viewer_left_stops_before_its_lock_is_released() -> None:
    """The fold's thread is stopped at the next entry and waited for: nothing writes the timeline afterwards."""
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    class Held(Timeline):
        applied = 0
        stop: threading.Event | None = None

        def extend(self, facts: Sequence[StoredFact], stop: threading.Event | None = None) -> None:
            self.stop = stop
            try:
                super().extend(facts, stop)
            finally:
                finished.set()

        def apply(self, fact: StoredFact) -> None:
            if not entered.is_set():
                entered.set()
                release.wait(GATE_TIMEOUT)
            super().apply(fact)
            self.applied += 1

    facts = [StoredFact(id=str(seq), seq=seq, kind="message", index=seq, source="client",
                        message={"role": "user", "content": str(seq)}, ts=0.0,
                        hash=message_hash({"role": "user", "content": str(seq)}), extra={}) for seq in range(1000)]
    timeline = Held()
    fold = asyncio.create_task(extend_off_loop(timeline, facts))
    assert await asyncio.get_running_loop().run_in_executor(None, entered.wait, GATE_TIMEOUT)
    fold.cancel()  # the viewer left while the thread folds the first entry
    stop = timeline.stop
    assert stop is not None and await asyncio.get_running_loop().run_in_executor(None, stop.wait, GATE_TIMEOUT)
    release.set()  # only once the cancellation asked the thread to stop: else it may fold on meanwhile
    with pytest.raises(asyncio.CancelledError):
        await fold
    assert finished.is_set()  # the thread was done before the caller went on (and so before any lock it held)
    assert timeline.applied == 1  # it stopped after the entry it was folding
    assert timeline.next_seq == 1


async def test_a_long_log_is_folded_a_bounded_stretch_per_look(sqlite_store: FactLog,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline_module, "FOLD_SECONDS", 0.0)  # each look stops after its first page of entries
    history = HistoryManager(sqlite_store, clock=lambda: 0.0)
    key = SessionKey("t", "long")
    messages = long_history(2 * PAGE + 200, tag="m")
    await history.sync(key, messages, [message_hash(m) for m in messages])
    cache = TimelineCache()
    looks = []
    for _ in range(3):
        async with cache.fold(sqlite_store, key) as timeline:
            looks.append((timeline.next_seq, timeline.complete))
    assert looks == [(PAGE, False), (2 * PAGE, False), (2 * PAGE + 200, True)]


async def test_the_inspectors_folds_stay_within_their_byte_budget(sqlite_store: FactLog) -> None:
    history = HistoryManager(sqlite_store, clock=lambda: 0.0)
    cache = TimelineCache(max_bytes=3 * 1024 * 1024)
    for k in range(5):  # each fold about 1.3 MB: two fit
        key = SessionKey("t", f"s{k}")
        messages = long_history(2_000, tag=f"s{k} " + "x" * 40)
        await history.sync(key, messages, [message_hash(m) for m in messages])
        async with cache.fold(sqlite_store, key) as timeline:
            assert timeline.bytes > 1024 * 1024
        assert cache.bytes <= 3 * 1024 * 1024
