"""The Gemini dialect's answers to the engine (proxy/dialects/gemini.py), and a Gemini session seen through the
admin API, the inspector and the CLI's rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from proxy.context.items import cut_points
from proxy.context.view.masking import Masker
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import GEMINI
from proxy.dialects.gemini import GeminiRequest
from proxy.settings import Settings
from proxy.summarycall import ClientRequest, summary_request
from tests.fakegemini import SHELL, FakeGemini
from tests.fakescript import Script
from tests.test_gemini import KEY, MODEL, GeminiClient, rig
from tests.test_ui import sign_in

ADMIN = {"Authorization": "Bearer admin-token"}


def call(name: str, call_id: str | None = None, signature: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": name, "args": {"command": "ls"}}}
    if call_id is not None:
        part["functionCall"]["id"] = call_id
    if signature is not None:
        part["thoughtSignature"] = signature
    return part


def response(name: str, call_id: str | None = None, output: str = "out") -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "response": {"output": output}}
    if call_id is not None:
        body["id"] = call_id
    return {"functionResponse": body}


def test_calls_and_responses_pair_by_id_else_by_name_and_order() -> None:
    with_ids = {"role": "model", "parts": [call("a", "1"), call("a", "2")]}
    answered = {"role": "user", "parts": [response("a", "2"), response("a", "1")]}
    assert set(GEMINI.calls(with_ids)) == set(GEMINI.results(answered)) == {"a=1", "a=2"}
    bare = {"role": "model", "parts": [{"text": "Two reads."}, call("read"), call("read"), call("ls")]}
    answers = {"role": "user", "parts": [response("read"), response("read"), response("ls")]}
    assert GEMINI.calls(bare) == GEMINI.results(answers) == ("read#1", "read#2", "ls#1")
    assert GEMINI.call_of(bare, "read#2") == ("read", {"command": "ls"})
    assert (GEMINI.role(bare), GEMINI.role(answers), GEMINI.role({"parts": [{"text": "hi"}]})) == \
        ("assistant", "tool", "user")
    conversation = [{"role": "user", "parts": [{"text": "go"}]}, bare, answers,
                    {"role": "model", "parts": [{"text": "done"}]}, {"role": "user", "parts": [{"text": "again"}]}]
    assert cut_points(GEMINI, conversation) == [0, 1, 3, 4], "never between a call and its response"


def test_identity_sees_through_what_gemini_cli_changes_when_it_keeps_a_reply() -> None:
    streamed = {"role": "model", "parts": [{"text": "Thinking.", "thought": True}, {"text": "Run"},
                                           {"text": "ning. "}, call(SHELL, "c1", "sig")]}
    kept = {"parts": [{"text": "Running."}, {**call(SHELL, f"{SHELL}__c1", "sig")}], "role": "model"}
    assert GEMINI.hash(streamed) == GEMINI.hash(kept)
    assert GEMINI.hash(kept) != GEMINI.hash({**kept, "parts": [{"text": "Running."}, call("other", "c1", "sig")]})


def test_reader_joins_text_chunks_keeps_signed_parts_and_reads_usage() -> None:
    chunks = [{"candidates": [{"content": {"role": "model", "parts": [{"text": "Run"}]}}]},
              {"candidates": [{"content": {"role": "model", "parts": [{"text": "ning."}]}}]},
              {"candidates": [{"content": {"role": "model", "parts": [call(SHELL, None, "sig")]},
                               "finishReason": "STOP"}],
               "usageMetadata": {"promptTokenCount": 120, "cachedContentTokenCount": 100}}]
    items, usage, finished = GEMINI.reply_from_json(chunks)
    assert items == [{"role": "model", "parts": [{"text": "Running."}, call(SHELL, None, "sig")]}]
    assert finished and usage is not None
    assert (GEMINI.prompt_tokens(usage), GEMINI.cached_tokens(usage)) == (120, 100)
    assert GEMINI.reply_calls(items) == ([(f"{SHELL}#1", SHELL, {"command": "ls"})], True)


def test_masking_replaces_the_output_and_keeps_the_response_an_object() -> None:
    item = {"role": "user", "parts": [response(SHELL, "c1", "line\n" * 400)]}
    assert GEMINI.result_paths(item) == [("parts", 0, "functionResponse", "response", "output")]
    messages = [{"role": "model", "parts": [call(SHELL, "c1")]}, item]
    masked = Masker(TokenCounter(), maxsize=10).item(GEMINI, messages, 1, [7, 8], ["k7", "k8"])
    assert masked is not item
    body = masked["parts"][0]["functionResponse"]
    assert body["id"] == "c1" and body["name"] == SHELL
    assert isinstance(body["response"]["output"], str) and "log entry 8" in body["response"]["output"]
    assert GEMINI.results(masked) == GEMINI.results(item)


def test_masking_names_each_output_by_its_own_call_beside_a_response_with_no_text() -> None:
    """An image read answered ``{}`` before a long command output: the masker named the output by the turn's first
    call (the read), as the ids and paths no longer paired one to one."""
    image = {"functionResponse": {"id": "r1", "name": "read_file", "response": {}}}
    item = {"role": "user", "parts": [image, response(SHELL, "c1", "line\n" * 400)]}
    messages = [{"role": "model", "parts": [
        {"functionCall": {"id": "r1", "name": "read_file", "args": {"file_path": "/w/mock.png"}}},
        call(SHELL, "c1")]}, item]
    masked = Masker(TokenCounter(), maxsize=10).item(GEMINI, messages, 1, [7, 8], ["k7", "k8"])
    assert masked["parts"][0] == image
    assert masked["parts"][1]["functionResponse"]["response"]["output"].startswith(
        f'[output of {SHELL} {{"command":"ls"}} elided: 401 lines')


def test_a_function_response_holding_an_error_is_a_failed_call_and_one_holding_output_is_not() -> None:
    """Gemini CLI answers a call that failed with ``{"error": message}`` (its schedulers' ``createErrorResponse``),
    one cancelled after it ran with the ``error`` beside its ``output``, a success with ``{"output": text}``."""
    failed = {"functionResponse": {"id": "c2", "name": "write_file",
                                   "response": {"error": "No space left on device: /w/a.py (ENOSPC)"}}}
    cancelled = {"functionResponse": {"id": "c3", "name": SHELL, "response": {
        "output": "partial", "error": "[Operation Cancelled] User cancelled tool execution."}}}
    item = {"role": "user", "parts": [response(SHELL, "c1"), failed, cancelled]}
    paths = GEMINI.result_paths(item)
    assert [path[-1] for path in paths] == ["output", "error", "error", "output"]
    assert [GEMINI.result_failed(item, path) for path in paths] == [False, True, True, True]
    empty = {"role": "user", "parts": [{"functionResponse": {"name": SHELL, "response": {"output": "", "error": ""}}}]}
    assert [GEMINI.result_failed(empty, path) for path in GEMINI.result_paths(empty)] == [False]


def test_each_function_response_is_one_result_with_its_own_text_or_none() -> None:
    """Gemini CLI answers a tool whose content held no text (``convertToFunctionResponse``) with ``{}``, an image it
    read with ``Binary content provided`` and the image nested (``parts``) or beside it (an ``inlineData`` part), a
    passthrough with its own object; and a call cancelled after it ran with its ``error`` beside its ``output``.
    Each ``functionResponse`` part is one result with its own paths, the error before the output: the results
    after one that states no text keep theirs, where the ids and paths no longer paired one to one."""
    def fr(call_id: str, name: str, body: dict[str, Any], **more: Any) -> dict[str, Any]:
        return {"functionResponse": {"id": call_id, "name": name, "response": body, **more}}

    png = {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}
    item = {"role": "user", "parts": [
        fr("r1", "read_file", {}), png,
        fr("r2", "read_file", {"output": "Binary content provided (1 item(s))."}, parts=[png]),
        fr("r3", "mcp_tool", {"content": [{"type": "text", "text": "hi"}]}),
        fr("r4", SHELL, {"output": "partial", "error": "[Operation Cancelled] User cancelled tool execution."}),
        fr("r5", "write_file", {"error": "No space left on device: /w/a.py (ENOSPC)"}),
        fr("r6", "write_file", {"output": "Successfully overwrote file: /w/b.py."})]}
    answers = GEMINI.answers(item)
    assert [answer.call_id for answer in answers] == list(GEMINI.results(item))
    assert [(answer.call_id, [(path[1], path[-1]) for path in answer.paths]) for answer in answers] == [
        ("read_file=r1", []), ("read_file=r2", [(2, "output")]), ("mcp_tool=r3", []),
        (f"{SHELL}=r4", [(4, "error"), (4, "output")]),
        ("write_file=r5", [(5, "error")]), ("write_file=r6", [(6, "output")])]
    assert GEMINI.result_paths(item) == [path for answer in answers for path in answer.paths]
    assert GEMINI.answers({"role": "model", "parts": [call(SHELL, "c1")]}) == ()


def test_a_summary_call_made_from_a_gemini_request() -> None:
    payload = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "systemInstruction": {"parts": []},
               "tools": [], "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
               "generationConfig": {"temperature": 1, "maxOutputTokens": 100, "responseMimeType": "application/json",
                                    "thinkingConfig": {"thinkingLevel": "HIGH"}}}
    parsed = GeminiRequest(orjson.dumps(payload), payload, payload["contents"], model_name=MODEL,
                           method="streamGenerateContent")
    body = summary_request(GEMINI, ClientRequest(parsed), "gemini-summary", "Summarise.", 4096)
    assert "model" not in body and "toolConfig" not in body
    assert body["generationConfig"] == {"temperature": 1, "maxOutputTokens": 4096,
                                        "thinkingConfig": {"thinkingLevel": "HIGH"}}
    assert body["contents"] == [{"role": "user", "parts": [{"text": "Summarise."}]}]
    settings = Settings(gemini_upstream="http://g.test/", gemini_upstream_key="k")
    url, query = GEMINI.summary_target(settings, "gemini-summary", parsed, {"alt": "sse", "key": "mine", "x": "1"})
    assert (url, dict(query)) == ("http://g.test/v1beta/models/gemini-summary:generateContent", {"x": "1"})


async def test_a_gemini_session_in_the_admin_api_the_inspector_and_a_manual_compaction(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    fake = FakeGemini(Script(steps=4))
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, admin_token="admin-token",
                      min_retain_rounds=1)
    agent = GeminiClient(parts.client, prefix="/s/admin-run", padding=" lorem ipsum" * 200)
    await agent.run("Run the steps. FACT-admin1", 4)
    fake.script = Script(steps=2)
    await agent.run("Once more.", 2)
    sessions = await (await parts.client.get("/admin/sessions", headers=ADMIN)).json()
    (info,) = sessions
    assert info["session"] == "admin-run"
    base = f"/admin/sessions/{info['tenant']}/admin-run"
    log = [orjson.loads(line) for line in (await (await parts.client.get(base + "/log", headers=ADMIN)).read())
           .splitlines()]
    assert {entry["dialect"] for entry in log if entry["kind"] == "message"} == {"gemini"}
    view = await (await parts.client.get(base + "/view", headers=ADMIN)).json()
    assert len(view["messages"]) == len(agent.contents)
    compacted = await parts.client.post(f"{base}/compact?model={MODEL}",
                                        headers={**ADMIN, "X-Upstream-Authorization": KEY})
    result = await compacted.json()
    assert result["outcome"] == "ok", result
    summary = [r for r in fake.requests if r.kind == "summary"][-1]
    assert summary.path == f"/v1beta/models/{MODEL}:generateContent"
    assert summary.headers["x-goog-api-key"] == KEY and "model" not in summary.body
    await sign_in(parts.client, token="admin-token")
    page = await parts.client.get(f"/ui/sessions/{info['tenant']}/admin-run")
    assert page.status == 200
    text = await page.text()
    assert "FACT-admin1" in text and "step-2 lorem" in text and "(empty)" not in text
