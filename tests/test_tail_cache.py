"""A Messages client that sets no breakpoint of its own pays the full input price for its prompt's tail on every
request (Anthropic caches at breakpoints only): the cache-aware timing (proxy.context.view.worth) then has nothing to
wait for, and reduces at once what a client with Claude Code's breakpoints has it defer mid-burst (issue 34).
Through the Messages door, on a simulated clock (no sleeps): the engine's pace reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.constants import HEADER_COMPACTED
from proxy.context.view.masking import PLACEHOLDER_PATTERN
from proxy.context.view.pace import SessionPace
from proxy.dialects import MESSAGES
from proxy.keys import engine_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.fakemessages import FakeMessages
from tests.fakescript import Script
from tests.proxyfixtures import MASKING_OFF
from tests.scripted import KEY, Claude, rig
from tests.test_cachewrites import Marking
from tests.test_worth import PACE, Clock

#: Steps of a run: the view stays under the trigger in all of them (16k window, ~400 tokens a step).
STEPS = 30


async def clocked(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path, fake: FakeMessages,
                  **overrides: Any) -> tuple[Any, Clock]:
    """The proxy over ``fake``, its engine's pace on a simulated clock."""
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, **overrides)
    clock = Clock()
    proxy.server.app[engine_key].pace = SessionPace(clock)
    return proxy, clock


def masked(body: dict[str, Any]) -> bool:
    """Whether a request the upstream received carries a masked tool output."""
    return any(PLACEHOLDER_PATTERN.search(str(block.get("content")))
               for message in body["messages"] if isinstance(message["content"], list)
               for block in message["content"] if block.get("type") == "tool_result")


async def first_masked_step(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path, kind: type[Claude]) -> int:
    """The step (counted from 0) whose request first reached the upstream masked, ``kind`` driving the run."""
    fake = FakeMessages(Script(steps=STEPS + 5))
    proxy, clock = await clocked(aiohttp_server, aiohttp_client, tmp_path / kind.__name__, fake,
                                 context_window=16_000, keep_tool_outputs=2)
    client = kind(proxy)
    for step in range(STEPS):
        clock.now += PACE
        resp = await client.step()
        body = fake.turns()[-1].body
        if masked(body):
            assert resp.headers[HEADER_COMPACTED] == "proactive"
            return step
    return STEPS


def test_the_messages_dialect_says_whether_the_clients_breakpoints_cache_the_tail() -> None:
    """Cached to its end: a breakpoint on one of the last blocks (Claude Code's, on the last), or a top-level one
    (automatic caching); not with none, nor with one on the system prompt alone, nor one further back than the
    API's look-back of 20 blocks."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n in range(15):
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"c{n}", "name": "Bash",
                                                         "input": {}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"c{n}", "content": "ok"}]}]
    mark = {"type": "ephemeral"}
    body = {"model": "claude-opus-5-5", "system": [{"type": "text", "text": "s", "cache_control": mark}],
            "messages": messages}
    assert not MESSAGES.caches_tail(body) and MESSAGES.caches_tail({**body, "cache_control": mark})
    at_end = [*messages[:-1], {**messages[-1], "content": [{**messages[-1]["content"][0], "cache_control": mark}]}]
    assert MESSAGES.caches_tail({**body, "messages": at_end})
    first = [{"role": "user", "content": [{"type": "text", "text": "go", "cache_control": mark}]}, *messages[1:]]
    assert not MESSAGES.caches_tail({**body, "messages": first}), "31 blocks before the end"


async def test_a_client_without_breakpoints_gets_its_masking_batch_mid_burst_where_claude_codes_waits(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """The same run twice: with a breakpoint on the last message (Claude Code's) the cache serves the whole prompt
    and a batch far below the trigger waits; with none, every step the batch waits is read at full price, and the
    batch is made mid-burst, far from the trigger."""
    uncached = await first_masked_step(aiohttp_server, aiohttp_client, tmp_path, Claude)
    cached = await first_masked_step(aiohttp_server, aiohttp_client, tmp_path, Marking)
    assert uncached < STEPS - 3 and cached == STEPS, (uncached, cached)


async def ready_summary(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path,
                        kind: type[Claude]) -> tuple[Claude, Clock]:
    """A run of ``kind`` with the summary tier alone, stepped until a background summary is done (logged, not yet
    used by any request)."""
    fake = FakeMessages(Script(steps=60))
    proxy, clock = await clocked(aiohttp_server, aiohttp_client, tmp_path / kind.__name__, fake,
                                 context_window=8_000, precompact_threshold=0.6, **MASKING_OFF)
    engine = proxy.server.app[engine_key]
    key = SessionKey(tenant_of(KEY), "claude-run")
    client = kind(proxy)
    while engine.background.running(key) is None:
        clock.now += PACE
        resp = await client.step()
        assert resp.headers[HEADER_COMPACTED] == "none"
        assert len(client.messages) < 80
    await engine.background.join(key)
    return client, clock


async def test_a_ready_background_summary_is_applied_at_once_when_the_tail_is_not_cached(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """Mid-burst, the next request after a background summary is in: Claude Code's waits for a cold moment (its
    cache serves the whole prompt), a client without breakpoints uses the summary at once."""
    client, clock = await ready_summary(aiohttp_server, aiohttp_client, tmp_path, Marking)
    clock.now += PACE
    assert (await client.step()).headers[HEADER_COMPACTED] == "none", "warm and cached: it waits"
    client, clock = await ready_summary(aiohttp_server, aiohttp_client, tmp_path, Claude)
    clock.now += PACE
    assert (await client.step()).headers[HEADER_COMPACTED] == "background", "uncached: used at once"
