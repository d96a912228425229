"""The recall tool: offered only with masked content, answered from the log, never seen by the client."""

from __future__ import annotations

import random
import re
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import create_app
from proxy.http.recall import MAX_ROUNDS, NAME
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script, step_command
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import assistant_from_sse, read_log
from tests.test_compaction_e2e import prose

KEY = "sk-recall"
TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {}}}}]
ENTRY = re.compile(r"log entry (\d+); call ctxproxy_recall with entry \1 to read it again\]")


def agent_history(steps: int = 16) -> list[dict[str, Any]]:
    rng = random.Random(8)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Fix the build."}]
    for n in range(steps):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": "run", "arguments": f'{{"n": {n}}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": f"OUTPUT-{n}\n" + prose(rng, 500)})
    return messages


async def chat(proxy: Any, messages: list[dict[str, Any]], stream: bool = False) -> tuple[Any, dict[str, Any], bytes]:
    body = {"model": "m", "messages": messages, "tools": TOOLS, "stream": stream}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={"Authorization": f"Bearer {KEY}", "X-Session-Id": "recall"})
    raw = await resp.read()
    assert resp.status == 200, raw[:300]
    message = assistant_from_sse(raw) if stream else orjson.loads(raw)["choices"][0]["message"]
    return resp, message, raw


def counter(metrics: str, name: str) -> float:
    return sum(sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples
               if sample.name == name)


def recall_call(entry: Any, call_id: str = "call_r") -> dict[str, Any]:
    arguments = orjson.dumps({"entry": entry}).decode()
    return {"id": call_id, "type": "function", "function": {"name": NAME, "arguments": arguments}}


async def masked_session(proxy: Any, fake: FakeUpstream) -> tuple[list[dict[str, Any]], int, str]:
    """A session whose view masks outputs; the entry of one masked output and that output."""
    messages = agent_history()
    fake.script.append(Reply(content="Looking."))
    _, reply, _ = await chat(proxy, messages)
    first = fake.requests[-1]
    assert [t["function"]["name"] for t in first["tools"]] == ["run", NAME], "offered once outputs are masked"
    entry = int(ENTRY.search(orjson.dumps(first["messages"]).decode()).group(1))  # type: ignore[union-attr]
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "recall"))
    original = next(f.message["content"] for f in facts if f.seq == entry)
    return [*messages, reply, {"role": "user", "content": "What did the first build say?"}], entry, original


@pytest.mark.parametrize("stream", [False, True])
async def test_a_recall_call_is_answered_from_the_log_and_the_client_sees_only_the_final_answer(
        make_proxy: Any, fake: FakeUpstream, stream: bool) -> None:
    # Fields added (the fake is not api.openai.com): a streamed round reports usage only when asked to.
    proxy = await make_proxy(context_window=16_000, recall_tool=True, add_fields="always")
    messages, entry, original = await masked_session(proxy, fake)
    fake.script.extend([Reply(tool_calls=[recall_call(entry)]), Reply(content="The first build printed it.")])
    sent = len(fake.requests)
    _resp, answer, raw = await chat(proxy, messages, stream=stream)

    assert answer == {"role": "assistant", "content": "The first build printed it."}
    assert NAME.encode() not in raw, "the client never sees the recall call"
    rounds = fake.requests[sent:]
    assert len(rounds) == 2, "one recall round, then the answer, in the same client request"
    assert rounds[1]["messages"][:-2] == rounds[0]["messages"]
    call, result = rounds[1]["messages"][-2:]
    assert call["tool_calls"][0]["function"]["name"] == NAME
    assert result == {"role": "tool", "tool_call_id": "call_r", "content": original}
    assert original.startswith("OUTPUT-")
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "recall"))
    logged = [f.message for f in facts if f.kind == "message"]
    assert logged[-1] == answer and not any(NAME in orjson.dumps(m).decode() for m in logged), "not logged"
    metrics = await (await proxy.get("/metrics")).text()
    reported = sum(fake.count(r) for r in fake.requests)  # the fake's usage: the tokenizer's count of each prompt
    assert counter(metrics, "ctxproxy_upstream_prompt_tokens_total") == reported, "the recall round counts too"


async def test_bad_entries_get_an_explanation_and_rounds_are_bounded(make_proxy: Any, fake: FakeUpstream) -> None:
    proxy = await make_proxy(context_window=16_000, recall_tool=True)
    messages, _, _ = await masked_session(proxy, fake)
    asks = [recall_call("seven", "c1"), recall_call(10**9, "c2"), recall_call(0, "c3"), recall_call(2**63 + 1, "c4"),
            recall_call(-1, "c5"), recall_call(2, "c6")]
    fake.script.extend(Reply(tool_calls=[ask]) for ask in asks)
    sent = len(fake.requests)
    _, answer, _ = await chat(proxy, messages)

    rounds = fake.requests[sent:]
    assert len(rounds) == MAX_ROUNDS + 1
    results = [r["messages"][-1]["content"] for r in rounds[1:]]
    assert results[0] == f"{NAME} needs an integer 'entry', the log entry a placeholder names."
    assert results[1] == f"Log entry {10**9} holds no tool output of this conversation."
    assert results[2] == "Log entry 0 holds no tool output of this conversation.", "the system prompt is no output"
    assert results[3] == f"Log entry {2**63 + 1} holds no tool output of this conversation.", "past what a log holds"
    assert results[4] == f"{NAME} needs an integer 'entry', the log entry a placeholder names."
    assert [t["function"]["name"] for t in rounds[-1]["tools"]] == ["run"], "after five rounds it is not offered"
    assert answer["tool_calls"][0]["id"] == "c6", "the sixth call goes to the client as the model wrote it"


async def test_a_recall_call_beside_text_or_another_call_is_the_clients(make_proxy: Any, fake: FakeUpstream) -> None:
    proxy = await make_proxy(context_window=16_000, recall_tool=True)
    messages, entry, _ = await masked_session(proxy, fake)
    other = {"id": "c2", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    for reply in (Reply(content="Let me look.", tool_calls=[recall_call(entry)]),
                  Reply(tool_calls=[recall_call(entry), other])):
        fake.script.append(reply)
        sent = len(fake.requests)
        for stream in (False, True):
            if stream:
                fake.script.append(reply)
            _, answer, _ = await chat(proxy, messages, stream=stream)
            assert answer["tool_calls"][0]["function"]["name"] == NAME
        assert len(fake.requests) == sent + 2, "relayed, not answered"


async def test_no_recall_tool_without_the_flag_or_without_masked_content(make_proxy: Any, fake: FakeUpstream) -> None:
    proxy = await make_proxy(context_window=16_000, recall_tool=True)
    fake.script.append(Reply(content="ok"))
    await chat(proxy, agent_history(3))
    assert [t["function"]["name"] for t in fake.requests[-1]["tools"]] == ["run"], "nothing masked yet"
    plain = await make_proxy(context_window=16_000)
    fake.script.append(Reply(content="ok"))
    await chat(plain, agent_history())
    assert [t["function"]["name"] for t in fake.requests[-1]["tools"]] == ["run"]
    assert "re-run the tool if you need it again]" in orjson.dumps(fake.requests[-1]["messages"]).decode()


class RecallingResponses(FakeResponses):
    """Codex's fake, which answers a turn with reasoning and a call to the recall tool while told to: one turn for
    each entry in ``recall``."""

    recall: list[int]

    def _turn_output(self, body: dict[str, Any], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not getattr(self, "recall", None):
            return super()._turn_output(body, items)
        entry = self.recall.pop(0)
        assert NAME in [t["name"] for t in body["tools"]]
        return [self._reasoning("I need that output again."),
                {"type": "function_call", "id": "fc_r", "call_id": "call_r", "status": "completed", "name": NAME,
                 "arguments": orjson.dumps({"entry": entry}).decode()}]


class RecallingMessages(FakeMessages):
    """Claude Code's fake, which answers one turn with signed thinking and a recall ``tool_use`` when told to."""

    recall: int | None = None

    def _turn_output(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
        if self.recall is None:
            return super()._turn_output(body, messages)
        entry, self.recall = self.recall, None
        assert NAME in [t["name"] for t in body["tools"]]
        return [self._thinking("I need that output again.", True),
                {"type": "tool_use", "id": "toolu_r", "name": NAME, "input": {"entry": entry}}], "tool_use"


def codex_history(steps: int) -> list[dict[str, Any]]:
    rng = random.Random(2)
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Go."}]
    for k in range(1, steps + 1):
        arguments = orjson.dumps({"command": ["bash", "-lc", step_command(k)]}).decode()
        items += [{"type": "function_call", "call_id": f"c{k}", "name": "shell", "arguments": arguments},
                  {"type": "function_call_output", "call_id": f"c{k}", "output": f"step-{k}\n" + prose(rng, 500)}]
    return items


def claude_history(steps: int) -> list[dict[str, Any]]:
    rng = random.Random(3)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Go."}]
    for k in range(1, steps + 1):
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{k}", "name": "Bash",
                                                        "input": {"command": step_command(k)}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{k}",
                                                   "content": f"step-{k}\n" + prose(rng, 500)}]}]
    return messages


@pytest.mark.parametrize("api", ["responses", "messages"])
@pytest.mark.parametrize("stream", [False, True])
async def test_recall_through_the_responses_and_messages_doors(aiohttp_server: Any, aiohttp_client: Any,
                                                               store_url: str, api: str, stream: bool) -> None:
    fake: RecallingResponses | RecallingMessages = (RecallingResponses(Script(steps=40)) if api == "responses"
                                                    else RecallingMessages(Script(steps=40)))
    upstream = await aiohttp_server(fake.app())
    root = str(upstream.make_url("")).rstrip("/")
    proxy = await aiohttp_client(create_app(Settings(upstream=root + "/v1", anthropic_upstream=root, store=store_url,
                                                     context_window=16_000, recall_tool=True)))
    if api == "responses":
        path, field = "/v1/responses", "input"
        body: dict[str, Any] = {"model": "m", "input": codex_history(16), "store": False,
                                "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]}
    else:
        path, field = "/v1/messages", "messages"
        body = {"model": "m", "max_tokens": 512, "messages": claude_history(16),
                "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}
    headers = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY, "X-Session-Id": "doors"}
    assert (await proxy.post(path, json=body, headers=headers)).status == 200
    first = fake.turns()[-1].body
    entry = int(ENTRY.search(orjson.dumps(first[field]).decode()).group(1))  # type: ignore[union-attr]
    fake.recall = [entry] if isinstance(fake, RecallingResponses) else entry
    resp = await proxy.post(path, json={**body, "stream": stream}, headers=headers)
    raw = await resp.read()

    assert resp.status == 200 and NAME.encode() not in raw, "the client never sees the recall call"
    asked, answered = fake.turns()[-2:]
    assert [t.status for t in fake.turns()] == [200, 200, 200], "the API accepted the recall exchange"
    sent = answered.body[field]
    assert sent[: len(asked.body[field])] == asked.body[field]
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "doors"))
    original = next(f for f in facts if f.seq == entry).message
    assert original is not None
    text = orjson.dumps(sent[-1]).decode()
    assert orjson.dumps(original).decode().split("step-")[1][:200] in text, "answered with the logged output"




async def responses_proxy(aiohttp_server: Any, aiohttp_client: Any, store_url: str,
                          fake: RecallingResponses, **overrides: Any) -> Any:
    upstream = await aiohttp_server(fake.app())
    return await aiohttp_client(create_app(Settings(upstream=str(upstream.make_url("/v1")), store=store_url,
                                                    context_window=16_000, recall_tool=True, **overrides)))


def big_output_session() -> tuple[dict[str, Any], str]:
    """A Codex request whose first output, about 5,000 tokens (over a quarter of 16k), a 16k view masks."""
    items = codex_history(16)
    items[2]["output"] = "step-1\n" + prose(random.Random(9), 5000)
    return {"model": "m", "input": items, "store": False,
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]}, items[2]["output"]


async def masked_entry(proxy: Any, fake: RecallingResponses, body: dict[str, Any], headers: dict[str, str]) -> int:
    assert (await proxy.post("/v1/responses", json=body, headers=headers)).status == 200
    return int(ENTRY.search(orjson.dumps(fake.turns()[-1].body["input"]).decode()).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True])
async def test_recalls_get_the_room_left_in_the_window_and_never_send_a_view_over_it(
        aiohttp_server: Any, aiohttp_client: Any, store_url: str, stream: bool) -> None:
    fake = RecallingResponses(Script(steps=40), window=16_000)  # refuses what it counts over 16,000 tokens
    # Kept outputs by count only: the other outputs stay whole, so the question brings the view near its limit.
    proxy = await responses_proxy(aiohttp_server, aiohttp_client, store_url, fake, keep_tool_output_share=1.0)
    body, original = big_output_session()
    headers = {"Authorization": f"Bearer {KEY}", "X-Session-Id": f"tight-{stream}"}
    entry = await masked_entry(proxy, fake, body, headers)
    assert original[7:200] not in orjson.dumps(fake.turns()[-1].body["input"]).decode(), "masked"
    # A long question brings the view near its limit (12,800 of 16,000); the model recalls the big output twice.
    question = {"type": "message", "role": "user",
                "content": "Compare the first step with this log. " + prose(random.Random(4), 5500)}
    fake.recall = [entry, entry]
    sent = len(fake.turns())
    resp = await proxy.post("/v1/responses", json={**body, "input": [*body["input"], question], "stream": stream},
                            headers=headers)

    rounds = fake.turns()[sent:]
    assert all(r.tokens is not None and r.tokens <= 16_000 for r in rounds), [r.tokens for r in rounds]
    assert [r.status for r in rounds] == [200, 200, 200], "two recall rounds, then the answer: none refused"
    assert resp.status == 200, await resp.text()
    clipped, refused = (r.body["input"][-1]["output"] for r in rounds[1:])
    assert clipped.startswith("step-1\n") and clipped.endswith(original[-50:]), "head and tail kept"
    assert f"full text in the fact log, log entry {entry}" in clipped and len(clipped) < len(original) // 4
    assert refused == (f"The output is in the log at entry {entry}, but it is too large for the room left in this "
                       "context window; answer with what you have, or ask the user.")
    assert int(resp.headers["X-Ctxproxy-View-Tokens"]) <= 12_800, "the last round's view, re-estimated, is in bounds"


async def test_a_roomy_view_gets_a_recalled_output_whole(aiohttp_server: Any, aiohttp_client: Any,
                                                         store_url: str) -> None:
    fake = RecallingResponses(Script(steps=40), window=16_000)
    proxy = await responses_proxy(aiohttp_server, aiohttp_client, store_url, fake)
    body, original = big_output_session()
    headers = {"Authorization": f"Bearer {KEY}", "X-Session-Id": "roomy"}
    fake.recall = [await masked_entry(proxy, fake, body, headers)]
    assert (await proxy.post("/v1/responses", json=body, headers=headers)).status == 200
    assert fake.turns()[-1].body["input"][-1] == {"type": "function_call_output", "call_id": "call_r",
                                                 "output": original}, "over a quarter of the window, but it fits"


async def test_recall_reads_only_outputs_the_requests_own_view_masked(make_proxy: Any, fake: FakeUpstream) -> None:
    """Entries named by number: an output the view shows whole, one of another lineage of the session (masked in
    that lineage's view), the checkpoint's entry, and one only another credential's linked history holds are all
    "no tool output of this conversation", without the log being read; an output masked in the own view is read."""
    proxy = await make_proxy(context_window=16_000, recall_tool=True)
    key = SessionKey(tenant_of(KEY), "recall")
    messages, entry, original = await masked_session(proxy, fake)
    history = messages[:-1]  # what the log holds: the conversation and the reply
    # Another credential proves the session and adds a step of its own (an output this conversation never held).
    other = {"role": "tool", "tool_call_id": "call_b", "content": "B-ONLY\n" + prose(random.Random(5), 500)}
    fake.script.append(Reply(content="Done."))
    resp = await proxy.post("/v1/chat/completions", json={"model": "m", "tools": TOOLS, "messages": [
        *history, {"role": "user", "content": "Run it once more."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_b", "type": "function", "function": {"name": "run", "arguments": "{}"}}]}, other]},
        headers={"Authorization": "Bearer sk-recall-other", "X-Session-Id": "recall"})
    assert resp.status == 200
    # The same credential, another conversation under the session id: its view masks outputs of its own.
    fake.script.append(Reply(content="Looking."))
    # Ten steps longer: past the trigger, so that its view masks mid-burst (proxy.context.view.worth).
    await chat(proxy, [history[0], {"role": "user", "content": "Fix the tests."}, *agent_history(26)[2:]])
    found = ENTRY.search(orjson.dumps(fake.requests[-1]["messages"]).decode())
    assert found is not None, "that view masks too"
    elsewhere = int(found.group(1))
    facts = await read_log(proxy.app[store_key], key)
    linked = next(f.seq for f in facts if f.kind == "message" and f.message == other)
    whole = next(f.seq for f in facts if f.kind == "message" and f.message == history[-2])  # the newest output
    checkpoint = next(f.seq for f in facts if f.kind == "checkpoint")
    assert len({entry, elsewhere, linked, whole, checkpoint}) == 5

    fake.script.extend([*(Reply(tool_calls=[recall_call(n, f"c{n}")]) for n in (whole, elsewhere, checkpoint,
                                                                                linked, entry)),
                        Reply(content="The first build printed it.")])
    sent = len(fake.requests)
    _, answer, _ = await chat(proxy, messages)
    results = [r["messages"][-1]["content"] for r in fake.requests[sent + 1:]]
    assert results == [*(f"Log entry {n} holds no tool output of this conversation."
                         for n in (whole, elsewhere, checkpoint, linked)), original]
    assert answer["content"] == "The first build printed it."


async def test_an_output_the_own_view_clipped_is_read_back(aiohttp_server: Any, aiohttp_client: Any,
                                                          store_url: str) -> None:
    """An output too big for the window even after masking is clipped in the view, its marker naming its entry:
    that entry is the request's own and hidden from it, so a recall of it is served."""
    fake = RecallingResponses(Script(steps=40))
    proxy = await responses_proxy(aiohttp_server, aiohttp_client, store_url, fake)
    body, _ = big_output_session()
    huge = "step-16\n" + prose(random.Random(6), 20_000)
    body["input"][-1] = {**body["input"][-1], "output": huge}
    headers = {"Authorization": f"Bearer {KEY}", "X-Session-Id": "clipped"}
    assert (await proxy.post("/v1/responses", json=body, headers=headers)).status == 200  # logs the huge output
    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), "clipped"))
    seq = next(f.seq for f in facts if f.kind == "message" and f.message == body["input"][-1])
    fake.recall = [seq]
    assert (await proxy.post("/v1/responses", json=body, headers=headers)).status == 200
    asked, answered = fake.turns()[-2:]
    assert f"full text in the fact log, entry seq {seq}" in orjson.dumps(asked.body["input"]).decode(), "clipped"
    recalled = answered.body["input"][-1]["output"]
    assert recalled != f"Log entry {seq} holds no tool output of this conversation."
    assert recalled.startswith("step-16\n") or f"at entry {seq}, but it is too large" in recalled
