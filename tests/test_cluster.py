"""Redis Cluster: the store on a real 3-primary cluster, then three proxy replicas sharing it.

The cluster is built from ``redis-server`` binaries by a session fixture
(``RedisClusterProcess``), flushed before each test. The FactLog contract suite
of ``tests/test_store.py`` runs here again with ``store`` overridden to a
cluster-backed ``RedisFactLog``; the tests after it check what only a cluster
can get wrong: slot placement, script routing, listing across primaries, and
reconnecting after a node restart.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from proxy.constants import lock_key, log_key, meta_key
from proxy.context.compactor import Checkpoint
from proxy.dialects.chat import message_hash
from proxy.errors import ConflictError, StoreUnavailable
from proxy.sessions import tenant_of
from proxy.store import SessionKey
from proxy.store.redis import RedisFactLog
from tests import test_store as contract
from tests.fakeupstream import FakeUpstream
from tests.proxyfixtures import assistant_from_sse, read_log, replay, same_conversation
from tests.redisproc import REDIS_CLI, RedisClusterProcess, free_ports
from tests.test_links import first_look_contract

TS = contract.TS
msg = contract.msg


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcess]:
    with RedisClusterProcess(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture
async def cluster_store(redis_cluster: RedisClusterProcess) -> AsyncIterator[RedisFactLog]:
    store = RedisFactLog.from_url(redis_cluster.url)
    try:
        await store.client.flushdb()  # redis-py sends FLUSHDB to every primary
        yield store
    finally:
        await store.aclose()


@pytest.fixture
def store(cluster_store: RedisFactLog) -> RedisFactLog:
    """Overrides conftest's parametrized ``store``: the contract tests below run on the cluster."""
    return cluster_store


# ---- the FactLog contract (tests/test_store.py), on the cluster ------------------------------

test_roundtrip_exact = contract.test_roundtrip_exact
test_seq_is_gapless_across_appends = contract.test_seq_is_gapless_across_appends
test_read_after_and_limit = contract.test_read_after_and_limit
test_long_log_reads_whole = contract.test_long_log_reads_whole
test_conflict_reports_actual_seq_and_writes_nothing = contract.test_conflict_reports_actual_seq_and_writes_nothing
test_empty_append_checks_but_writes_nothing = contract.test_empty_append_checks_but_writes_nothing
test_concurrent_appends_make_one_gapless_log = contract.test_concurrent_appends_make_one_gapless_log
test_sessions_lists_counts = contract.test_sessions_lists_counts
test_tenants_are_separate = contract.test_tenants_are_separate
test_unknown_session_reads_empty = contract.test_unknown_session_reads_empty
test_an_append_naming_another_last_entry_conflicts_and_writes_nothing = (
    contract.test_an_append_naming_another_last_entry_conflicts_and_writes_nothing)
test_a_keyed_fact_the_log_holds_is_not_written_again = contract.test_a_keyed_fact_the_log_holds_is_not_written_again
test_locks = contract.test_locks
test_expired_lock_can_be_retaken = contract.test_expired_lock_can_be_retaken
test_ping = contract.test_ping


async def test_concurrent_first_secret_calls_agree_on_the_cluster(cluster_store: RedisFactLog,
                                                                  redis_cluster: RedisClusterProcess) -> None:
    other = RedisFactLog.from_url(redis_cluster.url)
    try:
        secrets = await asyncio.gather(*(handle.secret() for handle in (cluster_store, other) for _ in range(4)))
        assert len(set(secrets)) == 1 and len(secrets[0]) == 43
    finally:
        await other.aclose()


# ---- what only a cluster can get wrong ---------------------------------------------------------

KEYS = [SessionKey(f"tenant-{t}", f"run-{s}") for t in range(3) for s in range(10)]


def owner(store: RedisFactLog, key: SessionKey) -> ClusterNode:
    assert isinstance(store.client, RedisCluster)
    node: ClusterNode = store.client.get_node_from_key(log_key(*key))
    return node


async def fill(store: RedisFactLog, keys: list[SessionKey]) -> None:
    await asyncio.gather(*(store.append(key, 0, [msg(0), msg(1, "assistant")], TS) for key in keys))


async def test_the_url_makes_a_cluster_client_that_finds_every_primary(cluster_store: RedisFactLog,
                                                                       redis_cluster: RedisClusterProcess) -> None:
    client = cluster_store.client
    assert isinstance(client, RedisCluster)
    await cluster_store.ping()
    assert sorted(node.port for node in client.get_primaries()) == sorted(redis_cluster.ports)


async def test_a_sessions_keys_share_one_slot_and_live_on_its_node(cluster_store: RedisFactLog) -> None:
    client = cluster_store.client
    assert isinstance(client, RedisCluster)
    await fill(cluster_store, KEYS)
    for key in KEYS:
        assert await cluster_store.try_lock(key, "compact", "tok", 30)
    found: dict[str, int] = {}
    for node in client.get_primaries():
        for name in await client.keys("*", target_nodes=node):
            found[name.decode()] = node.port
    assert len(found) == 3 * len(KEYS)
    for key in KEYS:
        names = [log_key(*key), meta_key(*key), lock_key(*key, "compact")]
        slots = {key_slot(name.encode()) for name in names}
        assert slots == {key_slot(f"{key.tenant}:{key.session}".encode())}
        assert {await client.cluster_keyslot(name) for name in names} == slots, "the server hashes them alike"
        assert {found[name] for name in names} == {owner(cluster_store, key).port}


async def test_commands_wait_their_turn_past_the_connection_limit(redis_cluster: RedisClusterProcess) -> None:
    """redis-py's cluster client fails past ``max_connections`` to a node; the store makes commands wait instead."""
    store = RedisFactLog.from_url(redis_cluster.url + "&max_connections=2")
    try:
        await store.client.flushdb()
        await fill(store, KEYS)
        reads = await asyncio.gather(*(store.read(key) for key in KEYS for _ in range(5)))
        assert [len(facts) for facts in reads] == [2] * 5 * len(KEYS)
        assert isinstance(store.client, RedisCluster)
        assert max(len(node._connections) for node in store.client.get_nodes()) <= 2
    finally:
        await store.aclose()


async def test_sessions_spread_over_slots_and_primaries(cluster_store: RedisFactLog,
                                                        redis_cluster: RedisClusterProcess) -> None:
    await fill(cluster_store, KEYS)
    assert len({key_slot(log_key(*key).encode()) for key in KEYS}) == len(KEYS)
    assert {owner(cluster_store, key).port for key in KEYS} == set(redis_cluster.ports)
    infos = [info async for info in cluster_store.sessions()]
    assert sorted((i.tenant, i.session, i.messages) for i in infos) == sorted((k.tenant, k.session, 2) for k in KEYS)


async def test_sessions_pages_through_every_primary(cluster_store: RedisFactLog) -> None:
    keys = [SessionKey("many", f"s{i}") for i in range(900)]  # ~600 keys a node: several SCAN pages each
    for start in range(0, len(keys), 200):
        await fill(cluster_store, keys[start:start + 200])
    assert sorted([info.session async for info in cluster_store.sessions()]) == sorted(k.session for k in keys)


async def test_a_fresh_clients_first_commands_may_come_all_at_once(redis_cluster: RedisClusterProcess,
                                                                  cluster_store: RedisFactLog) -> None:
    """A replica starting under load: its first commands arrive together, before any slot map is known."""
    await fill(cluster_store, KEYS)
    for _ in range(10):
        fresh = RedisFactLog.from_url(redis_cluster.url)
        try:
            logs = await asyncio.gather(*(fresh.read(key) for key in KEYS))
        finally:
            await fresh.aclose()
        assert [len(log) for log in logs] == [2] * len(KEYS)


async def test_unreachable_cluster_is_store_unavailable() -> None:
    """redis-py raises RedisClusterException, not a RedisError, when no seed answers: it must still map."""
    store = RedisFactLog.from_url(f"redis://127.0.0.1:{free_ports(1)[0]}?cluster=1")
    try:
        async with asyncio.timeout(10):
            with pytest.raises(StoreUnavailable):
                await store.ping()
            with pytest.raises(StoreUnavailable):
                await store.append(KEYS[0], 0, [msg(0)], TS)
            with pytest.raises(StoreUnavailable):
                [info async for info in store.sessions()]
    finally:
        await store.aclose()


def test_cluster_url_with_a_database_other_than_0_is_refused() -> None:
    with pytest.raises(ValueError, match="Redis Cluster"):
        RedisFactLog.from_url("redis://127.0.0.1:7000/1?cluster=1")


def evalsha_calls(info: dict[str, Any]) -> int:
    stat = info.get("cmdstat_evalsha")
    return int(stat["calls"]) if isinstance(stat, dict) else 0


async def test_scripts_run_on_the_node_that_owns_the_session(cluster_store: RedisFactLog) -> None:
    client = cluster_store.client
    assert isinstance(client, RedisCluster)
    key = KEYS[0]
    await cluster_store.append(key, 0, [msg(0)], TS)  # loads the script wherever it was missing
    await client.config_resetstat(target_nodes=RedisCluster.PRIMARIES)
    for seq in range(1, 6):
        await cluster_store.append(key, seq, [msg(seq)], TS)
    with pytest.raises(ConflictError):
        await cluster_store.append(key, 2, [msg(9)], TS)
    home = owner(cluster_store, key)
    calls = {node.port: evalsha_calls(await client.info("commandstats", target_nodes=node))
             for node in client.get_primaries()}
    assert calls == {port: (6 if port == home.port else 0) for port in calls}, "no EVALSHA went astray"


async def test_first_look_reads_two_slots_on_the_cluster(cluster_store: RedisFactLog) -> None:
    """The session's log and link live in its slot, its id's tenants in another: two scripts there."""
    await first_look_contract(cluster_store)


async def test_scripts_reload_after_a_node_forgets_them(cluster_store: RedisFactLog) -> None:
    client = cluster_store.client
    assert isinstance(client, RedisCluster)
    await fill(cluster_store, KEYS)
    home = owner(cluster_store, KEYS[0])
    await client.execute_command("SCRIPT FLUSH", target_nodes=home)  # as after a restart or failover
    await cluster_store.append(KEYS[0], 2, [msg(2)], TS)
    assert await cluster_store.try_lock(KEYS[0], "compact", "a", 30)
    await client.script_flush()  # every primary
    await cluster_store.unlock(KEYS[0], "compact", "a")
    assert await cluster_store.try_lock(KEYS[0], "compact", "b", 30)
    for key in KEYS[1:]:
        await cluster_store.append(key, 2, [msg(2)], TS)
    assert [[f.seq for f in await cluster_store.read(key)] for key in KEYS] == [[0, 1, 2]] * len(KEYS)


def redis_cli(port: int, *args: str) -> str:
    return subprocess.run([REDIS_CLI, "-p", str(port), *args], check=True, capture_output=True, text=True,
                          timeout=10).stdout


async def test_dropped_connections_reconnect(cluster_store: RedisFactLog, redis_cluster: RedisClusterProcess) -> None:
    await fill(cluster_store, KEYS)
    for port in redis_cluster.ports:  # a network blip or an idle timeout: every client connection closed
        redis_cli(port, "CLIENT", "KILL", "TYPE", "normal")
    for key in KEYS:
        await cluster_store.append(key, 2, [msg(2)], TS)
    assert len([info async for info in cluster_store.sessions()]) == len(KEYS)


async def test_node_restart_fails_its_sessions_then_reconnects(cluster_store: RedisFactLog,
                                                               redis_cluster: RedisClusterProcess) -> None:
    await fill(cluster_store, KEYS)
    seed = redis_cluster.nodes[0]  # the node named in the URL: the client must get by without it
    down = [key for key in KEYS if owner(cluster_store, key).port == seed.port]
    up = [key for key in KEYS if owner(cluster_store, key).port != seed.port]
    assert down and up
    redis_cli(seed.port, "SAVE")  # the nodes run without persistence; this snapshot stands in for an AOF
    seed.stop()
    try:
        async with asyncio.timeout(30):
            with pytest.raises(StoreUnavailable):
                await cluster_store.append(down[0], 2, [msg(2)], TS)
            with pytest.raises(StoreUnavailable):
                [info async for info in cluster_store.sessions()]
            for key in up:  # the other primaries' sessions go on
                await cluster_store.append(key, 2, [msg(2)], TS)
    finally:
        seed.start()
        redis_cluster.wait_ok()
    for key in down:
        await cluster_store.append(key, 2, [msg(2)], TS)
    assert [[f.seq for f in await cluster_store.read(key)] for key in KEYS] == [[0, 1, 2]] * len(KEYS)
    assert len([info async for info in cluster_store.sessions()]) == len(KEYS)


# ---- three proxy replicas on one cluster -------------------------------------------------------

WINDOW = 4000
SESSIONS = 12
STEPS = 15
API_KEY = "sk-cluster"
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
WORDS = ("alpha", "beta", "gamma", "delta", "parser", "module", "config", "request", "handler", "buffer", "cache",
         "retry", "socket", "token", "stream", "vector", "index", "commit", "branch", "merge", "build", "test")


class Replica:
    """``python3 -m proxy serve`` in its own process, as a deployment runs it."""

    def __init__(self, port: int, upstream: str, store: str, log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
        args = [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream", upstream,
                "--store", store, "--context-window", str(WINDOW), "--precompact-threshold", "1",
                "--keep-tool-output-share", "1",  # the summary path: masking would keep these runs under the trigger
                "--log-level", "WARNING"]
        self.base = f"http://127.0.0.1:{port}"
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         cwd=Path(__file__).resolve().parents[1])

    async def wait_healthy(self, http: aiohttp.ClientSession, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                async with http.get(self.base + "/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)  # pause between polls; the check above ends the wait
        raise TimeoutError(f"replica {self.base} not healthy within {timeout}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def run_session(http: aiohttp.ClientSession, replicas: list[Replica], session: str,
                      rng: random.Random) -> tuple[list[dict[str, Any]], set[str], set[str]]:
    """One agent: each step a random replica, some streamed. Returns its conversation, replicas and compactions."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Task of {session}: remember FACT-{session.replace('-', '')}. "
                                    + prose(rng, 200)},
    ]
    used: set[str] = set()
    compacted: set[str] = set()
    headers = {"Authorization": f"Bearer {API_KEY}", "X-Session-Id": session}
    for _ in range(STEPS):
        replica = rng.choice(replicas)
        used.add(replica.base)
        stream = rng.random() < 0.4
        body = {"model": "fake-model", "messages": messages, "tools": TOOLS, "stream": stream}
        async with http.post(replica.base + "/v1/chat/completions", data=orjson.dumps(body), headers=headers) as resp:
            raw = await resp.read()
            assert resp.status == 200, raw[:500]
            assert resp.headers["X-Session-Id"] == session
            compacted.add(resp.headers["X-Ctxproxy-Compacted"])
        reply = assistant_from_sse(raw) if stream else orjson.loads(raw)["choices"][0]["message"]
        messages.append(reply)
        if reply.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": prose(rng, 450)})
        else:
            messages.append({"role": "user", "content": prose(rng, 200)})
    return messages[:-1], used, compacted  # the last client message was never sent


def check_checkpoints(session: str, facts: list[Any], conversation: list[dict[str, Any]]) -> int:
    hashes = [message_hash(m) for m in conversation]
    checkpoints = 0
    for i, fact in enumerate(facts):
        if fact.kind != "checkpoint":
            continue
        checkpoints += 1
        checkpoint = Checkpoint.from_json(fact.extra["checkpoint"])
        summary = facts[i - 1]
        assert summary.kind == "summary" and summary.index == fact.index == checkpoint.retain_start_idx
        logged = sum(1 for f in facts[:i] if f.kind == "message")
        assert 0 < checkpoint.retain_start_idx <= logged
        assert checkpoint.matches(hashes), "a checkpoint covers a prefix of the conversation as logged"
        assert checkpoint.tokens_after < checkpoint.tokens_before
        assert f"FACT-{session.replace('-', '')}" in checkpoint.summary, "rolling summaries keep the task's fact"
    return checkpoints


def proactive_ok(metrics_text: str) -> float:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "ctxproxy_compactions":
            return sum(s.value for s in family.samples if s.name == "ctxproxy_compactions_total"
                       and s.labels == {"trigger": "proactive", "outcome": "ok"})
    return 0.0


@pytest.mark.slow
async def test_three_replicas_share_sessions_on_the_cluster(
    redis_cluster: RedisClusterProcess, cluster_store: RedisFactLog, upstream: TestServer, fake: FakeUpstream,
    tmp_path: Path,
) -> None:
    fake.window = WINDOW  # the upstream refuses anything the proxy should have compacted
    upstream_url = str(upstream.make_url("/v1"))
    replicas: list[Replica] = []
    try:
        for i, port in enumerate(free_ports(3)):
            replicas.append(Replica(port, upstream_url, redis_cluster.url, tmp_path / f"replica-{i}.log"))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            await asyncio.gather(*(replica.wait_healthy(http) for replica in replicas))
            names = [f"agent-{n}" for n in range(SESSIONS)]
            results = await asyncio.gather(*(run_session(http, replicas, name, random.Random(n))
                                             for n, name in enumerate(names)))
            scraped = []
            for replica in replicas:
                async with http.get(replica.base + "/metrics") as resp:
                    scraped.append(await resp.text())
    finally:
        for replica in replicas:
            replica.stop()

    assert fake.refused == 0
    assert {"proactive", "none"} <= set().union(*(compacted for _, _, compacted in results))
    checkpoints = 0
    for name, (conversation, used, _) in zip(names, results, strict=True):
        assert len(used) >= 2, "the session really moved between replicas"
        facts = await read_log(cluster_store, SessionKey(tenant_of(API_KEY), name))
        assert [f.seq for f in facts] == list(range(len(facts)))
        assert "rewind" not in {f.kind for f in facts}, "no replica mistook another's write for an edit"
        assert same_conversation(replay(facts), conversation)
        found = check_checkpoints(name, facts, conversation)
        assert found >= 1
        checkpoints += found
    assert sum(proactive_ok(text) for text in scraped) == checkpoints, "each compaction wrote one checkpoint"
    infos = {info.session: info async for info in cluster_store.sessions()}
    assert sorted(infos) == sorted(names)
