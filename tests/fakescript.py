"""What the fake upstreams of the real coding agents share: the step script, the summary, the window, the record.

The fakes (``tests/fakeresponses.py`` for Codex, ``tests/fakemessages.py`` for
Claude Code) drive a real agent through ``steps`` tool calls, each a cheap shell
command that prints ``step-K``, then end with a final text answer. Which step
comes next is read from the conversation itself (the last command the fake asked
for and the output the agent sent back), not from a counter in the fake: a
retried or compacted request gets the same answer, and a compacted view keeps
working as long as the latest tool round travels verbatim, which the proxy
promises. A tool output that does not show the step's marker ends the run with
a text that says so, so a broken tool round fails the test instead of looping.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.context.view.tokens import TokenCounter
from tests.fakeupstream import FACT, SUMMARY_MARKER, restyle, summary_fault

STEP = re.compile(r"step-(\d+)")
#: The sections the proxy's summariser asks for (proxy/context/summary/summarizer.py), in order.
SUMMARY_HEADINGS = (
    "## 1. Goals and constraints",
    "## 2. Work completed",
    "## 3. Key decisions",
    "## 4. Files touched",
    "## 5. Errors",
    "## 6. Current state",
    "## 7. Next steps",
    "## 8. Identifiers",
)


def step_command(step: int) -> str:
    """The shell command of one step: harmless, instant, and its output names the step."""
    return f"echo step-{step}"


def final_text(steps: int) -> str:
    return f"All {steps} steps done."


@dataclass
class Script:
    """``steps`` tool calls, then ``final_text``; ``command`` makes each step's shell command."""

    steps: int = 25
    command: Callable[[int], str] = step_command

    def next_step(self, last_command: str | None, last_output: str | None) -> int | str:
        """The step to ask for next, or the final (or failure) text to end with.

        ``last_command`` is the command of the latest tool call in the request and
        ``last_output`` what the agent answered to it; both ``None`` at the start.
        """
        if last_command is None:
            return 1 if self.steps > 0 else final_text(self.steps)
        asked = STEP.search(last_command)
        if asked is None:
            return f"The last tool call was not one of mine: {last_command!r}."
        step = int(asked.group(1))
        if last_output is None or f"step-{step}" not in last_output:
            return f"Step {step} printed nothing I recognise: {last_output!r}."
        return step + 1 if step < self.steps else final_text(self.steps)


def summary_text(shown: str) -> str:
    """A summary in the proxy's eight sections that keeps every FACT-… and step marker it was shown."""
    facts = " ".join(sorted(set(FACT.findall(shown)))) or "None"
    steps = sorted({int(n) for n in STEP.findall(shown)})
    done = f"Ran steps {steps[0]} to {steps[-1]}." if steps else "None"
    bodies = ("Run every scripted step, then answer.", done, "None", "None", "None",
              f"Last step seen: {steps[-1]}." if steps else "Nothing run yet.", "Continue with the next step.", facts)
    return "\n".join(f"{heading}\n{body}" for heading, body in zip(SUMMARY_HEADINGS, bodies, strict=True))


def is_summary_prompt(text: object) -> bool:
    """True for the proxy's summariser prompt, as a string or a list of text blocks/parts."""
    if isinstance(text, list) and text and isinstance(text[0], dict):
        text = text[0].get("text")
    return isinstance(text, str) and text.startswith(SUMMARY_MARKER)


@dataclass
class Recorded:
    """One request as the fake received it. ``kind``: turn, summary, compact, count_tokens, websocket, refused
    (``strict_fields``) or other."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    kind: str
    tokens: int | None = None
    status: int = 200
    #: The usage the fake billed for it, for every request it answered.
    usage: dict[str, Any] | None = None


def content_text(value: Any) -> str:
    """A string, or the texts of a list of content parts (or blocks) joined."""
    if isinstance(value, list):
        return "\n".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
    return value if isinstance(value, str) else ""


class Recorder:
    """What both API fakes share: the run they drive (``script``), their window and overflow shape, and what
    they keep of the requests they receive (``requests``)."""

    def __init__(self, script: Script | None = None, window: int | None = None, overflow: str = "http") -> None:
        self.script = script or Script()
        self.window = Window(window)
        self.overflow = overflow
        self.requests: list[Recorded] = []
        #: How the summary model answers: ``sections`` (as asked), one of ``tests.fakeupstream.MISBEHAVIOURS``, or
        #: ``PREAMBLE_CALL`` (each fake answers it in its API's shape).
        self.summary_style = "sections"

    async def summary(self, shown: object) -> str | web.Response:
        """The summary of what a summary request ``shown``, as this fake's summary model writes it (or its fault)."""
        fault = await summary_fault(self.summary_style)
        return fault if fault is not None else restyle(self.summary_style, summary_text(orjson.dumps(shown).decode()))

    def turns(self) -> list[Recorded]:
        return [r for r in self.requests if r.kind == "turn"]

    def _record(self, request: web.Request, body: Any, kind: str, **extra: Any) -> Recorded:
        recorded = Recorded(request.method, request.path, dict(request.query), dict(request.headers), body, kind,
                            **extra)
        self.requests.append(recorded)
        return recorded


@dataclass
class Window:
    """A context window in tokens (``None``: unlimited), counted with the proxy's tokenizer on the serialised prompt."""

    limit: int | None = None
    counter: TokenCounter = field(default_factory=TokenCounter)

    def count(self, *parts: object) -> int:
        return sum(self.counter.text_tokens(orjson.dumps(part).decode()) for part in parts if part)

    def refuses(self, tokens: int) -> bool:
        return self.limit is not None and tokens > self.limit


def cached_prefix(previous: Sequence[Any], current: Sequence[Any], counts: Sequence[int]) -> int:
    """Tokens (``counts``: per item of ``current``) of the leading items shared with ``previous``: a prefix cache."""
    total = 0
    for old, new, tokens in zip(previous, current, counts, strict=False):
        if old != new:
            break
        total += tokens
    return total


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event named by its ``type``, as both OpenAI and Anthropic send them."""
    name: str = event["type"]
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def pieces(text: str, size: int = 7) -> list[str]:
    """``text`` cut into small deltas, the way the APIs stream it."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    """The JSON events of a server-sent event stream, in order (``event:`` lines and comments skipped)."""
    events: list[dict[str, Any]] = []
    for block in raw.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                events.append(orjson.loads(line[6:]))
    return events
