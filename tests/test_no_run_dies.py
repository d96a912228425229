"""No run dies of compaction (issue 18): whatever the summary model does, a long tool loop finishes under the window.

A 60-step tool loop, through each front door, in a 12k window that the run
outgrows several times over, with a summary model that writes another format
(bold headings, numbered lines, German headings, plain prose), refuses, answers
HTTP 500 or never answers. Every step gets a 200, no request reaches the
upstream over its window, and the proxy's log shows how: a model summary when
the answer is usable, the model-free tier (``proxy.context.summary.fallback``) when not.
With a lazy summary model ("None" under every heading), the last view still
names every file the run wrote and every command it ran: the artifact trail is
the proxy's, not the model's.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import create_app
from proxy.context.checkpoint import Checkpoint
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import STEP, Script
from tests.fakeupstream import MISBEHAVIOURS, FakeUpstream, Reply
from tests.proxyfixtures import MASKING_OFF, read_log
from tests.test_compaction_e2e import prose

WINDOW = 12_000
STEPS = 60
KEY = "sk-no-run-dies"
SESSION = "long-run"
#: Styles whose answer is a summary (another format, or sections with nothing in them): accepted, no fallback.
USABLE = ("bold", "numbered", "translated", "prose", "lazy")


@dataclass
class Run:
    """What the agent wrote and ran, and what each upstream turn carried."""

    paths: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    views: list[Any] = field(default_factory=list)
    refused: int = 0
    largest: int = 0


def output(step: int, rng: random.Random) -> str:
    return f"step-{step}\n" + prose(rng, 420)


async def post(proxy: TestClient[Any, Any], path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await proxy.post(path, data=orjson.dumps(body), headers={
        "Authorization": f"Bearer {KEY}", "x-api-key": KEY, "anthropic-version": "2023-06-01",
        "X-Session-Id": SESSION})
    raw = await resp.read()
    assert resp.status == 200, raw[:400]
    answer: dict[str, Any] = orjson.loads(raw)
    return answer


async def chat_run(proxy: TestClient[Any, Any], fake: FakeUpstream) -> Run:
    """Gemini-CLI-style tools through Chat Completions: every odd step writes a file, every even one runs a command."""
    run, rng = Run(), random.Random(1)
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
             for name in ("write_file", "run_shell_command")]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Port the parser, one module at a time."}]
    for step in range(1, STEPS + 1):
        if step % 2:
            path = f"src/parser/mod_{step}.py"
            name, arguments = "write_file", {"file_path": path, "content": f"# module {step}\n"}
            run.paths.append(path)
        else:
            command = f"pytest tests/test_mod_{step}.py -q"
            name, arguments = "run_shell_command", {"command": command}
            run.commands.append(command)
        call = {"id": f"call_{step}", "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}
        fake.script.append(Reply(tool_calls=[call]))
        answer = await post(proxy, "/v1/chat/completions", {"model": "m", "messages": messages, "tools": tools})
        reply = answer["choices"][0]["message"]
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                             "content": output(step, rng)}]
    run.views = [request["messages"] for request in fake.requests]
    run.refused, run.largest = fake.refused, max(fake.prompt_tokens)
    return run


def _command(step: int) -> str:
    """A step that writes a file and says so: ``step-K`` is what the fake's script reads back."""
    return f"printf done > build/out_{step}.txt && echo step-{step}"


async def responses_run(proxy: TestClient[Any, Any], fake: FakeResponses) -> Run:
    run, rng = Run(), random.Random(2)
    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}]
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "You are a coding agent."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Build every target."}]}]
    for _ in range(STEPS):
        answer = await post(proxy, "/v1/responses", {"model": "m", "input": items, "tools": tools, "store": False})
        call = answer["output"][-1]
        step = int(STEP.search(call["arguments"]).group(1))  # type: ignore[union-attr]
        run.commands.append(orjson.loads(call["arguments"])["command"][-1])
        items += [*answer["output"], {"type": "function_call_output", "call_id": call["call_id"],
                                      "output": output(step, rng)}]
    turns = fake.turns()
    run.views = [r.body["input"] for r in turns]
    run.refused, run.largest = sum(r.status != 200 for r in turns), max(r.tokens or 0 for r in turns)
    return run


async def messages_run(proxy: TestClient[Any, Any], fake: FakeMessages) -> Run:
    run, rng = Run(), random.Random(3)
    tools = [{"name": "Bash", "input_schema": {"type": "object", "properties": {}}},
             {"name": "Write", "input_schema": {"type": "object", "properties": {}}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Build every target."}]}]
    for _ in range(STEPS):
        answer = await post(proxy, "/v1/messages", {"model": "m", "max_tokens": 1024, "system": "You code.",
                                                    "messages": messages, "tools": tools})
        use = answer["content"][-1]
        step = int(STEP.search(use["input"]["command"]).group(1))  # type: ignore[union-attr]
        run.commands.append(use["input"]["command"])
        messages += [{"role": "assistant", "content": answer["content"]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                   "content": output(step, rng)}]}]
    turns = fake.turns()
    run.views = [r.body["messages"] for r in turns]
    run.refused, run.largest = sum(r.status != 200 for r in turns), max(r.tokens or 0 for r in turns)
    return run


Driver = Callable[[TestClient[Any, Any], Any], Awaitable[Run]]
DOORS: dict[str, tuple[Callable[[], Any], Driver]] = {
    "chat": (FakeUpstream, chat_run),
    "responses": (lambda: FakeResponses(Script(steps=STEPS + 5, command=_command), window=WINDOW), responses_run),
    "messages": (lambda: FakeMessages(Script(steps=STEPS + 5, command=_command), window=WINDOW), messages_run),
}


async def start(aiohttp_server: Any, aiohttp_client: Any, store_url: str, door: str, style: str,
                **settings: Any) -> tuple[TestClient[Any, Any], Any, Driver]:
    make_fake, drive = DOORS[door]
    fake = make_fake()
    if door == "chat":
        fake.window, fake.summary_mode = WINDOW, style
        # Masking off at the Chat door: its fake counts the prompt as a tokenizer does, and masking alone keeps
        # the run under the threshold (about 7,000 tokens at the 60th step), so no summary would be asked for.
        settings = {**MASKING_OFF, **settings}
    else:
        fake.summary_style = style
    upstream = await aiohttp_server(fake.app())
    root = str(upstream.make_url("")).rstrip("/")
    proxy = await aiohttp_client(create_app(Settings(
        upstream=root + "/v1", anthropic_upstream=root, store=store_url, context_window=WINDOW,
        summary_timeout=2.0, **settings)))
    return proxy, fake, drive


def compactions(metrics: str, outcome: str) -> float:
    return sum(sample.value for family in text_string_to_metric_families(metrics)
               if family.name == "ctxproxy_compactions" for sample in family.samples
               if sample.name.endswith("_total") and sample.labels["outcome"] == outcome)


async def checkpoints(proxy: TestClient[Any, Any]) -> list[Checkpoint]:
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), SESSION))
    return [Checkpoint.from_json(f.extra["checkpoint"]) for f in facts if f.kind == "checkpoint"]


@pytest.mark.parametrize("door", list(DOORS))
@pytest.mark.parametrize("style", MISBEHAVIOURS)
async def test_no_summary_model_kills_a_long_run_or_sends_a_view_over_the_window(
        aiohttp_server: Any, aiohttp_client: Any, tmp_path: Any, door: str, style: str) -> None:
    proxy, fake, drive = await start(aiohttp_server, aiohttp_client, f"sqlite:///{tmp_path}/facts.db", door, style)
    run = await drive(proxy, fake)  # every step asserts its 200

    assert run.refused == 0 and run.largest <= WINDOW, "no upstream request went over the window"
    made = await checkpoints(proxy)
    summaries = [c for c in made if c.summary and not c.elision]
    metrics = await (await proxy.get("/metrics")).text()
    if style in USABLE:
        assert summaries, "an answer in another format is a summary"
        assert compactions(metrics, "fallback") == 0
    else:
        assert any(c.elision for c in made), "the model-free tier stood in"
        assert compactions(metrics, "fallback") >= 1
        assert not summaries


@pytest.mark.parametrize("door", list(DOORS))
async def test_a_lazy_summary_model_leaves_every_file_and_command_of_the_run_in_the_last_view(
        aiohttp_server: Any, aiohttp_client: Any, store_url: str, door: str) -> None:
    proxy, fake, drive = await start(aiohttp_server, aiohttp_client, store_url, door, "lazy")
    run = await drive(proxy, fake)

    assert any(c.retain_start_idx > 10 for c in await checkpoints(proxy)), "the run was compacted"
    last = orjson.dumps(run.views[-1]).decode()
    made = [*run.paths, *run.commands]
    assert len(made) == STEPS
    # The last view went out before the reply that made the run's last call: it can name every call before that.
    shown = [name for name in made if orjson.dumps(name).decode()[1:-1] in last]
    assert len(shown) == STEPS - 1, f"{STEPS - 1 - len(shown)} missing of {STEPS - 1}"
