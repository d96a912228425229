"""A fake Chat Completions upstream for the real aider: FakeChat's server, checks and refusals, answering each of
aider's turns with a scripted SEARCH/REPLACE edit.

aider offers no tools: the model edits files by writing blocks in its answer, in the edit format aider picked for
the model name (``diff`` for ``openai/gpt-5``: a file name, then a fenced ``<<<<<<< SEARCH`` / ``=======`` /
``>>>>>>> REPLACE`` block), and aider applies them to the files in its chat. Every request of aider's is a turn
(with git off and its history summary out of reach it makes no helper call).

Each user message of the run (``user_message``) asks for one step. The step is the last one named in the newest
user message, so a compacted history is answered the same: the proxy may place its summary in a user message with
the newest one merged at its end, after the user's earlier messages it carries verbatim. Step K adds the function
``step_K`` to one of ``FILES`` in turn, just before the file's end marker (the SEARCH text, so it matches whatever
the file held before), and explains it in about 300 tokens of prose; the last step's answer ends with
``final_text``. A request whose newest user message names no step is answered with a text that says so, which
changes no file and fails the test.
"""

from __future__ import annotations

import re
from typing import Any

from tests.fakechat import FakeChat
from tests.fakescript import content_text, final_text

#: The files the run edits, in turn; each starts as its end marker alone (``start``).
FILES = ("alpha.py", "beta.py", "gamma.py")
ASKED = re.compile(r"Step (\d+) of (\d+):")


def user_message(step: int, steps: int) -> str:
    """What the user types for one step (one line)."""
    return f"Step {step} of {steps}: add the function step_{step} to {file_of(step)}."


def file_of(step: int) -> str:
    return FILES[(step - 1) % len(FILES)]


def start(name: str) -> str:
    """A file's text before the run: its end marker, the SEARCH text of every edit. It does not end with the file's
    name: aider 0.86.2 takes a one-line SEARCH text that does for a file-name header, drops it and fails the edit."""
    return f"# {name} ends here.\n"


def function(step: int) -> str:
    """The function step ``step`` adds: about 150 tokens."""
    lines = [f"def step_{step}() -> list[int]:", f'    """The values of step {step}, one per line of its table."""',
             "    values = []"]
    lines += [f"    values.append({step} * {row} + {row * row})  # row {row} of step {step}" for row in range(1, 9)]
    return "\n".join([*lines, "    return values", "", ""])


def edit(step: int) -> str:
    """The SEARCH/REPLACE block of one step."""
    name = file_of(step)
    marker = start(name)
    return f"{name}\n```python\n<<<<<<< SEARCH\n{marker}=======\n{function(step)}{marker}>>>>>>> REPLACE\n```\n"


def explanation(step: int) -> str:
    """The prose around an edit: about 300 tokens, different at every step."""
    return "\n".join(f"Note {line} on step {step}: row {line} of the table is {step} times {line} plus {line * line},"
                     f" which gives {step * line + line * line}; the function returns the rows in order."
                     for line in range(1, 9))


def answer(step: int, steps: int) -> str:
    """The model's answer to one step."""
    text = f"I will add step_{step} to {file_of(step)}.\n\n{explanation(step)}\n\n{edit(step)}"
    return text + (f"\n{final_text(steps)}" if step == steps else "")


class FakeAider(FakeChat):
    """FakeChat answering aider: every request is a turn, answered by ``answer`` for the step it asks for."""

    def helper(self, body: dict[str, Any]) -> bool:
        return False

    def reply(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any] | None]:
        last = content_text(next((m for m in reversed(messages) if m.get("role") == "user"), {}).get("content"))
        asked = ASKED.findall(last)
        if not asked:
            return f"No step asked for in {last[:200]!r}.", None
        step, steps = asked[-1]
        return answer(int(step), int(steps)), None
