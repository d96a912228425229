"""Keeping the provider's prompt cache warm, and counting what it served: keys, breakpoints, usage metrics."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import create_app
from proxy.context.view.projection import SUMMARY_HEADER, FrozenEnds
from proxy.dialects import CHAT, MESSAGES, RESPONSES
from proxy.dialects.breakpoints import breakpoints
from proxy.dialects.chat import prompt_cache_key
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import STEP, Script
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import read_log
from tests.test_compaction_e2e import prose

KEY = "sk-cache"
AUTH = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY}
EPHEMERAL = {"type": "ephemeral"}


def counter(metrics: str, name: str) -> float:
    return sum(sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples
               if sample.name == name)


async def test_the_session_becomes_the_prompt_cache_key_and_the_body_is_otherwise_the_clients(
        make_proxy: Any, fake: FakeUpstream) -> None:
    proxy = await make_proxy(add_fields="always")  # the fake is not api.openai.com: auto would add nothing
    raw = b' { "messages" : [ {"role": "user", "content": "hi"} ],\n "model": "m" } '
    resp = await proxy.post("/v1/chat/completions", data=raw, headers={**AUTH, "X-Session-Id": "s1"})
    assert resp.status == 200
    assert fake.bodies[-1] == (b' {"prompt_cache_key":"s1", "messages" : [ {"role": "user", "content": "hi"} ],'
                               b'\n "model": "m" } ')
    own = b'{"model": "m", "prompt_cache_key": "theirs", "messages": [{"role": "user", "content": "hi"}]}'
    await proxy.post("/v1/chat/completions", data=own, headers={**AUTH, "X-Session-Id": "s1"})
    assert fake.bodies[-1] == own, "a key the client set is the client's"


def test_fields_are_added_only_for_the_official_openai_host_unless_told() -> None:
    assert Settings(upstream="https://api.openai.com/v1").adds_fields
    assert Settings(upstream="https://API.OpenAI.com:443/v1").adds_fields
    for other in ("https://myres.openai.azure.com/openai/v1", "https://api.openai.com.evil.test/v1",
                  "http://127.0.0.1:8000/v1", "https://openrouter.ai/api/v1"):
        assert not Settings(upstream=other).adds_fields, other
        assert Settings(upstream=other, add_fields="always").adds_fields, other
    assert not Settings(upstream="https://api.openai.com/v1", add_fields="never").adds_fields
    assert Settings.from_env({"CTXPROXY_ADD_FIELDS": "always"}, upstream="http://h/v1").adds_fields
    with pytest.raises(ValueError, match="add_fields"):
        Settings(add_fields="sometimes")


def test_a_session_longer_than_openai_takes_is_hashed_into_the_key() -> None:
    assert prompt_cache_key("run-1") == "run-1"
    assert prompt_cache_key("x" * 64) == "x" * 64
    long = prompt_cache_key("x" * 65)
    assert long.startswith("ctxproxy-") and len(long) == 41 and long == prompt_cache_key("x" * 65)


def test_each_api_sets_its_own_cache_fields() -> None:
    assert CHAT.cache_fields({}, "s") == RESPONSES.cache_fields({}, "s") == {"prompt_cache_key": "s"}
    assert RESPONSES.cache_fields({"prompt_cache_key": "codex-thread"}, "s") == {}
    assert MESSAGES.cache_fields({}, "s") == {}, "Anthropic has no such field: it takes breakpoints"


SUMMARY_ITEM = {"role": "user", "content": [{"type": "text", "text": f"{SUMMARY_HEADER}\n\nS"},
                                            {"type": "text", "text": "go on"}]}


def test_a_breakpoint_goes_on_the_summary_block_while_the_request_has_room() -> None:
    marked = MESSAGES.cache_hints({"system": [{"type": "text", "text": "s", "cache_control": EPHEMERAL}]},
                                  [SUMMARY_ITEM], FrozenEnds(summary=0), adds_fields=False)
    assert marked == [{"role": "user", "content": [{**SUMMARY_ITEM["content"][0], "cache_control": EPHEMERAL},
                                                   SUMMARY_ITEM["content"][1]]}]
    assert SUMMARY_ITEM["content"][0].get("cache_control") is None, "the view's items are not changed in place"
    full = {"system": [{"type": "text", "text": str(i), "cache_control": EPHEMERAL} for i in range(2)],
            "tools": [{"name": "t", "input_schema": {}, "cache_control": EPHEMERAL}]}
    last = {"role": "assistant", "content": [{"type": "text", "text": "x", "cache_control": EPHEMERAL}]}
    assert breakpoints(full, [SUMMARY_ITEM, last]) == 4
    assert MESSAGES.cache_hints(full, [SUMMARY_ITEM, last], FrozenEnds(summary=0), adds_fields=False) == [
        SUMMARY_ITEM, last], \
        "four already: no room"
    assert MESSAGES.cache_hints({}, [SUMMARY_ITEM], FrozenEnds(), adds_fields=False) == [SUMMARY_ITEM], \
        "no summary in the view"
    unknown = {"model": "m"}  # a model that takes no explicit breakpoint
    assert CHAT.cache_hints(unknown, [SUMMARY_ITEM], FrozenEnds(summary=0), adds_fields=True) == [SUMMARY_ITEM]


async def proxy_for(aiohttp_server: Any, aiohttp_client: Any, fake: Any, store_url: str,
                    **settings: Any) -> TestClient[Any, Any]:
    upstream = await aiohttp_server(fake.app())
    root = str(upstream.make_url("")).rstrip("/")
    client: TestClient[Any, Any] = await aiohttp_client(create_app(Settings(
        upstream=root + "/v1", anthropic_upstream=root, store=store_url, **settings)))
    return client


async def claude_steps(proxy: TestClient[Any, Any], steps: int, system: Any, stream_every: int = 2) -> None:
    rng = random.Random(6)
    tools = [{"name": "Bash", "input_schema": {"type": "object", "properties": {}}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Go."}]}]
    for n in range(steps):
        body = {"model": "m", "max_tokens": 512, "system": system, "messages": messages, "tools": tools,
                "stream": n % stream_every == 1}
        resp = await proxy.post("/v1/messages", data=orjson.dumps(body), headers={**AUTH, "X-Session-Id": "claude"})
        raw = await resp.read()
        assert resp.status == 200, raw[:300]
        content = stream_content(raw) if body["stream"] else orjson.loads(raw)["content"]
        use = content[-1]
        step = int(STEP.search(use["input"]["command"]).group(1))  # type: ignore[union-attr]
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use["id"], "content": f"step-{step}\n" + prose(rng, 700)}]}]


def stream_content(raw: bytes) -> list[dict[str, Any]]:
    """The content blocks a client assembles from an Anthropic stream."""
    blocks: dict[int, dict[str, Any]] = {}
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: "):
            continue
        event = orjson.loads(line[6:])
        if event["type"] == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif event["type"] == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            for field, key in (("thinking", "thinking"), ("signature", "signature"), ("text", "text")):
                if key in delta:
                    block[field] = block.get(field, "") + delta[key]
            if "partial_json" in delta:
                block["_json"] = block.get("_json", "") + delta["partial_json"]
    out = []
    for index in sorted(blocks):
        block = blocks[index]
        if "_json" in block:
            block["input"] = orjson.loads(block.pop("_json"))
        out.append(block)
    return out


async def test_usage_metrics_count_anthropic_reads_from_the_cache(aiohttp_server: Any, aiohttp_client: Any,
                                                                 store_url: str) -> None:
    fake = FakeMessages(Script(steps=40))
    proxy = await proxy_for(aiohttp_server, aiohttp_client, fake, store_url, admin_token="admin-token")
    await claude_steps(proxy, 12, "You code.")
    metrics = await (await proxy.get("/metrics")).text()
    turns = fake.turns()
    assert counter(metrics, "ctxproxy_upstream_prompt_tokens_total") == sum(t.tokens or 0 for t in turns)
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "claude"))
    cached = sum(f.extra["usage"]["cache_read_input_tokens"] for f in facts if "usage" in f.extra)
    assert cached > 0, "a stable prefix is read from the cache"
    assert counter(metrics, "ctxproxy_upstream_cached_tokens_total") == cached
    view = await (await proxy.get(f"/admin/sessions/{tenant_of(KEY)}/claude/view",
                                  headers={"Authorization": "Bearer admin-token"})).json()
    assert {k: view["usage"][k] for k in ("replies", "prompt_tokens", "cached_tokens")} == {
        "replies": 12, "prompt_tokens": sum(t.tokens or 0 for t in turns), "cached_tokens": cached}


async def test_usage_metrics_count_openai_chat_and_responses_shapes(aiohttp_server: Any, aiohttp_client: Any,
                                                                    store_url: str) -> None:
    chat_fake = FakeUpstream()
    chat_fake.cached_tokens = 5
    # Streamed Chat answers report usage only when asked: the proxy asks where it may add fields.
    chat_proxy = await proxy_for(aiohttp_server, aiohttp_client, chat_fake, store_url, add_fields="always")
    for stream in (False, True, False):
        chat_fake.script.append(Reply(content="ok"))
        body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hello there"}]}
        assert (await chat_proxy.post("/v1/chat/completions", json=body, headers=AUTH)).status == 200
    metrics = await (await chat_proxy.get("/metrics")).text()
    prompt = chat_fake.count(chat_fake.requests[0])  # what the fake reports: the tokenizer's count of the prompt
    assert prompt > 5, "the cached 5 are a part of the prompt, not capped by it"
    assert counter(metrics, "ctxproxy_upstream_prompt_tokens_total") == 3 * prompt
    assert counter(metrics, "ctxproxy_upstream_cached_tokens_total") == 3 * 5

    fake = FakeResponses(Script(steps=20))
    proxy = await proxy_for(aiohttp_server, aiohttp_client, fake, store_url, admin_token="admin-token",
                            add_fields="always")
    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}]
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Go. " + prose(random.Random(1),
                                                                                                 2000)}]
    for n in range(6):
        body = {"model": "m", "input": items, "tools": tools, "store": False, "stream": n % 2 == 1}
        resp = await proxy.post("/v1/responses", json=body, headers={**AUTH, "X-Session-Id": "codex"})
        raw = await resp.read()
        output = (orjson.loads(raw)["output"] if not body["stream"] else
                  next(orjson.loads(line[6:])["response"]["output"] for line in raw.split(b"\n")
                   if line.startswith(b"data: ") and b'"response.completed"' in line))
        call = output[-1]
        items += [*output, {"type": "function_call_output", "call_id": call["call_id"],
                            "output": f"step-{n + 1}\n" + prose(random.Random(n), 300)}]
    metrics = await (await proxy.get("/metrics")).text()
    turns = fake.turns()
    assert all(t.body["prompt_cache_key"] == "codex" for t in turns), "the session keys the cache"
    assert counter(metrics, "ctxproxy_upstream_prompt_tokens_total") == sum(t.tokens or 0 for t in turns)
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "codex"))
    replies = {orjson.dumps(f.extra["view"]): f.extra["usage"] for f in facts if "usage" in f.extra}  # per reply
    assert len(replies) == 6
    cached = sum(usage["input_tokens_details"]["cached_tokens"] for usage in replies.values())
    assert cached > 0 and counter(metrics, "ctxproxy_upstream_cached_tokens_total") == cached
    view = await (await proxy.get(f"/admin/sessions/{tenant_of(KEY)}/codex/view",
                                  headers={"Authorization": "Bearer admin-token"})).json()
    assert {k: view["usage"][k] for k in ("replies", "prompt_tokens", "cached_tokens")} == {
        "replies": 6, "prompt_tokens": sum(t.tokens or 0 for t in turns), "cached_tokens": cached}, \
        "a reply of two items counts once"
