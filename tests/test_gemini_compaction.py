"""Gemini CLI's own compression, answered by the proxy from its checkpoint with no upstream call.

A scripted Gemini client (tests/test_gemini.py) runs through the proxy in a window small enough that the proxy
compacts; then it sends the two ``:generateContent`` calls Gemini CLI 0.61.0 sends when it compresses (the texts
from its bundle, ``compress`` in ``chatCompressionService``): the oldest 70% of its history under its compression
prompt, with the ask; then the same with the first answer and the check. Both are answered with the same
``<state_snapshot>`` in the sections the prompt asks for, made from the proxy's summary, and nothing reaches the
upstream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.clientcompact import recognise
from proxy.clientcompact.answers import state_snapshot
from proxy.clientcompact.texts import GEMINI_SECTIONS, GEMINI_SYSTEM
from proxy.constants import HEADER_SESSION
from tests.fakegemini import FakeGemini
from tests.fakescript import Script
from tests.test_gemini import KEY, MODEL, GeminiClient, log_of, rig

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


@pytest.mark.parametrize("share", [0.7, 0.3])
async def test_gemini_cli_compression_is_answered_from_the_checkpoint_with_no_upstream_call(
        aiohttp_server, aiohttp_client, tmp_path: Path, share: float) -> None:
    """``share``: the part of its history the client asks about (Gemini CLI: 0.7); a checkpoint that covers more
    answers it too."""
    fake = FakeGemini(Script(steps=30))
    # Kept outputs by count only: a summary checkpoint is what answers it (a masking one has no summary to give).
    parts = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=4_000, min_retain_rounds=1,
                      keep_tool_output_share=1.0)
    agent = GeminiClient(parts.client, padding=" lorem ipsum" * 150)
    await agent.run("Run the steps. FACT-gemini7 matters.", 12)
    session = agent.answers[-1].headers[HEADER_SESSION]
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
