"""The real mini-swe-agent, 30 long steps through the proxy in a 16k window: it finishes, nothing over the window
reaches the upstream, and the proxy changes the prompt prefix at most 7 times (one per five steps, issue 34).

mini-swe-agent (tests/agents.py ``run_mini``: LiteLLM's OpenAI provider, Chat Completions) has no compaction of
its own and sends its whole history every step. The fake (tests/fakechat.py, strict: a prompt over 16,000 tokens
is refused) asks through its ``bash`` tool for the 30 steps of tests/test_agents_prefix.py (outputs of about 590
tokens, ``long_step``), then for the command that ends a mini-swe-agent run: a line ``MINI_SUBMIT`` followed by
the submission, the final text. The agent's last request is about 21,800 tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.agents import MINI_SUBMIT, run_mini
from tests.fakechat import FakeChat
from tests.fakescript import Script, final_text
from tests.prefixchanges import CHAT
from tests.test_agents_prefix import STEPS, TIMEOUT, WINDOW, check_prefix_changes, session_logs, summaries_and_fallbacks
from tests.test_agents_proxy import PROMPT, long_step, rig


def mini_step(step: int) -> str:
    """The 30 long steps, then the submission: harmless commands run in the run's work directory."""
    return long_step(step) if step <= STEPS else f"printf '%s\\n' {MINI_SUBMIT} '{final_text(STEPS)}'"


async def test_mini_swe_agent_runs_thirty_steps_in_16k_and_the_proxy_changes_the_prefix_at_most_once_in_five(
        aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeChat(Script(steps=STEPS + 1, command=mini_step), WINDOW)
    parts = await rig(aiohttp_server, tmp_path, fake, WINDOW, "known")
    run = await run_mini(parts.url + "/v1", tmp_path, PROMPT, timeout=TIMEOUT)

    assert (run.returncode, run.errors) == (0, []), run.stdout[-3000:] + run.stderr[-3000:]
    assert run.final_text is not None and final_text(STEPS) in run.final_text
    sent = parts.tap.exchanges
    assert [x.status for x in sent] == [200] * len(sent)
    turns = fake.turns()
    assert all(t.status == 200 and (t.tokens or 0) <= WINDOW for t in turns), "nothing over the window"
    logs = await session_logs(parts.store)
    summaries, fallbacks = summaries_and_fallbacks(logs)
    assert fallbacks == 0

    client = await check_prefix_changes(parts, turns, CHAT, logs, summaries)
    assert fake.window.refuses(fake.window.count(client[-1]["tools"], *client[-1]["messages"])), "the run outgrows 16k"
