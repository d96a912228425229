"""The real Gemini CLI through the proxy, against the fake Gemini upstream (tests/fakegemini.py) with a window
the run does not fit.

As for Codex and Claude Code (tests/test_agents_proxy.py, whose rig and checks this reuses): 25 tool steps
headless, the CLI's own compression off, through the recording tap in front of the proxy. Gemini CLI's first
request is about 9,600 tokens (3,100 of tools, 6,350 of system instruction) and each step adds about 230, so
25 steps need 15,400; the window, 14,000, holds the head with room to spare but stops a direct run around step
19. The CLI neither retries nor compresses on a "too long" 400 (the turn fails, a headless run exits 1), so no
refusal may reach it. The fake checks, as Gemini 3 does, that each model turn since the last user text comes
back with the ``thoughtSignature`` it issued. Run once with the proxy told the window, and once told four times
it: then it learns the window from the first refusal (Gemini's message states it) and rescues that request.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from multidict import CIMultiDict

from proxy.constants import HEADER_COMPACTED, HEADER_SESSION
from proxy.dialects import GEMINI
from tests.agents import GEMINI_VERSION, AgentRun, run_gemini
from tests.fakegemini import FakeGemini, kept_reply, parts_of
from tests.fakescript import Script, final_text, is_summary_prompt, parse_sse
from tests.test_agents_proxy import (
    PROMPT,
    STEPS,
    check_headers,
    check_log,
    check_tail,
    kept_tail,
    rig,
    served,
    session_log,
)

GEMINI_WINDOW = 14_000
STREAMED = "/v1beta/models/gemini-3.1-pro-preview:streamGenerateContent?alt=sse"


@pytest.mark.parametrize("shape", ["known", "http"])
async def test_gemini_cli_runs_twenty_five_steps_through_the_proxy_in_a_window_that_does_not_hold_them(
        aiohttp_server, tmp_path: Path, shape: str) -> None:
    fake = FakeGemini(Script(steps=STEPS), window=GEMINI_WINDOW)
    parts = await rig(aiohttp_server, tmp_path, fake, GEMINI_WINDOW, shape)
    run: AgentRun = await run_gemini(parts.url, tmp_path, PROMPT)

    assert (run.returncode, run.errors) == (0, []), run.stderr
    assert run.final_text == final_text(STEPS)
    assert run.events[-1]["stats"]["tools"]["totalSuccess"] == STEPS

    sent = parts.tap.exchanges
    assert [(x.method, x.path_qs) for x in sent] == [("POST", STREAMED)] * (STEPS + 1)
    session = sent[0].response_headers[HEADER_SESSION]
    check_headers(sent, session)
    accepted, refusals = served(fake.turns(), sent, GEMINI_WINDOW, "contents", shape)
    if shape != "known":  # the refusal states the window: learned from the first, the proxy compacts ahead of it
        assert refusals == 1 and [x.response_headers[HEADER_COMPACTED] for x in sent].count("reactive") == 1
    summaries = [r for r in fake.requests if r.kind == "summary"]
    assert summaries and {r.path for r in summaries} == {"/v1beta/models/gemini-3.1-pro-preview:generateContent"}
    assert all(is_summary_prompt(r.body["contents"][-1]["parts"]) for r in summaries)
    assert {r.kind for r in fake.requests} == {"turn", "summary"}, "nothing but turns and the proxy's summaries"

    facts = await session_log(parts.store, sent[0].headers, session)
    last, upstream = sent[-1].json(), accepted[-1].body
    check_log(facts, "gemini", last["contents"], [kept_reply(parse_sse(sent[-1].response))], GEMINI.identity)
    tail = kept_tail(facts, last["contents"])
    check_tail(upstream["contents"], tail)
    assert any(p.get("thoughtSignature") for c in tail for p in parts_of(c) if "functionCall" in p)
    assert {k: v for k, v in upstream.items() if k != "contents"} == {
        k: v for k, v in last.items() if k != "contents"}
    assert orjson.dumps(upstream["systemInstruction"]) == orjson.dumps(last["systemInstruction"])
    upstream_headers = CIMultiDict(accepted[-1].headers)
    for name in ("x-goog-api-key", "x-goog-api-client", "User-Agent"):
        assert upstream_headers[name] == sent[-1].headers[name], name


# -- straight at the fake: why the proxy is needed, and what the CLI sends ------------------------------------


async def test_gemini_cli_straight_at_the_fake_fails_its_turn_on_the_first_too_long_refusal(
        aiohttp_server, tmp_path: Path) -> None:
    fake = FakeGemini(Script(steps=STEPS), window=GEMINI_WINDOW)
    server = await aiohttp_server(fake.app())
    run = await run_gemini(str(server.make_url("")).rstrip("/"), tmp_path, PROMPT)
    assert run.returncode != 0 and run.final_text is None
    assert len(run.errors) == 1 and "exceeds the maximum number of tokens allowed (14000)" in run.errors[0]
    *accepted, refused = fake.turns()
    assert 10 <= len(accepted) < STEPS
    assert all(r.tokens is not None and r.tokens <= GEMINI_WINDOW for r in accepted)
    assert refused.status == 400 and refused.tokens is not None and refused.tokens > GEMINI_WINDOW


async def test_what_gemini_cli_sends(aiohttp_server, tmp_path: Path) -> None:
    """The facts docs/CLIENTS.md and WIRE_FORMATS.md state for Gemini CLI."""
    fake = FakeGemini(Script(steps=2))
    server = await aiohttp_server(fake.app())
    run = await run_gemini(str(server.make_url("")).rstrip("/"), tmp_path, PROMPT)
    assert run.returncode == 0, run.stderr
    turns = fake.turns()
    assert [(t.path, t.query) for t in turns] == [(STREAMED.partition("?")[0], {"alt": "sse"})] * 3
    first = turns[0]
    assert set(first.body) == {"contents", "systemInstruction", "tools", "generationConfig"}
    assert first.body["generationConfig"]["thinkingConfig"] == {"includeThoughts": True, "thinkingLevel": "HIGH"}
    assert [p["text"][:17] for p in first.body["contents"][0]["parts"]] == ["<session_context>", PROMPT[:17]]
    headers = first.headers
    assert headers["x-goog-api-key"] == "gemini-ctxproxy-test"
    assert headers["User-Agent"].startswith(f"GeminiCLI-tui/{GEMINI_VERSION}/gemini-3.1-pro-preview ")
    assert headers["x-goog-api-client"].startswith("google-genai-sdk/")
    assert not {"X-Session-Id", "session-id", "Authorization"} & set(headers)
    second = turns[1].body["contents"]
    assert [c["role"] for c in second] == ["user", "model", "user"]
    assert [list(p) for p in second[1]["parts"]] == [["text"], ["functionCall", "thoughtSignature"]], "thoughts dropped"
    call, response = second[1]["parts"][1]["functionCall"], second[2]["parts"][0]["functionResponse"]
    assert response["id"] == call["id"] and response["name"] == call["name"] == "run_shell_command"
    assert "step-1" in response["response"]["output"]


# -- the proactive trigger counts what a Gemini request carries besides its contents --------------------------

#: A window the CLI's head (about 9,600 tokens, 6,350 of them the system instruction) leaves 6,400 of.
SMALL_WINDOW = 16_000
LONG_STEPS = 32


def long_output(step: int) -> str:
    """Every fourth step prints about 4,800 tokens of numbers, the others about 240: the run needs compacting,
    and a large output may come right after a checkpoint lands, when no usage figure covers the view yet."""
    lines = 2000 if step % 4 == 0 else 100
    return f"echo step-{step}; seq {step * 10000} {step * 10000 + lines}"


async def test_gemini_cli_at_16k_never_sends_the_upstream_a_prompt_over_its_window(
        aiohttp_server, tmp_path: Path) -> None:
    """Issue 35: the door counted ``contents`` and ``tools`` but not the system instruction, so a view applying a
    new checkpoint was estimated 6,350 tokens low: 11 of 44 turns reached the fake over its window, each rescued
    by a reactive retry. Counting everything the request carries, the proactive trigger fires first."""
    fake = FakeGemini(Script(steps=LONG_STEPS, command=long_output), window=SMALL_WINDOW)
    parts = await rig(aiohttp_server, tmp_path, fake, SMALL_WINDOW, "known")
    run: AgentRun = await run_gemini(parts.url, tmp_path, PROMPT)

    assert (run.returncode, run.errors) == (0, []), run.stderr
    assert run.final_text == final_text(LONG_STEPS)
    turns = fake.turns()
    over = [t.tokens for t in turns if t.tokens is None or t.tokens > SMALL_WINDOW]
    assert over == [], f"{len(over)} of {len(turns)} turns reached the upstream over the window"
    assert [t.status for t in turns] == [200] * (LONG_STEPS + 1), "one accepted turn per step, none refused"
    compacted = [x.response_headers[HEADER_COMPACTED] for x in parts.tap.exchanges]
    assert "reactive" not in compacted, compacted
    assert sum(c in ("proactive", "background") for c in compacted) >= LONG_STEPS // 4, "the run needed compacting"
