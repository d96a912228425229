"""The summary call as the upstream sees it: its output bound, and a timeout that bounds the whole compaction."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest
from aiohttp import web
from click.testing import CliRunner

from proxy.cli import main
from proxy.context.checkpoint import Checkpoint
from proxy.dialects.chat import output_bound_field
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream
from tests.proxyfixtures import read_log
from tests.test_compaction_e2e import prose

API_KEY = "sk-summary-call"


class SlowSummariser(FakeUpstream):
    """A summary model that takes ``delay`` seconds per call, and counts the calls it started."""

    def __init__(self) -> None:
        super().__init__()
        self.delay = 0.0
        self.started = 0

    async def summary(self, body: dict[str, Any]) -> web.Response:
        self.started += 1
        await asyncio.sleep(self.delay)  # the model writing; the proxy's timeout may cut it short
        return await super().summary(body)


@pytest.fixture
def fake() -> SlowSummariser:
    return SlowSummariser()


def history(rounds: int, seed: int = 11) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(rounds):
        messages += [{"role": "user", "content": f"step {i}: " + prose(rng, 150)},
                     {"role": "assistant", "content": f"done {i}: " + prose(rng, 150)}]
    return [*messages, {"role": "user", "content": "Go on."}]


async def send(proxy: Any, session: str, messages: list[dict[str, Any]], model: str = "gpt-4o",
               **fields: Any) -> str:
    body = {"model": model, "messages": messages, **fields}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={"Authorization": f"Bearer {API_KEY}", "X-Session-Id": session})
    raw = await resp.read()
    assert resp.status == 200, raw[:300]
    return resp.headers["X-Ctxproxy-Compacted"]


def test_summary_max_tokens_is_a_setting() -> None:
    env = {"CTXPROXY_SUMMARY_MAX_TOKENS": "2000"}
    assert Settings().summary_max_tokens == 8192
    assert Settings.from_env(env).summary_max_tokens == 2000
    assert Settings.from_env(env, summary_max_tokens=3000).summary_max_tokens == 3000
    with pytest.raises(ValueError, match="summary_max_tokens must be at least 256"):
        Settings(summary_max_tokens=100)
    with pytest.raises(ValueError, match="CTXPROXY_SUMMARY_MAX_TOKENS must be a number"):
        Settings.from_env({"CTXPROXY_SUMMARY_MAX_TOKENS": "lots"})
    help_text = " ".join(CliRunner().invoke(main, ["serve", "--help"]).output.split())
    assert "--summary-max-tokens INTEGER Output bound of a summary call" in help_text
    assert "[default: 8192] [env var: CTXPROXY_SUMMARY_MAX_TOKENS]" in help_text


@pytest.mark.parametrize(("model", "field"), [
    ("o1", "max_completion_tokens"), ("o1-mini", "max_completion_tokens"), ("o3", "max_completion_tokens"),
    ("o4-mini-2025-04-16", "max_completion_tokens"), ("gpt-5", "max_completion_tokens"),
    ("gpt-5.1-codex", "max_completion_tokens"), ("openai/o3-mini", "max_completion_tokens"),
    ("azure/GPT-5-mini", "max_completion_tokens"),
    ("gpt-4o", "max_tokens"), ("gpt-4.1-mini", "max_tokens"), ("claude-sonnet-4-5", "max_tokens"),
    ("meta-llama/Llama-3.3-70B-Instruct", "max_tokens"), ("omni-moderation-latest", "max_tokens"),
    ("qwen3-coder:30b", "max_tokens"), ("", "max_tokens"),
])
def test_the_output_bound_field_follows_the_model_family(model: str, field: str) -> None:
    assert output_bound_field(model) == field


@pytest.mark.parametrize(("client_field", "summary_model", "summary_max_tokens", "body_field", "bound"), [
    # The client's field, with the summariser's bound: a quarter of the request model's 4,096-token window.
    ("max_tokens", None, None, "max_tokens", 1_024),
    ("max_completion_tokens", None, None, "max_completion_tokens", 1_024),  # e.g. an Azure deployment's own name
    (None, None, None, None, None),  # no field: none is sent, whatever the model
    (None, "o3-mini", None, None, None),
    # --summary-model another model: its family's field, for the client chose its own for its own model.
    ("max_tokens", "o3-mini", None, "max_completion_tokens", 1_024),
    ("max_completion_tokens", "gpt-5-mini", 600, "max_completion_tokens", 600),  # --summary-max-tokens wins
    ("max_completion_tokens", "mistral-large-latest", 600, "max_tokens", 600),
])
async def test_the_summary_request_carries_its_output_bound_in_the_clients_field(
        make_proxy, fake: SlowSummariser, client_field: str | None, summary_model: str | None,
        summary_max_tokens: int | None, body_field: str | None, bound: int | None) -> None:
    options: dict[str, Any] = {"summary_model": summary_model}
    if summary_max_tokens is not None:
        options["summary_max_tokens"] = summary_max_tokens
    proxy = await make_proxy(context_window=4096, min_retain_rounds=2, **options)
    fields = {client_field: 300} if client_field is not None else {}
    assert await send(proxy, "bound", history(12), **fields) == "proactive"
    assert fake.summary_requests
    for body in fake.summary_requests:
        assert body["model"] == (summary_model or "gpt-4o")
        sent = {k: body[k] for k in ("max_tokens", "max_completion_tokens") if k in body}
        assert sent == ({body_field: bound} if body_field is not None else {})


async def test_the_summary_timeout_bounds_the_whole_compaction_and_keeps_the_chunks_done(
        make_proxy, fake: SlowSummariser) -> None:
    """Chunk calls of 0.4 s each under a 0.6 s timeout: the compaction stops in its second call, and the first
    chunk's summary is kept (issue 18: a long first contact compacts over several steps, never not at all).

    Before, each call had the whole timeout to itself, and a compaction of n chunks could take n timeouts; then
    the whole timeout was shared but a chunk done was thrown away with the rest.
    """
    proxy = await make_proxy(context_window=4096, min_retain_rounds=2, summary_timeout=0.6)
    messages = history(26)
    key = SessionKey(tenant_of(API_KEY), "slow")
    fake.delay = 0.4
    assert await send(proxy, "slow", messages) == "proactive"
    assert (fake.started, len(fake.summary_requests)) == (2, 1), "the second call was cut, no third one started"
    facts = await read_log(proxy.app[store_key], key)
    checkpoint = Checkpoint.from_json([f for f in facts if f.kind == "checkpoint"][-1].extra["checkpoint"])
    assert checkpoint.summary, "the chunk done is the summary"
    assert 1 < checkpoint.summary_end < checkpoint.retain_start_idx and checkpoint.elision, "the rest is elided"
    assert [f.kind for f in facts if f.kind != "message"] == ["summary", "checkpoint"]
