"""Gemini CLI's own compression, answered by the proxy from its checkpoint with no upstream call.

A scripted Gemini client (tests/test_gemini.py) runs through the proxy in a window small enough that the proxy
compacts; then it sends the two ``:generateContent`` calls Gemini CLI 0.61.0 sends when it compresses (the texts
from its bundle, ``compress`` in ``chatCompressionService``): the oldest 70% of its history under its compression
prompt, with the ask; then the same with the first answer and the check. Both are answered with the same
``<state_snapshot>`` in the sections the prompt asks for, made from the proxy's summary, and nothing reaches the
upstream.

What a compression call gets is bound by what its history holds (issue 35): an empty one, a shorter prefix than
the session's checkpoint covers, or one on another door's session gets nothing of the session; and ``/compress``
after a second prompt, whose history ends before the checkpoint's split, is answered (it was a 500).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.app import create_app
from proxy.clientcompact import recognise
from proxy.clientcompact.answers import state_snapshot
from proxy.clientcompact.texts import GEMINI_SECTIONS, GEMINI_SYSTEM
from proxy.constants import HEADER_SESSION
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakechat import SHELL as CHAT_SHELL
from tests.fakechat import FakeChat
from tests.fakegemini import FakeGemini
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script
from tests.proxyfixtures import read_log
from tests.test_client_compaction import KEY as CLIENT_KEY
from tests.test_client_compaction import claude_run, codex_run
from tests.test_gemini import KEY, MODEL, STREAM, SYSTEM, TOOLS, GeminiClient, Rig, log_of, rig

#: The prompt's opening words and its section skeleton, as Gemini CLI 0.61.0 sends them (shortened).
COMPRESSION_PROMPT = GEMINI_SYSTEM + "\n\n### CRITICAL SECURITY RULE\n…\n<state_snapshot>\n    <overall_goal>…"
ASK = ("Generate a new <state_snapshot> based on the provided history.\n\nFirst, reason in your scratchpad. Then, "
       "generate the updated <state_snapshot>.")
CHECK = ("Critically evaluate the <state_snapshot> you just generated. Did you omit any specific technical details, "
         "file paths, tool results, or user constraints mentioned in the history? If anything is missing or could "
         "be more precise, generate a FINAL, improved <state_snapshot>. Otherwise, repeat the exact same "
         "<state_snapshot> again.")


def compression_call(history: list[dict[str, Any]], *tail: dict[str, Any]) -> dict[str, Any]:
    system = {"role": "user", "parts": [{"text": COMPRESSION_PROMPT}]}
    return {"contents": [*history, *tail], "systemInstruction": system,
            "generationConfig": {"temperature": 1, "topP": 0.95, "topK": 64,
                                 "thinkingConfig": {"includeThoughts": True, "thinkingLevel": "HIGH"}}}


async def compacted_run(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path) -> tuple[Rig, GeminiClient, str]:
    """A Gemini CLI run of 12 steps in a 4,000-token window, which the proxy compacted: the rig, the client, and
    its session. Outputs are kept by count only: a summary checkpoint is what answers a compression call (a masking
    one has no summary to give)."""
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, FakeGemini(Script(steps=30)), context_window=4_000,
                      min_retain_rounds=1, keep_tool_output_share=1.0)
    agent = GeminiClient(parts.client, padding=" lorem ipsum" * 150)
    await agent.run("Run the steps. FACT-gemini7 matters.", 12)
    return parts, agent, agent.answers[-1].headers[HEADER_SESSION]


async def test_gemini_cli_compression_is_answered_from_the_checkpoint_with_no_upstream_call(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """The oldest 70% of its history, as Gemini CLI asks: a checkpoint whose whole covered prefix that holds
    answers it."""
    share = 0.7
    parts, agent, session = await compacted_run(aiohttp_server, aiohttp_client, tmp_path)
    fake = parts.fake
    assert any(f.kind == "checkpoint" for f in await log_of(parts.store, session)), "the proxy compacted"
    before = len(fake.requests)
    rewinds = [f for f in await log_of(parts.store, session) if f.kind == "rewind"]

    history = agent.contents[: int(len(agent.contents) * share) // 2 * 2 + 1]  # the oldest part, ending on a user turn
    url = f"/v1beta/models/{MODEL}:generateContent"
    first = await parts.client.post(url, headers={"x-goog-api-key": KEY},
                                    json=compression_call(history, {"role": "user", "parts": [{"text": ASK}]}))
    assert first.status == 200, await first.text()
    snapshot = (await first.json())["candidates"][0]["content"]["parts"][0]["text"]
    second = await parts.client.post(url, headers={"x-goog-api-key": KEY}, json=compression_call(
        history, {"role": "model", "parts": [{"text": snapshot}]}, {"role": "user", "parts": [{"text": CHECK}]}))
    assert second.status == 200
    answer = await second.json()
    assert answer["candidates"][0]["finishReason"] == "STOP"
    assert answer["candidates"][0]["content"]["parts"][0]["text"] == snapshot, "the check repeats it"

    assert len(fake.requests) == before, ("no upstream call", [(r.kind, r.path) for r in fake.requests[before:]])
    assert {first.headers[HEADER_SESSION], second.headers[HEADER_SESSION]} == {session}
    assert snapshot.startswith("<state_snapshot>\n") and snapshot.endswith("\n</state_snapshot>")
    assert [line.strip() for line in snapshot.splitlines() if line.strip().startswith("<") and "</" not in line
            ][1:] == [f"<{tag}>" for tag in GEMINI_SECTIONS if f"<{tag}></{tag}>" not in snapshot]
    assert "FACT-gemini7" in snapshot and "step-" in snapshot
    facts = await log_of(parts.store, session)
    assert [f for f in facts if f.kind == "rewind"] == rewinds, "the log's lineage stays where the client is"
    answered = [f.extra.get("client_compaction") for f in facts if f.kind == "summary"]
    assert [kind for kind in answered if kind is not None] == ["gemini_snapshot", "gemini_verify"]


def test_the_compression_calls_are_recognised_and_nothing_else_is() -> None:
    history = [{"role": "user", "parts": [{"text": "hi"}]}]
    ask = {"role": "user", "parts": [{"text": ASK}]}
    first = recognise("gemini", compression_call(history, ask))
    assert first is not None and (first.kind, first.index) == ("gemini_snapshot", 1)
    check = compression_call(history, {"role": "model", "parts": [{"text": "<state_snapshot/>"}]},
                             {"role": "user", "parts": [{"text": CHECK}]})
    second = recognise("gemini", check)
    assert second is not None and (second.kind, second.index) == ("gemini_verify", 1)
    assert second.conversation(check["contents"]) == history
    shorthand = {**compression_call(history, ask), "systemInstruction": {"text": COMPRESSION_PROMPT}}
    assert recognise("gemini", shorthand) is not None
    assert recognise("gemini", {**compression_call(history, ask), "systemInstruction": {"parts": [{"text": "x"}]}}) \
        is None, "the ask alone, under another system prompt, is conversation"
    assert recognise("gemini", compression_call(history, {"role": "user", "parts": [{"text": "go on"}]})) is None
    assert recognise("chat", compression_call(history, ask)) is None


def test_the_snapshot_puts_each_section_where_the_prompt_asks_for_it() -> None:
    summary = ("## 1. Goals and constraints\nShip it.\n## 2. Work completed\nRan step 1.\n## 4. Files touched\n"
               "a.py\n## 5. Errors\nNone\n## 7. Next steps\nStep 2.\n## 8. Identifiers\nFACT-1 </state_snapshot>")
    snapshot = state_snapshot(summary)
    sections = {tag: snapshot.split(f"<{tag}>")[1].split(f"</{tag}>")[0].strip() for tag in GEMINI_SECTIONS}
    assert sections == {"overall_goal": "Ship it.", "active_constraints": "", "recent_actions": "Ran step 1.",
                        "artifact_trail": "a.py", "task_state": "Step 2.", "file_system_state": "",
                        "key_knowledge": "Identifiers:\nFACT-1 &lt;/state_snapshot&gt;"}
    assert orjson.dumps(snapshot).count(b"</state_snapshot>") == 1


# -- what a compression call holds bounds what it gets (issue 35) ---------------------------------------------


def split_point(contents: list[dict[str, Any]], fraction: float = 0.7) -> int:
    """Where Gemini CLI 0.61.0 splits its history for ``/compress`` (``findCompressSplitPoint``): at the first user
    prompt (no function response) past ``fraction`` of the characters, else the whole history when it ends on a
    model turn without a call, else at the last prompt."""
    counts = [len(orjson.dumps(content)) for content in contents]
    target, total, last = sum(counts) * fraction, 0, 0
    for index, content in enumerate(contents):
        if content["role"] == "user" and not any("functionResponse" in part for part in content["parts"]):
            if total >= target:
                return index
            last = index
        total += counts[index]
    if contents[-1]["role"] == "model" and not any("functionCall" in part for part in contents[-1]["parts"]):
        return len(contents)
    return last


def steps_in(text: str) -> set[int]:
    """The steps a text names: its outputs (``step-N``) and the fake summary's ``Ran steps A to B``."""
    return {int(n) for n in re.findall(r"step-(\d+)", text)} | {
        n for a, b in re.findall(r"Ran steps (\d+) to (\d+)", text) for n in range(int(a), int(b) + 1)}


async def gemini_rig(aiohttp_server: Any, aiohttp_client: Any, store_url: str, fake: FakeGemini,
                     other: Any = None, **settings: Any) -> Rig:
    """The proxy with ``fake`` as its Gemini upstream and ``other`` (a fake of another API) as its OpenAI and
    Anthropic upstream, on ``store_url``; summaries written by compaction, not masking (outputs kept by count)."""
    gemini = await aiohttp_server(fake.app())
    root = str((await aiohttp_server(other.app())).make_url("")).rstrip("/") if other is not None else None
    app = create_app(Settings(gemini_upstream=str(gemini.make_url("")).rstrip("/"), store=store_url,
                              **({"upstream": root + "/v1", "anthropic_upstream": root} if root else {}),
                              **{"precompact_threshold": 1.0, "keep_tool_output_share": 1.0, **settings}))
    return Rig(fake, await aiohttp_client(app), app[store_key])


async def compress(client: Any, history: list[dict[str, Any]], *, key: str = KEY,
                   prefix: str = "") -> tuple[str, str]:
    """Gemini CLI's two compression calls over ``history``; the texts of their answers."""
    url = f"{prefix}/v1beta/models/{MODEL}:generateContent"
    first = await client.post(url, headers={"x-goog-api-key": key},
                              json=compression_call(history, {"role": "user", "parts": [{"text": ASK}]}))
    assert first.status == 200, await first.text()
    snapshot = (await first.json())["candidates"][0]["content"]["parts"][0]["text"]
    second = await client.post(url, headers={"x-goog-api-key": key}, json=compression_call(
        history, {"role": "model", "parts": [{"text": snapshot}]}, {"role": "user", "parts": [{"text": CHECK}]}))
    assert second.status == 200, await second.text()
    return snapshot, (await second.json())["candidates"][0]["content"]["parts"][0]["text"]


@pytest.mark.parametrize("held", ["nothing", "first prompt", "older third"])
async def test_a_compression_call_gets_nothing_of_the_session_its_history_does_not_hold(
        aiohttp_server, aiohttp_client, store_url: str, held: str) -> None:
    """An empty history is a prefix of every lineage, and a short one of this one: neither holds what the
    session's checkpoint covers, so neither gets its summary, the user's words or its trail. The empty one goes
    upstream as it came (what the model makes of nothing); the others get a summary of their own items, or the
    upstream's answer when they are too short to summarise."""
    fake = FakeGemini(Script(steps=30))
    parts = await gemini_rig(aiohttp_server, aiohttp_client, store_url, fake, context_window=4_000,
                             min_retain_rounds=1)
    agent = GeminiClient(parts.client, padding=" lorem ipsum" * 150)
    await agent.run("Run the steps. FACT-gemini7 matters.", 12)
    session = agent.answers[-1].headers[HEADER_SESSION]
    checkpoints = [f.extra["checkpoint"] for f in await log_of(parts.store, session) if f.kind == "checkpoint"]
    assert checkpoints and max(c["retain_start_idx"] for c in checkpoints) > len(agent.contents) // 3
    history = {"nothing": [], "first prompt": agent.contents[:1],
               "older third": agent.contents[: len(agent.contents) // 3 // 2 * 2 + 1]}[held]
    steps = steps_in(orjson.dumps(history).decode())
    before = len(fake.requests)

    for text in await compress(parts.client, history, prefix=f"/s/{session}"):
        assert steps_in(text) <= steps, (held, sorted(steps_in(text) - steps))
        assert ("FACT-gemini7" in text) <= bool(history), "the user's words only to a history that holds them"
    for sent in fake.requests[before:]:  # whatever went upstream was the request's own
        body = orjson.dumps(sent.body).decode()
        assert steps_in(body) <= steps and ("FACT-gemini7" in body) <= bool(history)


async def test_compress_after_a_second_prompt_answers_from_what_the_request_holds(
        aiohttp_server, aiohttp_client, store_url: str) -> None:
    """``/compress`` after two prompts: Gemini CLI asks about the history before the second prompt (its split point),
    while the session's checkpoint was made inside the second round: its split and the round's opener lie past the
    end of what the request holds (that made a 500, an IndexError, before)."""
    fake = FakeGemini(Script(steps=30))
    parts = await gemini_rig(aiohttp_server, aiohttp_client, store_url, fake, context_window=4_000,
                             min_retain_rounds=1)
    # The first round long in characters (what the CLI splits by) but short in tokens (what the proxy compacts
    # by): no checkpoint before the second prompt, so none that the request holds whole.
    agent = GeminiClient(parts.client, padding=" " + "=" * 4000)
    await agent.run("Run the steps. FACT-gemini7 matters.", 4)
    second = len(agent.contents)
    agent.padding = " lorem ipsum" * 150
    await agent.run("Go on with the steps. FACT-second9 too.", 6)
    session = agent.answers[-1].headers[HEADER_SESSION]
    checkpoints = [f.extra["checkpoint"] for f in await log_of(parts.store, session) if f.kind == "checkpoint"]
    assert [(c["round_start_idx"], c["retain_start_idx"] > second) for c in checkpoints] == [(second, True)], \
        "one checkpoint, splitting the second round"
    assert split_point(agent.contents) == second, "the CLI asks about the first round"
    history = agent.contents[:second]

    before = len(fake.requests)
    held = orjson.dumps(history).decode()
    for text in await compress(parts.client, history):  # the round is too short to summarise: the model answers
        assert "FACT-second9" not in text and steps_in(text) <= steps_in(held), "nothing of the second round"
    upstream = [orjson.dumps(r.body).decode() for r in fake.requests[before:]]
    assert upstream and all("FACT-second9" not in body and steps_in(body) <= steps_in(held) for body in upstream)
    before = len(fake.requests)
    whole, _ = await compress(parts.client, agent.contents)  # the whole history holds the checkpoint's prefix
    assert "FACT-second9" in whole and len(fake.requests) == before, "answered from the checkpoint"


async def chat_run(client: Any, steps: int, key: str, session: str) -> None:
    """A Chat Completions agent (FakeChat's script): each shell call answered with its output."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Run the steps."}]
    tools = [{"type": "function", "function": {"name": CHAT_SHELL, "parameters": {"type": "object"}}}]
    for _ in range(steps):
        resp = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}",
                                                                  "X-Session-Id": session},
                                 json={"model": "m", "messages": messages, "tools": tools})
        assert resp.status == 200, await resp.text()
        message = (await resp.json())["choices"][0]["message"]
        call = message["tool_calls"][0]
        step = orjson.loads(call["function"]["arguments"])["command"].split("-")[1]
        messages += [message, {"role": "tool", "tool_call_id": call["id"],
                               "content": f"step-{step}\n" + "output line\n" * 120}]


@pytest.mark.parametrize("door", ["chat", "messages", "responses"])
async def test_an_empty_compression_call_on_another_doors_session_gets_none_of_it(
        aiohttp_server, aiohttp_client, store_url: str, door: str) -> None:
    """The same credential, the session of a run on another door (its id in the path): an empty history proves
    nothing, so the call goes upstream as it came and the answer holds nothing of the run."""
    fakes = {"chat": FakeChat, "messages": FakeMessages, "responses": FakeResponses}
    other = fakes[door](Script(steps=40))
    fake = FakeGemini(Script(steps=0))
    parts = await gemini_rig(aiohttp_server, aiohttp_client, store_url, fake, other, context_window=6_000,
                             min_retain_rounds=2, keep_tool_outputs=1_000)
    session, key = {"chat": ("chat-1", CLIENT_KEY), "messages": ("cc-1", CLIENT_KEY),
                    "responses": ("codex-1", CLIENT_KEY)}[door]
    if door == "chat":
        await chat_run(parts.client, 16, key, session)
    else:
        await (claude_run if door == "messages" else codex_run)(parts.client, 16)
    facts = await read_log(parts.store, SessionKey(tenant_of(key), session))
    assert [f for f in facts if f.kind == "summary"], "the run was summarised"

    for text in await compress(parts.client, [], key=key, prefix=f"/s/{session}"):
        assert "step-" not in text and "Ran steps" not in text and "Goals" not in text
    assert [r.body["contents"] for r in fake.requests] == [[{"role": "user", "parts": [{"text": ASK}]}], [
        {"role": "model", "parts": [{"text": "<state_snapshot></state_snapshot>"}]},
        {"role": "user", "parts": [{"text": CHECK}]}]], "the upstream got the calls as they came"


async def test_an_empty_compression_call_under_a_key_linked_by_a_shared_start_gets_none_of_the_session(
        aiohttp_server, aiohttp_client, store_url: str) -> None:
    """Another key proves the owner's session while it is only its stock start (a long stock first prompt and the
    first reply), and is linked to it; the owner works on. That key's empty compression call proves nothing, so it
    gets none of the owner's later work (it got the owner's newest summary, steps and words, before)."""
    fake = FakeGemini(Script(steps=30))
    parts = await gemini_rig(aiohttp_server, aiohttp_client, store_url, fake, context_window=4_000,
                             min_retain_rounds=1)
    owner = GeminiClient(parts.client, padding=" lorem ipsum" * 150)
    await owner.run("Run the steps. " + "Keep the repository's conventions. " * 40, 0)
    session = owner.answers[-1].headers[HEADER_SESSION]
    other = "gemini-other-key"
    resp = await parts.client.post(STREAM + "?alt=sse", headers={"x-goog-api-key": other},
                                   json={"contents": owner.contents, "systemInstruction": SYSTEM, "tools": TOOLS})
    assert resp.status == 200 and resp.headers[HEADER_SESSION] == session
    links = await parts.store.link_of(SessionKey(tenant_of(other), session))
    assert links is not None and links.tenant == tenant_of(KEY), "linked by the shared start"
    await owner.run("Go on. FACT-owner3 is mine.", 12)
    summaries = [f for f in await log_of(parts.store, session) if f.kind == "summary"]
    assert summaries and "FACT-owner3" in orjson.dumps(summaries[-1].message).decode()

    before = len(fake.requests)
    for text in await compress(parts.client, [], key=other, prefix=f"/s/{session}"):
        assert "FACT-owner3" not in text and not steps_in(text), text[:300]
    assert [r.kind for r in fake.requests[before:]] == ["client_compaction"] * 2, "relayed as it came"


async def test_a_compression_call_right_after_a_side_call_leaves_the_log_where_the_run_is(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """A title call (the run's first prompt under a system prompt of its own) moves the log's head to a branch of
    its own; the compression call after it asks about the older part of the run, which the log holds on the run's
    path: it is answered from the checkpoint and logs no rewind to that part (the run's next request would log
    another one back)."""
    parts, agent, session = await compacted_run(aiohttp_server, aiohttp_client, tmp_path)
    fake = parts.fake
    url = f"/v1beta/models/{MODEL}:generateContent"
    title = await parts.client.post(url, headers={"x-goog-api-key": KEY}, json={
        "contents": agent.contents[:1], "systemInstruction": {"parts": [{"text": "Write a five-word title."}]}})
    assert title.status == 200, await title.text()
    rewinds = [f for f in await log_of(parts.store, session) if f.kind == "rewind"]
    before = len(fake.requests)

    snapshot, _ = await compress(parts.client, agent.contents[: int(len(agent.contents) * 0.7) // 2 * 2 + 1])
    assert "FACT-gemini7" in snapshot and len(fake.requests) == before, "answered from the checkpoint"
    assert [f for f in await log_of(parts.store, session) if f.kind == "rewind"] == rewinds
