"""Summary calls shaped like the client's own request (``proxy.summarycall``), through each door.

Each strict fake refuses what a real account or upstream refuses in a request of the proxy's own: the ChatGPT
Codex backend (``stream: true`` only, no ``max_output_tokens``), a Claude subscription's OAuth token (Claude
Code's system prompt only), an Azure reasoning deployment with a custom name (no ``max_tokens``). A run that
must compact gets an ``ok`` compaction anyway: a summary and a checkpoint in the log, the next view led by it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.dialects import CHAT, MESSAGES, RESPONSES
from proxy.dialects.base import Dialect
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from proxy.summarycall import NO_TOOLS, ClientRequest, SummaryCallFailed, answer_of, forces_tool, summary_request
from tests.fakemessages import CLAUDE_CODE_SYSTEM, FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script, is_summary_prompt
from tests.fakeupstream import SUMMARY_MARKER, FakeUpstream
from tests.proxyfixtures import read_log
from tests.scripted import INSTRUCTIONS, KEY, Claude, Codex, rig
from tests.test_summary_call import API_KEY, history, send
from tests.test_summary_faults import compactions

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]


async def compacted(proxy: Any, key: SessionKey, next_view: object) -> str:
    """The compaction's summary, once its ``ok`` is counted, its entries logged and ``next_view`` carries it."""
    assert compactions(await (await proxy.get("/metrics")).text(), "ok") >= 1
    facts = await read_log(proxy.app[store_key], key)
    assert {"summary", "checkpoint"} <= {f.kind for f in facts}
    summary: str = [f for f in facts if f.kind == "checkpoint"][-1].extra["checkpoint"]["summary"]
    assert summary.startswith("## 1. Goals") and any(summary in text for text in strings(next_view))
    return summary


def strings(value: object) -> list[str]:
    """Every string inside ``value`` (a view's items), however deep."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [text for part in value for text in strings(part)] if isinstance(value, list) else []


# -- through each door, in front of the strict upstreams ---------------------------------------------


async def test_an_azure_reasoning_deployment_gets_its_own_output_bound_field(make_proxy, fake: FakeUpstream) -> None:
    """A custom deployment name says nothing of the model family: the client's ``max_completion_tokens`` goes."""
    fake.refuse_max_tokens = True
    proxy = await make_proxy(context_window=4096, min_retain_rounds=2)
    assert await send(proxy, "azure", history(12), model="my-reasoner", max_completion_tokens=300) == "proactive"
    assert fake.strict_refusals == [] and fake.summary_requests
    assert all(body["max_completion_tokens"] == 1_024 for body in fake.summary_requests)
    await compacted(proxy, SessionKey(tenant_of(API_KEY), "azure"), fake.requests[-1]["messages"])


async def test_a_streaming_client_gets_a_streamed_summary_assembled(make_proxy, fake: FakeUpstream) -> None:
    fake.require_stream = True
    proxy = await make_proxy(context_window=4096, min_retain_rounds=2)
    assert await send(proxy, "streamed", history(12), stream=True,
                      stream_options={"include_usage": True}) == "proactive"
    assert fake.strict_refusals == [] and fake.summary_requests
    assert all(body["stream"] is True and body["stream_options"] == {"include_usage": True}
               for body in fake.summary_requests)
    summary = await compacted(proxy, SessionKey(tenant_of(API_KEY), "streamed"), fake.requests[-1]["messages"])
    assert "## 8. Identifiers" in summary, "every streamed piece was put together"


async def codex_backend_run(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path,
                            window: int) -> tuple[FakeResponses, Any, Codex]:
    """Eight Codex steps against a fake that, as the ChatGPT Codex backend, wants ``stream: true`` and refuses
    ``max_output_tokens``."""
    fake = FakeResponses(Script(steps=20))
    fake.require_stream = fake.reject_max_output_tokens = True
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=window)
    codex = Codex(proxy)
    for _ in range(8):
        await codex.step()
    return fake, proxy, codex


async def test_the_codex_backend_takes_the_summary_of_a_codex_run(aiohttp_server, aiohttp_client,
                                                                  tmp_path: Path) -> None:
    fake, proxy, codex = await codex_backend_run(aiohttp_server, aiohttp_client, tmp_path, window=3_000)
    assert [r for r in fake.requests if r.status != 200] == []
    summaries = [r for r in fake.requests if r.kind == "summary"]
    assert summaries and all(r.body["stream"] is True and "max_output_tokens" not in r.body for r in summaries)
    await compacted(proxy, SessionKey(tenant_of(KEY), codex.session), fake.turns()[-1].body["input"])


async def test_a_claude_subscription_takes_the_summary_of_a_claude_code_run(aiohttp_server, aiohttp_client,
                                                                           tmp_path: Path) -> None:
    fake = FakeMessages(Script(steps=20))
    fake.require_claude_code = True
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=3000)
    claude = Claude(proxy)
    system = [{"type": "text", "text": CLAUDE_CODE_SYSTEM}, {"type": "text", "text": INSTRUCTIONS}]
    for _ in range(8):
        await claude.step(system=system)
    assert [r for r in fake.requests if r.status != 200] == []
    summaries = [r for r in fake.requests if r.kind == "summary"]
    assert summaries and all(r.body["system"] == system for r in summaries)
    await compacted(proxy, SessionKey(tenant_of(KEY), claude.session), fake.turns()[-1].body["messages"])


# -- what the summary request carries ------------------------------------------------------------


async def test_the_chat_summary_request_is_the_clients_own_reshaped(make_proxy, fake: FakeUpstream) -> None:
    """System and developer messages, tools, headers, query and settings as sent; one user turn asking for it."""
    proxy = await make_proxy(context_window=4096, min_retain_rounds=2, add_fields="always")  # the key as turns get it
    lead = [{"role": "system", "content": "You are a coding agent."}, {"role": "developer", "content": "Be terse."}]
    body = {"model": "gpt-4o", "messages": [*lead, *history(12)[1:]], "tools": TOOLS, "tool_choice": "required",
            "reasoning_effort": "low", "metadata": {"run": "r1"}, "stop": ["END"], "n": 2, "max_tokens": 300,
            "response_format": {"type": "json_object"}, "user": "u-7"}
    headers = {"Authorization": f"Bearer {API_KEY}", "X-Session-Id": "shape", "X-Client-Trace": "t-1"}
    resp = await proxy.post("/v1/chat/completions?api-version=2025-01-01", data=orjson.dumps(body), headers=headers)
    assert resp.status == 200, await resp.text()
    assert resp.headers["X-Ctxproxy-Compacted"] == "proactive"
    turn = fake.requests[-1]
    for summary, (path, sent_headers) in zip(fake.summary_requests, fake.summary_calls, strict=True):
        assert path == "/v1/chat/completions?api-version=2025-01-01"
        assert sent_headers["X-Client-Trace"] == "t-1" and sent_headers["Authorization"] == f"Bearer {API_KEY}"
        *kept, asked = summary["messages"]
        assert kept == lead and asked["role"] == "user"
        assert asked["content"].startswith(SUMMARY_MARKER) and NO_TOOLS in asked["content"]
        assert "\n\nWrite the summary." in asked["content"] or "\n\nUpdate the previous summary" in asked["content"]
        assert {k: summary[k] for k in ("tools", "reasoning_effort", "metadata", "user", "prompt_cache_key")} == {
            k: turn[k] for k in ("tools", "reasoning_effort", "metadata", "user", "prompt_cache_key")}
        assert not {"tool_choice", "stop", "n", "response_format", "stream"} & set(summary)
        assert summary["max_tokens"] == 1_024


async def test_a_summary_answered_with_a_tool_call_is_a_failed_summary(make_proxy, fake: FakeUpstream) -> None:
    fake.summary_mode = "tool_call"
    proxy = await make_proxy(context_window=4096, min_retain_rounds=2)
    # Over the hard limit of this small window, the model-free tier stands in for the failed summary.
    assert await send(proxy, "tooled", history(12), tools=TOOLS) == "proactive"
    assert fake.summary_requests and all(body["tools"] == TOOLS for body in fake.summary_requests)
    metrics = await (await proxy.get("/metrics")).text()
    assert compactions(metrics, "fallback") == 1 and compactions(metrics, "ok") == 0
    with pytest.raises(SummaryCallFailed, match=r"calls a tool \(read_file\) instead of answering"):
        answer_of(CHAT, {"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}}]})


# -- the written rules, per dialect ------------------------------------------------------------------


def reshaped(dialect: Dialect, payload: dict[str, Any], model: str = "m", bound: int = 1_000,
             fields: dict[str, Any] | None = None) -> dict[str, Any]:
    return summary_request(dialect, ClientRequest(dialect.parse(orjson.dumps(payload)), fields=fields or {}), model,
                           SUMMARY_MARKER + " PROMPT", bound)


@pytest.mark.parametrize(("choice", "forces"), [
    ("auto", False), ("none", False), ("required", True), ("any", True), (None, False),
    ({"type": "auto"}, False), ({"type": "none"}, False), ({"type": "any"}, True),
    ({"type": "tool", "name": "x"}, True),
    ({"type": "function", "function": {"name": "x"}}, True), ({"type": "function", "name": "x"}, True),
    ({"type": "file_search"}, True), ({"type": "allowed_tools", "mode": "auto", "tools": []}, False),
    ({"type": "allowed_tools", "mode": "required", "tools": []}, True),
])
def test_a_tool_choice_that_forces_a_call_is_dropped(choice: Any, forces: bool) -> None:
    assert forces_tool(choice) is forces
    body = reshaped(CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                           "tool_choice": choice})
    assert ("tool_choice" in body) is not forces


def test_a_responses_summary_keeps_the_state_of_the_account_and_drops_the_state_upstream() -> None:
    developer = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be terse."}]}
    payload = {"model": "gpt-5.5", "instructions": "You are Codex.", "input": [developer, {"role": "user",
               "content": "hi"}], "tools": [{"type": "function", "name": "shell"}], "store": False, "stream": True,
               "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "high", "summary": "auto"},
               "text": {"verbosity": "low", "format": {"type": "json_schema", "name": "x", "schema": {}}},
               "previous_response_id": "resp_1", "conversation": "conv_1", "background": True,
               "prompt_cache_key": "k", "max_output_tokens": 200, "tool_choice": "required"}
    body = reshaped(RESPONSES, payload)
    assert body == {"model": "m", "instructions": "You are Codex.", "tools": payload["tools"], "store": False,
                    "stream": True, "include": payload["include"], "reasoning": payload["reasoning"],
                    "text": {"verbosity": "low"}, "prompt_cache_key": "k", "max_output_tokens": 1_000,
                    "input": [developer, {"type": "message", "role": "user",
                                          "content": [{"type": "input_text", "text": SUMMARY_MARKER + " PROMPT"}]}]}
    del payload["max_output_tokens"]
    assert "max_output_tokens" not in reshaped(RESPONSES, payload), "none is sent when the client sent none"
    assert reshaped(RESPONSES, payload, fields={"stream": True, "store": False})["stream"] is True


@pytest.mark.parametrize(("thinking", "max_tokens"), [
    (None, 1_000), ({"type": "adaptive"}, 1_000), ({"type": "enabled", "budget_tokens": 500}, 1_000),
    ({"type": "enabled", "budget_tokens": 31_999}, 32_000),  # the client's: the budget does not fit under 1,000
])
def test_a_messages_summary_keeps_the_system_and_always_bounds_its_answer(thinking: Any, max_tokens: int) -> None:
    system = [{"type": "text", "text": CLAUDE_CODE_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    payload = {"model": "claude-opus-5-5", "system": system, "max_tokens": 32_000, "stream": True,
               "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                            {"role": "user", "content": "go"}], "tools": [{"name": "Bash", "input_schema": {}}],
               "tool_choice": {"type": "any"}, "stop_sequences": ["END"], "metadata": {"user_id": "u"},
               "context_management": {"edits": []}, **({"thinking": thinking} if thinking else {})}
    body = reshaped(MESSAGES, payload)
    assert body == {"model": "m", "system": system, "max_tokens": max_tokens, "stream": True,
                    "tools": payload["tools"], "metadata": {"user_id": "u"}, "context_management": {"edits": []},
                    "messages": [{"role": "user", "content": [{"type": "text", "text": SUMMARY_MARKER + " PROMPT"}]}],
                    **({"thinking": thinking} if thinking else {})}
    assert is_summary_prompt(body["messages"][0]["content"])


async def test_a_summary_for_codexs_compact_endpoint_streams_unstored(aiohttp_server, aiohttp_client,
                                                                      tmp_path: Path) -> None:
    """``POST /v1/responses/compact`` carries no ``stream``: its summary streams anyway, as Codex's turns do."""
    fake, proxy, codex = await codex_backend_run(aiohttp_server, aiohttp_client, tmp_path, window=4_000)
    assert not [r for r in fake.requests if r.kind == "summary"], "no checkpoint yet: the endpoint must make one"
    resp = await proxy.post("/v1/responses/compact", data=orjson.dumps({"model": "gpt-5.5", "input": codex.items}),
                            headers={"Authorization": f"Bearer {KEY}", "session_id": codex.session})
    assert resp.status == 200, await resp.text()
    assert [item["type"] for item in (await resp.json())["output"]] == ["compaction"]
    summaries = [r for r in fake.requests if r.kind == "summary"]
    assert summaries and all(r.body["stream"] is True and r.body["store"] is False and r.status == 200
                             for r in summaries)
    assert not [r for r in fake.requests if r.kind == "compact"], "answered by the proxy, not the upstream"
