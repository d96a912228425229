"""The scripted agent run and the fake upstream of ``bench/cost.py``.

The run: one task, 300 tool steps, a new user instruction every 60 steps.
Each step is a short thought and one call (read a file, run the tests, grep,
list, edit), answered by an output of the size such tools print: a file of
80-400 lines, a test log of 20-300 lines (now and then a long failing one),
a grep of a few dozen lines, an edit's one-line confirmation. Seeded, so every
configuration replays exactly the same run.

The fake upstream answers Chat Completions. Which step to answer is told by the
client in ``X-Bench-Step`` (a proxy forwards headers as they are), so a
compacted view gets the same answer as the full one. It reports ``usage``:
the prompt's tokens (counted per message with the proxy's tokenizer, tool
definitions included) and, as cached, the tokens of the longest run of leading
messages the session's previous request also began with (OpenAI and Anthropic
cache prefixes; this counts them per message). Summary requests get a summary
of realistic length in the eight sections the proxy requires, and are counted
apart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.context.summary.summarizer import SECTIONS
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT

STEPS = 300
USER_EVERY = 60
WORDS = ("config parser handler request retry socket buffer stream token index commit branch merge build test "
         "fixture assert value result error module function class import return yield await async cache store "
         "session window budget summary checkpoint").split()
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} tool", "parameters": {
    "type": "object", "properties": {"arg": {"type": "string"}}}}}
    for name in ("read_file", "run_tests", "grep", "list_dir", "edit_file")]
SYSTEM = "You are a coding agent working in a repository. " + " ".join(WORDS) * 20


@dataclass(frozen=True)
class Step:
    thought: str
    tool: str
    arguments: str
    output: str


def _code(rng: random.Random, lines: int) -> str:
    return "\n".join(f"{'    ' * rng.randint(0, 3)}{rng.choice(WORDS)}_{rng.randint(0, 99)} = "
                     f"{rng.choice(WORDS)}({rng.choice(WORDS)}, {rng.randint(0, 9999)})" for _ in range(lines))


def _log(rng: random.Random, lines: int) -> str:
    return "\n".join(f"tests/test_{rng.choice(WORDS)}.py::test_{rng.choice(WORDS)}_{i} "
                     f"{'PASSED' if rng.random() > 0.05 else 'FAILED'}" for i in range(lines))


def script(seed: int = 14) -> list[Step]:
    rng = random.Random(seed)
    steps = []
    for n in range(STEPS):
        kind = rng.choices(("read_file", "run_tests", "grep", "list_dir", "edit_file"), (35, 20, 20, 10, 15))[0]
        path = f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}_{n}.py"
        if kind == "read_file":
            output = _code(rng, rng.randint(80, 400))
        elif kind == "run_tests":
            output = _log(rng, rng.randint(800, 1500) if rng.random() < 0.1 else rng.randint(20, 300))
        elif kind == "grep":
            output = "\n".join(f"{path}:{rng.randint(1, 900)}: {_code(rng, 1)}" for _ in range(rng.randint(5, 60)))
        elif kind == "list_dir":
            output = "\n".join(f"{rng.choice(WORDS)}_{i}.py" for i in range(rng.randint(5, 40)))
        else:
            output = f"Edited {path}: {rng.randint(1, 40)} lines changed."
        thought = " ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 60)))
        steps.append(Step(thought, kind, orjson.dumps({"arg": path}).decode(), output))
    return steps


def instruction(n: int) -> str:
    return f"Instruction {n}: from now on keep every public function of module_{n} documented and typed."


def summary_answer(rng: random.Random) -> str:
    """About 700 tokens in the eight sections: what a summary model writes for a long run."""
    return "\n".join(f"## {i}. {title.split(':')[0]}\n" + " ".join(rng.choice(WORDS) for _ in range(80))
                     for i, title in enumerate(SECTIONS, 1))


@dataclass
class Turn:
    step: int
    prompt: int
    cached: int
    stable: bool


@dataclass
class Recorder:
    """The fake upstream: answers the scripted run, reports usage, records every request."""

    steps: list[Step]
    counter: TokenCounter = field(default_factory=lambda: TokenCounter(maxsize=200_000))
    turns: list[Turn] = field(default_factory=list)
    summary_calls: int = 0
    summary_prompt: int = 0
    _previous: dict[str, list[Any]] = field(default_factory=dict)
    _rng: random.Random = field(default_factory=lambda: random.Random(7))

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    def tokens(self, messages: list[Any]) -> list[int]:
        return [self.counter.message_tokens(CHAT, m) for m in messages]

    async def chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        messages = body["messages"]
        if str(messages[0].get("content", "")).startswith("You maintain the working memory"):
            self.summary_calls += 1
            self.summary_prompt += sum(self.tokens(messages))
            return self._answer({"role": "assistant", "content": summary_answer(self._rng)}, 0, 0, "stop")
        prompt = [body.get("tools"), *messages]
        counts = [self.counter.tools_tokens(body.get("tools")), *self.tokens(messages)]
        session = request.headers.get("X-Session-Id", "")
        previous = self._previous.get(session, [])
        shared = 0
        while shared < min(len(previous), len(prompt)) and previous[shared] == prompt[shared]:
            shared += 1
        self._previous[session] = prompt
        step = int(request.headers["X-Bench-Step"])
        self.turns.append(Turn(step, sum(counts), sum(counts[:shared]), shared == len(previous) > 0))
        if step >= len(self.steps):
            return self._answer({"role": "assistant", "content": "All done."}, sum(counts), sum(counts[:shared]),
                                "stop")
        planned = self.steps[step]
        call = {"id": f"call_{step}", "type": "function", "function": {"name": planned.tool,
                                                                       "arguments": planned.arguments}}
        return self._answer({"role": "assistant", "content": planned.thought, "tool_calls": [call]}, sum(counts),
                            sum(counts[:shared]), "tool_calls")

    @staticmethod
    def _answer(message: dict[str, Any], prompt: int, cached: int, finish: str) -> web.Response:
        return web.json_response({
            "id": "chatcmpl-cost", "object": "chat.completion", "model": "bench-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 50, "total_tokens": prompt + 50,
                      "prompt_tokens_details": {"cached_tokens": cached}}})
