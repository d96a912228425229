"""The real Qwen Code through the proxy's Chat Completions door, against the fake Chat upstream
(tests/fakechat.py) with a window the run does not fit.

As for the other agents (tests/test_agents_proxy.py, whose rig and checks this reuses): 25 tool steps headless,
with Qwen Code's own compaction as high as it goes (``context.autoCompactThreshold`` 1.0, of the 200k it
assumes), through the recording tap in front of the proxy. Qwen Code's first request is about 17,000 tokens (14
tools and its system prompt) and each step here prints 150 lines, about 590 tokens, so 25 steps need 31,700;
the window, 26,000, holds the head with room to spare but not the run's last request. It asks for
``max_tokens: 32768``, more than the window: the proxy then reserves nothing for the answer, as the fake does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.constants import HEADER_COMPACTED, HEADER_SESSION
from proxy.dialects.chat import normalise
from tests.agents import QWEN_VERSION, AgentRun, run_qwen
from tests.fakechat import FakeChat
from tests.fakescript import Script, final_text, is_summary_prompt
from tests.proxyfixtures import assistant_from_sse
from tests.test_agents_proxy import (
    PROMPT,
    STEPS,
    check_headers,
    check_log,
    check_tail,
    kept_tail,
    long_step,
    rig,
    served,
    session_log,
)

QWEN_WINDOW = 26_000


@pytest.mark.parametrize("shape", ["known", "http"])
async def test_qwen_code_runs_twenty_five_steps_through_the_proxy_in_a_window_that_does_not_hold_them(
        aiohttp_server, tmp_path: Path, shape: str) -> None:
    fake = FakeChat(Script(steps=STEPS, command=long_step), window=QWEN_WINDOW)
    parts = await rig(aiohttp_server, tmp_path, fake, QWEN_WINDOW, shape)
    run: AgentRun = await run_qwen(parts.url + "/v1", tmp_path, PROMPT, timeout=100)

    assert (run.returncode, run.errors) == (0, []), run.stderr
    assert run.final_text == final_text(STEPS)

    sent = parts.tap.exchanges
    assert [(x.method, x.path_qs) for x in sent] == [("POST", "/v1/chat/completions")] * (STEPS + 1)
    assert sent[0].headers["User-Agent"].startswith(f"QwenCode/{QWEN_VERSION} ")
    session = sent[0].response_headers[HEADER_SESSION]
    check_headers(sent, session)
    accepted, refusals = served(fake.turns(), sent, QWEN_WINDOW, "messages", shape)
    if shape != "known":
        assert refusals >= 1 and "reactive" in [x.response_headers[HEADER_COMPACTED] for x in sent]
    summaries = [r for r in fake.requests if r.kind == "summary"]
    assert summaries and all(is_summary_prompt(r.body["messages"][-1]["content"]) for r in summaries)
    assert {r.kind for r in fake.requests} == {"turn", "summary"}, "no compaction of its own, no helper calls"

    facts = await session_log(parts.store, sent[0].headers, session)
    last, upstream = sent[-1].json(), accepted[-1].body
    whole = fake.window.count(last["tools"]) + sum(fake.window.count(m) for m in last["messages"])
    assert whole > QWEN_WINDOW, "the run does not fit the window without the proxy"
    check_log(facts, "chat", last["messages"], [assistant_from_sse(sent[-1].response)], normalise)
    tail = kept_tail(facts, last["messages"])
    check_tail(upstream["messages"], tail)
    assert {k: v for k, v in upstream.items() if k != "messages"} == {
        k: v for k, v in last.items() if k != "messages"}

