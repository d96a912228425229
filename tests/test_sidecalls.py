"""Side calls in the run's session leave the run's compaction as it is without them.

Real clients send small calls under the run's session: Claude Code's title and
quota calls and opencode's title call (the run's first message under a system
prompt of their own, no tools), Gemini CLI's next-speaker check (the run's
history and one question, no tools, a JSON schema). Each moves the log's head
to a branch of its own, and its reply's ``usage`` measured another prompt: the
run's next request, estimated from it, read hundreds of tokens short and was
never compacted until the upstream refused it (a 3,000-token window, 3,380
tokens sent). Here the fakes enforce the window on every call they count, and
the run compacts at the same steps as a run with no side calls.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.store.base import FactLog
from tests.fakegemini import FakeGemini
from tests.fakemessages import FakeMessages
from tests.fakescript import Recorded, Script
from tests.scripted import PADDING, TASK, Claude, blocks_of, rig
from tests.test_cachewrites import next_speaker
from tests.test_compaction_e2e import prose
from tests.test_engine import KEY as ENGINE_KEY
from tests.test_engine import WINDOW as ENGINE_WINDOW
from tests.test_engine import engine_over
from tests.test_gemini import KEY, MODEL, SYSTEM, TOOLS, GeminiClient, chunks_of, kept
from tests.test_gemini import rig as gemini_rig

WINDOW = 3000
STEPS = 12
STEP = re.compile(r"step-(\d+)")
TITLE_SYSTEM = "Write a five-word title for the conversation."
SPEAKER = "Who speaks next? Answer as JSON."
NEXT_SPEAKER_SCHEMA = {"type": "object", "properties": {"reasoning": {"type": "string"},
                                                        "next_speaker": {"type": "string", "enum": ["user", "model"]}}}


def made_for_the_run(requests: Sequence[Recorded]) -> bool:
    """Whether every summary the fake wrote was asked for by a run request: the request after it offers tools."""
    after = [next(r for r in requests[index:] if r.kind in ("turn", "helper"))
             for index, r in enumerate(requests) if r.kind == "summary"]
    return all(r.body.get("tools") for r in after)


def drops(tokens: Sequence[int]) -> list[int]:
    """The steps whose request is smaller than the one before: where the run was compacted."""
    return [index for index in range(1, len(tokens)) if tokens[index] < tokens[index - 1]]


async def messages_run(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path, store: str,
                       sides: bool) -> tuple[FakeMessages, list[str]]:
    """A Messages run of ``STEPS`` requests, with a title call and a next-speaker-style call before each after
    the first when ``sides``; the fake and the side calls' answer texts."""
    fake = FakeMessages(Script(steps=20), window=WINDOW)
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=WINDOW, store=store)
    client = Claude(proxy)
    title = {"model": "claude-opus-5-5", "max_tokens": 4096, "stream": False,
             "system": [{"type": "text", "text": TITLE_SYSTEM}], "messages": [{"role": "user", "content": TASK}]}
    answers = []
    for step in range(STEPS):
        if step and sides:
            for side in (title, next_speaker(client)):
                resp = await proxy.post("/v1/messages", data=orjson.dumps(side), headers=client.request_headers())
                assert resp.status == 200, await resp.text()
                raw = await resp.read()
                blocks = orjson.loads(raw)["content"] if resp.content_type == "application/json" else blocks_of(raw)
                answers.extend(block["text"] for block in blocks)
        await client.step()
    return fake, answers


async def test_messages_side_calls_leave_the_runs_compactions_as_they_are_and_no_request_over_the_window(
        aiohttp_server, aiohttp_client, tmp_path: Path, store_url: str) -> None:
    """Through the Messages door: the run with a title call and a question on its history before each request
    compacts at the steps it does alone, as often, and only its own requests compact it; no request the fake
    received (run or side call) is over the window; and each side call is answered as the fake answered it."""
    alone, _ = await messages_run(aiohttp_server, aiohttp_client, tmp_path / "alone", f"sqlite:///{tmp_path}/a.db",
                                  sides=False)
    fake, answers = await messages_run(aiohttp_server, aiohttp_client, tmp_path, store_url, sides=True)
    turns = fake.turns()
    assert all(turn.status == 200 and (turn.tokens or 0) <= WINDOW for turn in turns), [
        (turn.status, turn.tokens) for turn in turns]
    runs = [turn.tokens or 0 for turn in turns if turn.body.get("tools")]
    baseline = [turn.tokens or 0 for turn in alone.turns()]
    assert len(runs) == STEPS and drops(runs) == drops(baseline) != []
    assert (len([r for r in fake.requests if r.kind == "summary"])
            == len([r for r in alone.requests if r.kind == "summary"]))
    assert made_for_the_run(fake.requests), "a side call compacted the run"
    assert len(answers) == 2 * (STEPS - 1) and set(answers) == {"No Bash tool was offered."}


async def gemini_run(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path, store: str,
                     sides: bool) -> tuple[FakeGemini, list[Any]]:
    """A Gemini run of ``STEPS`` turns, with a title call and Gemini CLI's next-speaker check before each after
    the first when ``sides``; the fake and the side calls' answers (the next-speaker ones parsed)."""
    fake = FakeGemini(Script(steps=20), window=WINDOW)
    parts = await gemini_rig(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=WINDOW, store=store)
    agent = GeminiClient(parts.client)
    agent.contents.append({"role": "user", "parts": [{"text": TASK}]})
    url = f"/v1beta/models/{MODEL}:generateContent"
    title = {"contents": agent.contents[:1], "systemInstruction": {"parts": [{"text": TITLE_SYSTEM}]}}
    answers: list[Any] = []
    for step in range(STEPS):
        if step and sides:
            speaker = {"contents": [*agent.contents, {"role": "user", "parts": [{"text": SPEAKER}]}],
                       "systemInstruction": SYSTEM,
                       "generationConfig": {"responseMimeType": "application/json",
                                            "responseJsonSchema": NEXT_SPEAKER_SCHEMA}}
            for side in (title, speaker):
                resp = await parts.client.post(url, headers={"x-goog-api-key": KEY}, json=side)
                assert resp.status == 200, await resp.text()
                text = "".join(p["text"] for p in (await resp.json())["candidates"][0]["content"]["parts"])
                answers.append(orjson.loads(text) if side is speaker else text)
        resp = await parts.client.post(f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse",
                                       headers={"x-goog-api-key": KEY},
                                       json={"contents": agent.contents, "systemInstruction": SYSTEM, "tools": TOOLS})
        assert resp.status == 200, await resp.text()
        agent.contents.append(kept(chunks_of(await resp.read(), True)))
        calls = [p["functionCall"] for p in agent.contents[-1]["parts"] if "functionCall" in p]
        step_of = STEP.search(calls[0]["args"]["command"])
        assert step_of is not None
        agent.contents.append({"role": "user", "parts": [{"functionResponse": {
            "id": calls[0].get("id"), "name": calls[0]["name"],
            "response": {"output": f"Output: step-{step_of[1]}{PADDING}"}}}]})
    return fake, answers


async def test_gemini_side_calls_leave_the_runs_compactions_as_they_are_and_no_request_over_the_window(
        aiohttp_server, aiohttp_client, tmp_path: Path, store_url: str) -> None:
    """Through the Gemini door, Gemini CLI's next-speaker check (the run's history, a question, a JSON schema, no
    tools) and a title call before each turn: the run compacts at the steps it does alone, as often, and only its
    own requests compact it; no request
    the fake received is over the window (the check's, which the fake answers whatever its size, counted too);
    and the check's answer reaches the client as the fake wrote it."""
    alone, _ = await gemini_run(aiohttp_server, aiohttp_client, tmp_path / "alone", f"sqlite:///{tmp_path}/a.db",
                                sides=False)
    fake, answers = await gemini_run(aiohttp_server, aiohttp_client, tmp_path, store_url, sides=True)
    sent = [r for r in fake.requests if r.kind in ("turn", "helper")]
    sizes = [sum(fake.prompt_counts(r.body)[1]) for r in sent]
    assert all(r.status == 200 for r in sent) and max(sizes) <= WINDOW, sizes
    runs = [r.tokens or 0 for r in fake.turns() if r.body.get("tools")]
    baseline = [r.tokens or 0 for r in alone.turns()]
    assert len(runs) == STEPS and drops(runs) == drops(baseline) != []
    assert (len([r for r in fake.requests if r.kind == "summary"])
            == len([r for r in alone.requests if r.kind == "summary"]))
    assert made_for_the_run(fake.requests), "a side call compacted the run"
    assert answers[1::2] == [{"reasoning": "The model's last turn was complete.", "next_speaker": "user"}] * (STEPS - 1)
    assert set(answers[::2]) == {"No run_shell_command tool was offered."}


async def test_a_clip_after_a_side_call_names_the_entry_on_the_runs_path(store: FactLog) -> None:
    """A title call (the run's first message) logged since the run's last request leaves the log's head on a
    branch of its own: a result of the run's history clipped to fit is still named by the entry that logged it,
    which is on the run's path, not the head's (the recall tool reads it back by that seq)."""
    engine = engine_over(store)
    run = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Read the build log."},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": prose(random.Random(4), 6_000)}]
    hashes = [message_hash(m) for m in run]
    logged = await engine.history.sync(ENGINE_KEY, run, hashes)
    result_seq = logged.seqs[3]
    title = [*run[:2], {"role": "assistant", "content": "A five-word title here."}]
    state = await engine.history.sync(ENGINE_KEY, title, [message_hash(m) for m in title])
    assert state.hashes[:2] == hashes[:2] and state.hashes[2] != hashes[2], "the head is on the title's branch"

    view = engine.view(run, hashes, state, dialect=CHAT, window=ENGINE_WINDOW, tools=None, max_output=None)
    assert view.clipped == (3,)
    assert f"full text in the fact log, entry seq {result_seq} …]" in view.messages[3]["content"]
