"""Issue 33, item 3: a literal from step 1 of a 200-step run is still in the view after 20 compactions.

The run goes through the Chat door in a small window (masking off, so every
compaction is a summary). Step 1's tool output carries a literal, nowhere else
in the run. The summary model "keeps what it is given": its first summary lists
the literal under "Identifiers worth keeping"; each later answer gives only the
sections that change (as the update prompt asks), each written whole from what
it was given plus the new range, and only the new identifiers. Rewritten whole
(the summary before issue 33), the summary lost the literal at its second
compaction. A summary model that now and then answers in another format
(German prose, no sections) does not wipe the previous summary either.
"""

from __future__ import annotations

import random
import re
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.app import create_app
from proxy.context.checkpoint import Checkpoint
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakescript import content_text
from tests.fakeupstream import SECTION_TITLES, FakeUpstream, Reply, summary_response
from tests.proxyfixtures import MASKING_OFF, read_log
from tests.test_compaction_e2e import prose

WINDOW = 8_000
STEPS = 200
KEY = "sk-summary-updates"
SESSION = "two-hundred-steps"
LITERAL = "LIT-7f3a9c41"
STEP = re.compile(r"step-(\d+)")


def section_lines(summary: str, number: int) -> list[str]:
    """The lines under ``## number.`` in a summary written in the proxy's sections."""
    match = re.search(rf"^## {number}\. .*$", summary, re.MULTILINE)
    if match is None:
        return []
    body = summary[match.end():].split("\n## ", 1)[0]
    return [line for line in body.strip().splitlines() if line.strip() and line.strip() != "None"]


class Updater(FakeUpstream):
    """A summary model that keeps what it is given; every ``misbehave_every``-th answer is German prose instead."""

    def __init__(self, misbehave_every: int = 0) -> None:
        super().__init__()
        self.misbehave_every = misbehave_every
        self.misbehaved = 0

    async def summary(self, body: dict[str, Any]) -> web.Response:
        self.summary_requests.append(body)
        prompt = content_text(body["messages"][-1]["content"])
        new = prompt.split("<new-messages>\n", 1)[1].split("\n</new-messages>", 1)[0]
        previous = (prompt.split("<previous-summary>\n", 1)[1].split("\n</previous-summary>", 1)[0]
                    if "<previous-summary>" in prompt else None)
        steps = sorted({int(n) for n in STEP.findall(new)}) or [0]
        first, last = steps[0], steps[-1]
        if self.misbehave_every and len(self.summary_requests) % self.misbehave_every == 0:
            self.misbehaved += 1
            text = f"Zusammenfassung: Schritte {first} bis {last} erledigt, der Parser wird weiter portiert."
        else:
            text = self.answer(previous, new, first, last)
        self.summary_answers.append(text)
        return summary_response(text)

    @staticmethod
    def answer(previous: str | None, new: str, first: int, last: int) -> str:
        work = f"- Steps {first} to {last}: wrote the parser modules and ran their tests, all of them passing."
        identifiers = [*sorted(set(re.findall(r"LIT-\w+", new))), f"src/parser/mod_{last | 1}.py"]
        sections = {2: "\n".join([*(section_lines(previous, 2) if previous else []), work]),
                    6: f"Last step seen: {last}.", 8: "\n".join(f"- `{i}`" for i in identifiers)}
        if previous is None:
            sections |= {1: "Port the parser, one module at a time.", 7: "Continue with the next module."}
        return "\n".join(f"## {n}. {SECTION_TITLES[n - 1]}\n{sections[n]}" for n in sorted(sections))


async def run(proxy: Any, fake: Updater) -> list[Any]:
    """STEPS tool steps, each output a few hundred tokens; step 1's carries LITERAL. Returns every view sent."""
    rng = random.Random(33)
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
             for name in ("write_file", "run_shell_command")]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Port the parser, one module at a time."}]
    for step in range(1, STEPS + 1):
        name, arguments = (("write_file", {"file_path": f"src/parser/mod_{step}.py", "content": "# module\n"})
                           if step % 2 else ("run_shell_command", {"command": f"pytest tests/test_mod_{step}.py"}))
        fake.script.append(Reply(tool_calls=[{"id": f"call_{step}", "type": "function", "function": {
            "name": name, "arguments": orjson.dumps(arguments).decode()}}]))
        resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(
            {"model": "m", "messages": messages, "tools": tools}),
            headers={"Authorization": f"Bearer {KEY}", "X-Session-Id": SESSION})
        raw = await resp.read()
        assert resp.status == 200, raw[:400]
        reply = orjson.loads(raw)["choices"][0]["message"]
        output = f"step-{step}\n" + (f"Server up; build token {LITERAL}.\n" if step == 1 else "") + prose(rng, 300)
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": output}]
    return [request["messages"] for request in fake.requests]


@pytest.mark.parametrize("misbehave_every", [0, 4], ids=["keeps-what-it-is-given", "another-format-now-and-then"])
async def test_a_literal_from_step_1_survives_20_compactions(aiohttp_server: Any, aiohttp_client: Any,
                                                            tmp_path: Any, misbehave_every: int) -> None:
    fake = Updater(misbehave_every)
    fake.window = WINDOW
    upstream = await aiohttp_server(fake.app())
    proxy = await aiohttp_client(create_app(Settings(
        upstream=str(upstream.make_url("/v1")), store=f"sqlite:///{tmp_path}/facts.db", context_window=WINDOW,
        summary_max_tokens=1_024, precompact_threshold=1.0, **MASKING_OFF)))
    views = await run(proxy, fake)

    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of(KEY), SESSION))
    summaries = [Checkpoint.from_json(f.extra["checkpoint"]).summary for f in facts if f.kind == "checkpoint"]
    changed = [s for s, before in zip(summaries, ["", *summaries], strict=False) if s and s != before]
    assert len(changed) >= 20, f"{len(changed)} compactions wrote a new summary"
    assert fake.refused == 0 and max(fake.prompt_tokens) <= WINDOW
    assert "Server up; build token" not in orjson.dumps(views[-1]).decode(), "step 1's output left the view"
    assert f"`{LITERAL}`" in changed[-1], "the last summary still lists it"
    assert LITERAL in orjson.dumps(views[-1]).decode(), "the last view holds it"
    if misbehave_every:
        assert fake.misbehaved >= 4
        assert "## 1. Goals" in changed[-1] and "Port the parser" in changed[-1], "the first summary's goals too"
