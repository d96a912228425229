"""Seven real agents, 30 long steps each, through the proxy in a 16k window: the proxy changes the prompt prefix at
most 7 times (one per five steps, issue 34), and a summary model that ignores the requested sections is a
summary all the same (issue 18).

Each agent (tests/agents.py: its own compaction off) runs 30 steps whose outputs are about 590 tokens
(``long_step``), through the recording tap in front of the proxy (tests/test_agents_proxy.py's rig), to the fake
upstream of its API, which holds a window of 16,000 tokens that the run does not fit. Qwen Code runs in 28,000:
its own head (tools and system prompt) is about 17,000 tokens, more than a 16k window holds beside any work.

The prefix changes the proxy made are counted from what the fake received (tests/prefixchanges.py: a turn that
does not begin with the previous turn, the client's own request extending its previous one), and that count is
the one the proxy reports (``ctxproxy_prefix_changes_total``, causes ``compaction`` and ``masking``). Each stands
on a checkpoint the proxy had just made: none comes of clipping, nor of a view rebuilt otherwise on the same one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.store.base import FactLog, StoredFact
from tests.agents import AgentRun, run_claude, run_cline, run_codex, run_gemini, run_opencode, run_pi, run_qwen
from tests.fakechat import FakeChat
from tests.fakegemini import FakeGemini
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Recorded, Recorder, Script, final_text
from tests.prefixchanges import (
    CHAT,
    GEMINI,
    MESSAGES,
    PROXY_CAUSES,
    RESPONSES,
    Door,
    agent_turns,
    proxy_made,
    replies,
    reported,
    unplanned,
)
from tests.proxyfixtures import read_log
from tests.test_agents_proxy import PROMPT, Rig, long_step, rig

STEPS = 30
WINDOW = 16_000
#: The proxy's prefix changes a run may make: one per five steps, the first at the start (issue 34).
MOST_CHANGES = 7
#: A run of 30 long steps takes an agent up to about two minutes on a busy machine.
TIMEOUT = 240.0


@dataclass(frozen=True)
class Agent:
    fake: Callable[[Script, int], Recorder]
    run: Callable[[str, Path, str], Awaitable[AgentRun]]
    #: What the agent's base URL adds to the proxy's root.
    path: str
    door: Door
    window: int = WINDOW


AGENTS = {
    "codex": Agent(FakeResponses, lambda url, root, prompt: run_codex(url, root, prompt, timeout=TIMEOUT),
                   "/v1", RESPONSES),
    "claude": Agent(FakeMessages, lambda url, root, prompt: run_claude(url, root, prompt, max_turns=STEPS + 5,
                                                                       timeout=TIMEOUT), "", MESSAGES),
    "opencode": Agent(FakeMessages, lambda url, root, prompt: run_opencode(url, root, prompt, timeout=TIMEOUT),
                      "/v1", MESSAGES),
    "pi": Agent(FakeResponses, lambda url, root, prompt: run_pi(url, root, prompt, timeout=TIMEOUT), "/v1", RESPONSES),
    "cline": Agent(FakeChat, lambda url, root, prompt: run_cline(url, root, prompt, timeout=TIMEOUT), "/v1", CHAT),
    "qwen": Agent(FakeChat, lambda url, root, prompt: run_qwen(url, root, prompt, timeout=TIMEOUT), "/v1", CHAT,
                  window=28_000),
    "gemini": Agent(FakeGemini, lambda url, root, prompt: run_gemini(url, root, prompt, timeout=TIMEOUT), "", GEMINI),
}
#: Agents whose 30 steps at 16k always need a summary (their head and outputs outgrow what masking frees): the
#: summary model's prose, without the sections asked for, must be accepted as one. The others may get by on
#: masking batches alone.
SUMMARISED = {"codex", "claude"}


async def session_logs(store: FactLog) -> list[list[StoredFact]]:
    """The log of each session of the run (opencode's title call may be one of its own)."""
    return [await read_log(store, key) async for key in store.sessions()]


def summaries_and_fallbacks(logs: list[list[StoredFact]]) -> tuple[int, int]:
    """Summaries logged, and checkpoints that fell back to elision, over every session of the run."""
    facts = [f for log in logs for f in log]
    made = [f.extra["checkpoint"] for f in facts if f.kind == "checkpoint"]
    assert made, "the proxy compacted on the way"
    return len([f for f in facts if f.kind == "summary"]), len([c for c in made if c.get("elision")])


async def metrics(proxy: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(proxy + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


@pytest.mark.parametrize("name", list(AGENTS))
async def test_real_agents_run_thirty_steps_in_16k_and_the_proxy_changes_the_prefix_at_most_once_in_five(
        aiohttp_server: Any, tmp_path: Path, name: str) -> None:
    agent = AGENTS[name]
    fake = agent.fake(Script(steps=STEPS, command=long_step), agent.window)
    fake.summary_style = "prose"  # no headings at all: a summary all the same
    parts = await rig(aiohttp_server, tmp_path, fake, agent.window, "known")
    run = await agent.run(parts.url + agent.path, tmp_path, PROMPT)

    assert (run.returncode, run.errors) == (0, []), run.stderr[-3000:]
    assert run.final_text is not None and final_text(STEPS) in run.final_text
    sent = parts.tap.exchanges
    assert [x.status for x in sent] == [200] * len(sent)
    turns = fake.turns()
    assert all(t.status == 200 and (t.tokens or 0) <= agent.window for t in turns), "nothing over the window"
    logs = await session_logs(parts.store)
    summaries, fallbacks = summaries_and_fallbacks(logs)
    assert fallbacks == 0 and (summaries >= 1 or name not in SUMMARISED), "the model's prose was accepted as a summary"

    await check_prefix_changes(parts, turns, agent.door, logs, summaries)


async def check_prefix_changes(parts: Rig, turns: list[Recorded], door: Door, logs: list[list[StoredFact]],
                               summaries: int) -> list[Any]:
    """The prefix changes the proxy made in a run of ``STEPS`` steps (counted from what the fake received, the
    same as it reports) stand each on a checkpoint it just made, and they and the summaries are at most
    ``MOST_CHANGES``. Returns the bodies of the agent's requests."""
    sent = parts.tap.exchanges
    upstream, client = agent_turns(turns, sent)
    assert len(client) == STEPS + 1
    changed = proxy_made(upstream, client, door)
    counted = reported(await metrics(parts.proxy))
    assert len(changed) == sum(counted.get(cause, 0) for cause in PROXY_CAUSES), (changed, counted)
    assert sum(len(replies(log)) for log in logs) == len(sent), "one reply logged per request"
    assert [unplanned(log) for log in logs] == [[] for _ in logs], "every change stands on a checkpoint just made"
    assert len(changed) <= MOST_CHANGES, f"{len(changed)} prefix changes in {STEPS} steps: {counted}"
    # Compactions that last (issue 19): Codex, with 8.5k of tools and instructions, made 29 summaries in 30 steps.
    assert summaries <= MOST_CHANGES, f"{summaries} summaries in {STEPS} steps"
    return client
