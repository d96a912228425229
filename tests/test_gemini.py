"""The Gemini API front door against the fake Gemini upstream (tests/fakegemini.py): turns streamed as SSE and as
a JSON array, ``:generateContent``, ``:countTokens`` over the view, the upstream's key, pass-through, the metrics,
the too-long refusal rescued with the current turn's signatures intact, and malformed requests answered in
Gemini's error shape.

``GeminiClient`` plays the part of Gemini CLI: it keeps what the stream said as the CLI keeps it (thought parts
dropped, text joined, call ids renamed ``{name}__{id}``), runs each ``run_shell_command`` call at once (its
output names the step) and sends the whole history back each turn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.constants import HEADER_COMPACTED, HEADER_SESSION, HEADER_VIEW_TOKENS
from proxy.context.keep.workingset import WORKING_SET_HEADING
from proxy.http.recall import NAME as RECALL
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import FactLog, SessionKey
from tests.fakegemini import SHELL, SKIP_SIGNATURE, FakeGemini, kept_reply, parts_of
from tests.fakescript import STEP, Script, final_text, parse_sse
from tests.proxyfixtures import MASKING_OFF, read_log, replay
from tests.test_artifacts import (
    BYE,
    CANCELLED,
    NO_SPACE,
    OUTSIDE,
    gemini_failures,
    gemini_idless_run,
    gemini_turn_with_an_image_read,
)

KEY = "gemini-test-key"
MODEL = "gemini-test"
TOOLS = [{"functionDeclarations": [{"name": SHELL, "description": "Runs a shell command.",
                                    "parametersJsonSchema": {"type": "object",
                                                             "properties": {"command": {"type": "string"}}}}]}]
SYSTEM = {"parts": [{"text": "You are an interactive CLI agent."}]}
STREAM = f"/v1beta/models/{MODEL}:streamGenerateContent"


@dataclass
class Rig:
    fake: FakeGemini
    client: TestClient[Any, Any]
    store: FactLog


async def rig(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path, fake: FakeGemini, **settings: Any) -> Rig:
    """The proxy over ``fake``, on a SQLite file in ``tmp_path`` unless ``settings`` name a ``store``."""
    upstream: TestServer = await aiohttp_server(fake.app())
    app = create_app(Settings(gemini_upstream=str(upstream.make_url("")).rstrip("/"),
                              **{"store": f"sqlite:///{tmp_path}/facts.db", "precompact_threshold": 1.0, **settings}))
    client: TestClient[Any, Any] = await aiohttp_client(app)
    return Rig(fake, client, app[store_key])


def chunks_of(raw: bytes, sse: bool) -> list[dict[str, Any]]:
    return parse_sse(raw) if sse else list(orjson.loads(raw))


def kept(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The model entry Gemini CLI keeps, with the call ids renamed as it renames them when it manages context."""
    entry = kept_reply(chunks)
    for part in entry["parts"]:
        call = part.get("functionCall")
        if call is not None and call.get("id"):
            part["functionCall"] = {**call, "id": f"{call['name']}__{call['id']}"}
    return entry


@dataclass
class GeminiClient:
    client: TestClient[Any, Any]
    prefix: str = ""
    sse: bool = True
    #: Added to each tool output, to make the run grow faster.
    padding: str = ""
    contents: list[dict[str, Any]] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)
    model: str = MODEL

    async def turn(self) -> Any:
        query = "?alt=sse" if self.sse else ""
        resp = await self.client.post(f"{self.prefix}/v1beta/models/{self.model}:streamGenerateContent{query}",
                                      headers={"x-goog-api-key": KEY},
                                      json={"contents": self.contents, "systemInstruction": SYSTEM, "tools": TOOLS,
                                            "generationConfig": {"temperature": 0}})
        assert resp.status == 200, await resp.text()
        self.answers.append(resp)
        self.contents.append(kept(chunks_of(await resp.read(), self.sse)))
        return resp

    async def run(self, prompt: str, steps: int) -> str:
        """``steps`` tool rounds and the final answer; the final text."""
        self.contents.append({"role": "user", "parts": [{"text": prompt}]})
        for _ in range(steps + 1):
            await self.turn()
            calls = [p["functionCall"] for p in self.contents[-1]["parts"] if "functionCall" in p]
            if not calls:
                break
            output = f"Output: step-{STEP.search(calls[0]['args']['command'])[1]}{self.padding}"  # type: ignore[index]
            self.contents.append({"role": "user", "parts": [{"functionResponse": {
                "id": calls[0].get("id"), "name": calls[0]["name"], "response": {"output": output}}}]})
        return "".join(p.get("text", "") for p in self.contents[-1]["parts"])


async def log_of(store: FactLog, session: str) -> list[Any]:
    return await read_log(store, SessionKey(tenant_of(KEY), session))


@pytest.mark.parametrize("sse", [True, False], ids=["sse", "json-array"])
async def test_a_streamed_run_is_relayed_unchanged_and_logged(aiohttp_server, aiohttp_client, tmp_path: Path,
                                                              sse: bool) -> None:
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeGemini(Script(steps=3)))
    agent = GeminiClient(parts.client, sse=sse)
    assert await agent.run("Run the steps.", 3) == final_text(3)

    turns = parts.fake.turns()
    assert [(t.path, t.query) for t in turns] == [(STREAM, {"alt": "sse"} if sse else {})] * 4
    assert {t.headers["x-goog-api-key"] for t in turns} == {KEY}
    session = agent.answers[0].headers[HEADER_SESSION]
    assert {r.headers[HEADER_SESSION] for r in agent.answers} == {session}
    facts = await log_of(parts.store, session)
    assert {f.to_json()["dialect"] for f in facts if f.kind == "message"} == {"gemini"}
    assert not [f for f in facts if f.kind == "rewind"], "the CLI's way of keeping a reply is no edit"
    logged = replay(facts)
    assert len(logged) == len(agent.contents)
    signed = [p for m in logged for p in parts_of(m) if "functionCall" in p]
    assert len(signed) == 3 and all(p["thoughtSignature"] for p in signed)


async def test_generate_content_and_count_tokens(aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeGemini(Script(steps=0)))
    body = {"contents": [{"role": "user", "parts": [{"text": "Say done."}]}], "systemInstruction": SYSTEM}
    resp = await parts.client.post(f"/s/run-1/v1beta/models/{MODEL}:generateContent",
                                   headers={"x-goog-api-key": KEY}, json=body)
    assert resp.status == 200
    answer = await resp.json()
    assert answer["candidates"][0]["content"]["parts"][0]["text"] == final_text(0)
    assert resp.headers[HEADER_SESSION] == "run-1"
    facts = await log_of(parts.store, "run-1")
    assert [f.message["role"] for f in facts if f.kind == "message"] == ["user", "model"]

    counted = await parts.client.post(f"/s/run-1/v1beta/models/{MODEL}:countTokens",
                                      headers={"x-goog-api-key": KEY}, json=body)
    assert counted.status == 200
    assert (await counted.json())["totalTokens"] > 0
    assert [r.kind for r in parts.fake.requests] == ["turn"], "counted by the proxy, not the upstream"
    other_form = await parts.client.post(f"/s/run-1/v1beta/models/{MODEL}:countTokens", headers={"x-goog-api-key": KEY},
                                         json={"generateContentRequest": {"model": f"models/{MODEL}", **body}})
    assert other_form.status == 200 and parts.fake.requests[-1].kind == "count_tokens"
    metrics = await (await parts.client.get("/metrics")).text()
    assert 'ctxproxy_requests_total{route="gemini",status="200"} 2.0' in metrics


async def test_the_proxy_key_replaces_the_clients_and_other_paths_pass_through(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeGemini(Script(steps=0)),
                      gemini_upstream_key="server-side-key")
    body = {"contents": [{"role": "user", "parts": [{"text": "Say done."}]}]}
    resp = await parts.client.post(f"/v1beta/models/{MODEL}:generateContent?key={KEY}&x=1",
                                   headers={"Authorization": f"Bearer {KEY}"}, json=body)
    assert resp.status == 200
    other = await parts.client.get("/v1beta/cachedContents?pageSize=2&key=mine", headers={"x-goog-api-key": KEY})
    assert other.status == 404
    assert (await other.json())["error"]["status"] == "NOT_FOUND"
    embed = await parts.client.post("/s/e/v1alpha/models/gemini-embedding-001:batchEmbedContents",
                                    headers={"x-goog-api-key": KEY}, json={"requests": []})
    assert embed.status == 404 and embed.headers[HEADER_SESSION] == "e"
    turn, passed, embedded = parts.fake.requests
    for recorded in (turn, passed, embedded):
        assert recorded.headers["x-goog-api-key"] == "server-side-key"
        assert "Authorization" not in recorded.headers and "key" not in recorded.query
    assert (turn.query, passed.path, passed.query) == ({"x": "1"}, "/v1beta/cachedContents", {"pageSize": "2"})
    assert (embedded.kind, embedded.path) == ("other", "/v1alpha/models/gemini-embedding-001:batchEmbedContents")
    assert orjson.loads(embedded.body) == {"requests": []}


def long_history(rounds: int) -> list[dict[str, Any]]:
    """A Gemini CLI history: a user prompt, then ``rounds`` signed calls, each answered by a long output."""
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "Run the steps."}]}]
    for n in range(1, rounds + 1):
        call = {"name": SHELL, "args": {"command": f"echo step-{n}"}}
        contents += [{"role": "model", "parts": [{"functionCall": call, "thoughtSignature": SKIP_SIGNATURE}]},
                     {"role": "user", "parts": [{"functionResponse": {"name": SHELL, "response": {
                         "output": f"step-{n} " + "lorem ipsum " * 150}}}]}]
    return contents


async def test_a_too_long_refusal_is_rescued_and_the_current_turn_goes_byte_identical(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    fake = FakeGemini(Script(steps=30), window=3_000, call_ids=False)
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=12_000, min_retain_rounds=1,
                      keep_tool_outputs=100)
    contents = long_history(12)
    resp = await parts.client.post(STREAM + "?alt=sse", headers={"x-goog-api-key": KEY},
                                   json={"contents": contents, "tools": TOOLS})
    assert resp.status == 200, await resp.text()
    assert resp.headers[HEADER_COMPACTED] == "reactive"
    refused, accepted = fake.turns()[0], fake.turns()[-1]
    assert refused.status == 400 and accepted.status == 200 and accepted.tokens is not None
    assert accepted.tokens <= 3_000
    sent = accepted.body["contents"]
    assert [orjson.dumps(c) for c in sent[-2:]] == [orjson.dumps(c) for c in contents[-2:]]
    assert kept(parse_sse(await resp.read()))["parts"][-1]["functionCall"]["args"]["command"] == "echo step-13"



async def test_the_estimate_counts_the_system_instruction_the_tools_and_the_tool_config(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """Issue 35: what the proxy estimates a Gemini request at is what the upstream counts, all its prompt fields
    included: a system instruction of about 5,000 tokens left out put the estimate 5,000 low, so the proactive
    trigger fired late."""
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeGemini(Script(steps=0)))
    system = {"parts": [{"text": " ".join(f"Rule {n}: keep the build green." for n in range(700))}]}
    body = {"contents": [{"role": "user", "parts": [{"text": "Say done."}]}], "systemInstruction": system,
            "tools": TOOLS, "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}}}
    resp = await parts.client.post(f"/v1beta/models/{MODEL}:generateContent", headers={"x-goog-api-key": KEY},
                                   json=body)
    assert resp.status == 200
    counted = parts.fake.turns()[0].tokens
    assert counted is not None and counted > 5_000
    assert abs(int(resp.headers[HEADER_VIEW_TOKENS]) - counted) < counted * 0.05



async def test_a_compacted_run_of_calls_without_ids_names_every_command_path_and_exit_status(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """Issue 35: the Gemini API returns calls without an ``id``, keyed ``name#k`` in every turn; the trail of a
    compaction kept one command and one file per tool name. Now the view names every command with its own exit
    status and every path: in the trail for the rounds summarised, verbatim for the rounds kept."""
    # Masking off: with the kept outputs a fifth of the room, masking alone would bring this view under the trigger,
    # and the trail of a summary is the point here.
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeGemini(Script(steps=0)), context_window=6_000,
                      min_retain_rounds=1, **MASKING_OFF)
    rounds = 12
    contents = [*gemini_idless_run(rounds, "\n" + "lorem ipsum " * 100),
                {"role": "user", "parts": [{"text": "Say what you built."}]}]
    resp = await parts.client.post(STREAM + "?alt=sse", headers={"x-goog-api-key": KEY},
                                   json={"contents": contents, "systemInstruction": SYSTEM, "tools": TOOLS})
    assert resp.status == 200, await resp.text()
    assert resp.headers[HEADER_COMPACTED] == "proactive"
    sent = parts.fake.turns()[-1].body["contents"]
    summary = sent[0]["parts"][0]["text"]
    kept = orjson.dumps(sent[1:]).decode()
    trailed = 0
    for k in range(rounds):
        line = f"- $ make t{k} — exit {k % 3} ("
        assert line in summary or (f"Exit Code: {k % 3}" in kept and f"make t{k}" in kept), k
        assert f"- src/f{k}.py — written (" in summary or f"src/f{k}.py" in kept, k
        trailed += line in summary
    assert trailed >= rounds // 2, summary


async def compacted_summary(aiohttp_server, aiohttp_client, tmp_path: Path, contents: list[dict[str, Any]]) -> str:
    """The summary text of the view the door sends for ``contents``, followed by three long rounds and a question
    in a 6k window (masking off): everything before the rounds is compacted."""
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeGemini(Script(steps=0)), context_window=6_000,
                      min_retain_rounds=1, **MASKING_OFF)
    contents = [*contents, *gemini_idless_run(3, "\n" + "lorem ipsum " * 400)[1:],
                {"role": "user", "parts": [{"text": "Say what you built."}]}]
    resp = await parts.client.post(STREAM + "?alt=sse", headers={"x-goog-api-key": KEY},
                                   json={"contents": contents, "systemInstruction": SYSTEM, "tools": TOOLS})
    assert resp.status == 200, await resp.text()
    assert resp.headers[HEADER_COMPACTED] == "proactive"
    return str(parts.fake.turns()[-1].body["contents"][0]["parts"][0]["text"])


async def test_a_call_gemini_cli_answered_with_an_error_is_a_failure_in_the_compacted_view(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """Gemini CLI answers a failed call with ``{"error": message}``: through the door, a compacted ``write_file``
    that failed so is no longer a file in hand (its text is not known), nor a write in the trail, and its error
    line stays with its call; a command answered so ends in that error, one the user did not allow is refused."""
    app = "print('hello')\n"
    failures = gemini_failures()
    contents = [failures[0],
                {"role": "model", "parts": [{"functionCall": {"id": "r1", "name": "read_file",
                                                              "args": {"file_path": "/w/app.py"}}}]},
                {"role": "user", "parts": [{"functionResponse": {"id": "r1", "name": "read_file",
                                                                 "response": {"output": app}}}]},
                *failures[1:],
                {"role": "model", "parts": [{"functionCall": {"id": "d1", "name": "run_shell_command",
                                                              "args": {"command": "rm -rf build"}}}]},
                {"role": "user", "parts": [{"functionResponse": {"id": "d1", "name": "run_shell_command", "response": {
                    "error": "[Operation Cancelled] Reason: User denied execution."}}}]}]
    summary = await compacted_summary(aiohttp_server, aiohttp_client, tmp_path, contents)
    files = summary[summary.index(WORKING_SET_HEADING):]
    assert "### /w/ok.py (" in files and "/w/app.py" not in files and BYE not in files, "a failed write was taken"
    assert "- /w/ok.py — written" in summary and "- /w/app.py — written" not in summary
    assert f"- $ ls — error: {OUTSIDE[:40]}" in summary
    assert f"- {NO_SPACE}\n  (from write_file " in summary
    assert "- $ rm -rf build — refused: [Operation Cancelled] Reason: User denied execution. (" in summary


async def test_results_beside_an_image_read_answered_with_no_text_keep_their_own_through_the_door(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """Gemini CLI answers an image read with ``{}`` and the image beside it: through the door, the failed write,
    the cancelled build and the successful write of the same turn each keep their own result in the compacted
    view, where all three read as answered with nothing stated (the failed write listed as written)."""
    summary = await compacted_summary(aiohttp_server, aiohttp_client, tmp_path, gemini_turn_with_an_image_read())
    assert "- /w/ok.py — written" in summary and "- /w/app.py — written" not in summary
    assert f"- $ npm run build — error: {CANCELLED} (" in summary
    assert f"- {NO_SPACE}\n  (from write_file " in summary and BYE not in summary[summary.index(WORKING_SET_HEADING):]


MALFORMED = [
    (b"{not json", 400), (b"[1, 2]", 400), (b"{}", 400), (b'{"contents": []}', 400),
    (b'{"contents": ["text"]}', 400), (b'{"contents": [{"role": "user"}]}', 400),
    (b'{"contents": [{"role": 7, "parts": []}]}', 400), (b"[" * 300 + b"]" * 300, 400),
]


@pytest.mark.parametrize(("body", "status"), MALFORMED)
async def test_malformed_requests_get_a_gemini_shaped_4xx(aiohttp_server, aiohttp_client, tmp_path: Path,
                                                          body: bytes, status: int) -> None:
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeGemini())
    for path in (STREAM + "?alt=sse", f"/s/x/v1beta/models/{MODEL}:countTokens"):
        resp = await parts.client.post(path, data=body, headers={"x-goog-api-key": KEY,
                                                                 "Content-Type": "application/json"})
        assert resp.status == status
        error = (await resp.json())["error"]
        assert set(error) == {"code", "message", "status"} and error["code"] == status
        assert error["status"] == "INVALID_ARGUMENT" and error["message"]
    assert parts.fake.requests == []


async def test_every_error_the_proxy_raises_on_the_gemini_paths_has_gemini_shape(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeGemini(), client_keys=(KEY,),
                      max_body_bytes=2048)
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    cases = [
        (parts.client.post(STREAM, json=body, headers={"x-goog-api-key": "wrong"}), 401, "UNAUTHENTICATED"),
        (parts.client.post(f"/v1beta/models/{MODEL}:generateContent", headers={"x-goog-api-key": KEY},
                           json={"contents": [{"parts": [{"text": "x" * 4096}]}]}), 413, "INVALID_ARGUMENT"),
        (parts.client.post("/v1beta/models/bad%20name:generateContent", json=body, headers={"x-goog-api-key": KEY}),
         400, "INVALID_ARGUMENT"),
        (parts.client.post("/s/bad session!/v1beta/models/m:generateContent", json=body,
                           headers={"x-goog-api-key": KEY}), 400, "INVALID_ARGUMENT"),
    ]
    for request, status, name in cases:
        resp = await request
        assert resp.status == status, await resp.text()
        assert (await resp.json())["error"] == {"code": status, "message": (await resp.json())["error"]["message"],
                                                "status": name}
    openai = await parts.client.post("/v1/chat/completions", data=b"{", headers={"Authorization": f"Bearer {KEY}"})
    assert set((await openai.json())["error"]) == {"message", "type", "param", "code"}, "other doors keep theirs"


async def test_an_unreachable_upstream_is_a_gemini_shaped_502(aiohttp_client, tmp_path: Path) -> None:
    app = create_app(Settings(gemini_upstream="http://127.0.0.1:9", store=f"sqlite:///{tmp_path}/facts.db"))
    client: TestClient[Any, Any] = await aiohttp_client(app)
    resp = await client.post(STREAM + "?alt=sse", headers={"x-goog-api-key": KEY},
                             json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    assert resp.status == 502
    assert (await resp.json())["error"]["status"] == "UNAVAILABLE"


WRONG_TYPES = [
    {"contents": [{"role": "user", "parts": ["text", 3, None]}]},
    {"contents": [{"role": "model", "parts": [{"functionCall": "ls"}, {"functionCall": {"name": 3, "id": 4}}]},
                  {"role": "user", "parts": [{"functionResponse": {"name": None, "response": [1]}}]}]},
    {"contents": [{"parts": [{"text": 5, "thought": "yes", "thoughtSignature": 7}]}]},
    {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": "fast", "tools": "all",
     "systemInstruction": 12},
    {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": "many"},
     "tools": [{"functionDeclarations": "none"}, 3]},
    {"contents": [{"role": "tool", "parts": [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]}]},
]


@pytest.mark.parametrize("body", WRONG_TYPES)
async def test_well_formed_json_with_wrong_types_never_gets_a_proxy_500(aiohttp_server, aiohttp_client,
                                                                       tmp_path: Path, body: dict[str, Any]) -> None:
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeGemini(Script(steps=0)))
    for path in (STREAM + "?alt=sse", f"/v1beta/models/{MODEL}:generateContent", f"/v1beta/models/{MODEL}:countTokens"):
        resp = await parts.client.post(path, json=body, headers={"x-goog-api-key": KEY})
        text = await resp.text()
        assert resp.status < 500 or "Internal proxy error" not in text, (path, resp.status, text)
        if resp.status == 400 and not parts.fake.requests:
            assert set(orjson.loads(text)["error"]) == {"code", "message", "status"}


class RecallingGemini(FakeGemini):
    """Gemini CLI's fake, which answers one turn with a signed call to the recall tool when told to."""

    recall: int | None = None

    def _turn_output(self, body: dict[str, Any], contents: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.recall is None:
            return super()._turn_output(body, contents)
        entry, self.recall = self.recall, None
        declared = [d["name"] for tool in body["tools"] for d in tool.get("functionDeclarations") or []]
        assert RECALL in declared
        return [{"functionCall": {"name": RECALL, "args": {"entry": entry}}, "thoughtSignature": self._sign("r")}]


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_recall_through_the_gemini_door(aiohttp_server, aiohttp_client, tmp_path: Path, sse: bool) -> None:
    fake = RecallingGemini(Script(steps=40), call_ids=False)
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=16_000, recall_tool=True)
    body = {"contents": long_history(30), "tools": TOOLS}
    headers = {"x-goog-api-key": KEY, "X-Session-Id": "recall"}
    assert (await parts.client.post(f"/v1beta/models/{MODEL}:generateContent", json=body, headers=headers)).status \
        == 200
    masked = orjson.dumps(fake.turns()[-1].body["contents"]).decode()
    fake.recall = int(re.search(r"log entry (\d+); call ctxproxy_recall", masked)[1])  # type: ignore[index]
    path = STREAM + "?alt=sse" if sse else f"/v1beta/models/{MODEL}:generateContent"
    resp = await parts.client.post(path, json=body, headers=headers)
    raw = await resp.read()

    assert resp.status == 200 and RECALL.encode() not in raw, "the client never sees the recall call"
    assert [t.status for t in fake.turns()] == [200, 200, 200], "signatures and pairing as Gemini checks them"
    answered = fake.turns()[-1].body["contents"]
    response = answered[-1]["parts"][0]["functionResponse"]
    assert response["name"] == RECALL and "lorem ipsum" in response["response"]["output"]
    assert answered[-2]["parts"][0]["functionCall"]["name"] == RECALL


@pytest.mark.parametrize(("style", "outcome"), [("prose", "summary"), ("refusal", "fallback"), ("error", "fallback")])
async def test_a_summary_model_that_misbehaves_never_stops_a_gemini_run(aiohttp_server, aiohttp_client,
                                                                       tmp_path: Path, style: str,
                                                                       outcome: str) -> None:
    """``prose``: no headings, still a summary; a refusal or a 500: the model-free tier stands in."""
    fake = FakeGemini(Script(steps=14))
    fake.summary_style = style
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=4_000, min_retain_rounds=1)
    agent = GeminiClient(parts.client, padding=" lorem ipsum" * 150)
    assert await agent.run("Run the steps.", 14) == final_text(14)
    assert [r.kind for r in fake.requests if r.kind == "summary"], "summaries were asked for, at the Gemini API"
    assert all(t.status == 200 and (t.tokens or 0) <= 4_000 for t in fake.turns())
    facts = await log_of(parts.store, agent.answers[0].headers[HEADER_SESSION])
    made = [f.extra["checkpoint"] for f in facts if f.kind == "checkpoint"]
    assert made, "the proxy compacted"
    fallbacks = [c for c in made if c.get("elision")]
    assert bool(fallbacks) == (outcome == "fallback")
