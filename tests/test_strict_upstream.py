"""Only the conversation changes: an upstream that refuses unknown fields (Azure OpenAI) takes every request.

The fakes' ``strict_fields`` answer a request carrying a field they do not take
with Azure's 400, summary requests included. By default (``--add-fields auto``)
the proxy adds fields only for api.openai.com, which the fakes are not; a
streamed Chat answer then carries no usage and the estimate is the tokenizer's.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from proxy.constants import HEADER_COMPACTED, HEADER_VIEW_TOKENS
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script
from tests.fakeupstream import AZURE_CHAT_FIELDS, FakeUpstream, Reply, StrictFields
from tests.proxyfixtures import MASKING_OFF, assistant_from_sse, read_log
from tests.scripted import Codex, rig
from tests.test_compaction_e2e import HEADERS, TOOLS, prose, tool_call

WINDOW = 4096
#: What Azure OpenAI's Responses API takes, for this test: no ``prompt_cache_key``.
AZURE_RESPONSES_FIELDS = frozenset({
    "model", "instructions", "input", "tools", "tool_choice", "parallel_tool_calls", "store", "stream", "include",
    "reasoning", "max_output_tokens", "temperature", "top_p", "text", "truncation", "metadata", "user"})


async def chat(proxy: Any, messages: list[dict[str, Any]], stream: bool) -> tuple[Any, bytes]:
    body = {"model": "gpt-4o", "messages": messages, "tools": TOOLS, "stream": stream}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={**HEADERS, "X-Session-Id": "azure"})
    return resp, await resp.read()


async def test_chat_turns_and_their_summary_calls_pass_an_upstream_that_refuses_unknown_fields(
        make_proxy: Any, fake: FakeUpstream) -> None:
    fake.strict_fields = StrictFields(allowed=AZURE_CHAT_FIELDS)
    # The summary path, not masking: with honest usage, masking the outputs past the last 10 keeps 16 steps under
    # the threshold.
    proxy = await make_proxy(context_window=WINDOW, **MASKING_OFF)
    rng = random.Random(3)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Refactor the parser module."}]
    compacted, estimates = [], []
    for step in range(16):
        fake.script.append(tool_call(step))
        resp, raw = await chat(proxy, messages, stream=step % 2 == 1)
        assert resp.status == 200, raw[:300]
        compacted.append(resp.headers[HEADER_COMPACTED])
        estimates.append(int(resp.headers[HEADER_VIEW_TOKENS]))
        reply = assistant_from_sse(raw) if step % 2 else orjson.loads(raw)["choices"][0]["message"]
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                             "content": prose(rng, 200)}]

    assert fake.unrecognised == []
    assert fake.summary_requests and "proactive" in compacted, "compaction ran, its summary calls passed too"
    assert all("stream_options" not in r and "prompt_cache_key" not in r for r in fake.requests)
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of("sk-e2e"), "azure"))
    replies = [f for f in facts if f.kind == "message" and f.source == "upstream"]
    assert len(replies) == 16
    assert all(("usage" in f.extra) == (n % 2 == 0) for n, f in enumerate(replies)), "no usage asked in streams"
    assert all(e > 0 for e in estimates), "without usage the estimate is the tokenizer's"


async def test_a_stream_the_client_asked_usage_of_is_forwarded_as_sent(make_proxy: Any, fake: FakeUpstream) -> None:
    fake.strict_fields = StrictFields(allowed=AZURE_CHAT_FIELDS | {"stream_options"})
    proxy = await make_proxy()
    body = orjson.dumps({"model": "m", "stream": True, "stream_options": {"include_usage": False},
                         "messages": [{"role": "user", "content": "hi"}]})
    fake.script.append(Reply(content="hello"))
    resp = await proxy.post("/v1/chat/completions", data=body, headers=HEADERS)
    assert resp.status == 200, await resp.text()
    assert b"[DONE]" in await resp.read()
    assert fake.bodies == [body]


async def test_the_fields_the_proxy_may_add_are_refused_by_such_an_upstream(make_proxy: Any,
                                                                            fake: FakeUpstream) -> None:
    """The strict fake is strict: with ``--add-fields always`` no request gets through (Azure's 400, relayed)."""
    fake.strict_fields = StrictFields(allowed=AZURE_CHAT_FIELDS)
    proxy = await make_proxy(add_fields="always")
    for stream in (False, True):
        body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
        resp = await proxy.post("/v1/chat/completions", json=body, headers=HEADERS)
        assert resp.status == 400
        assert (await resp.json())["error"]["message"].startswith("Unrecognized request argument supplied: ")
    assert fake.unrecognised == ["prompt_cache_key", "stream_options"]
    fake.strict_fields = StrictFields(refused=frozenset({"prompt_cache_key"}))
    resp = await proxy.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                            headers=HEADERS)
    assert resp.status == 400 and await resp.json() == {"error": {
        "message": "Unrecognized request argument supplied: prompt_cache_key", "type": "invalid_request_error",
        "param": None, "code": None}}


class AzureCodex(Codex):
    """A Responses client that sends no ``prompt_cache_key`` (Codex sends its own)."""

    def body(self, **extra: Any) -> dict[str, Any]:
        body = super().body(**extra)
        del body["prompt_cache_key"]
        return body


async def test_responses_turns_and_their_summary_calls_pass_an_upstream_that_refuses_unknown_fields(
        aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path) -> None:
    fake = FakeResponses(Script(steps=20))
    fake.strict_fields = StrictFields(allowed=AZURE_RESPONSES_FIELDS)
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=3000)
    codex = AzureCodex(proxy)
    compacted = [(await codex.step(stream=n % 2 == 0)).headers[HEADER_COMPACTED] for n in range(8)]
    kinds = [r.kind for r in fake.requests]
    assert "refused" not in kinds
    assert "summary" in kinds and "proactive" in compacted
    assert all("prompt_cache_key" not in r.body for r in fake.requests)


async def test_responses_with_added_fields_are_refused_by_such_an_upstream(
        aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path) -> None:
    fake = FakeResponses(Script(steps=20))
    fake.strict_fields = StrictFields(allowed=AZURE_RESPONSES_FIELDS)
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, add_fields="always")
    resp = await proxy.post("/v1/responses", data=orjson.dumps(AzureCodex(proxy).body()),
                            headers={"Authorization": "Bearer k"})
    assert resp.status == 400
    assert [r.kind for r in fake.requests] == ["refused"]
