"""The working set against the disk: the real Claude Code and the real Codex edit files through the proxy in a 16k
window, and after the proxy's compactions the files' sections in the last upstream request are the files' bytes.

A scripted model (a fake upstream that answers each turn with the next call of its plan, read from the newest tool
call in the request, which survives every compaction) makes the agent create a file, read it, edit it in two calls
in different places, read a second file the test wrote beforehand and edit that, then run shell steps whose output
is a few KB each, so the conversation outgrows the window and the proxy compacts it (the agent's own auto-compaction
off, tests/agents.py): Claude Code with ``Write``, ``Read`` and two ``Edit`` calls; Codex with ``apply_patch`` (an
added file, then two updates, the second of two hunks) and ``cat`` or ``sed -n '1,200p'`` for its reads. The agent's
tools do the work on a real directory, so what is on disk at the end is what the tools wrote, in the agent's own
formats (Claude Code's numbered ``Read`` output; Codex's patch results and its shell output header). All edits come
before the shell steps, so every compaction sees each file's final text: in the last request the fake received, each
``### PATH (current as of log entry N)`` section must hold exactly the bytes of that file on disk, N must be the log
entry of the file's last change, and both files must be there.

The second file has no newline at its end, as many files do: its section says so in its heading (the newline
before the closing fence is not the file's) and is read back so; Codex's ``cat`` shows it without one (its output
is passed on to the last byte), and its ``apply_patch`` gives it one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.context.keep.literals import strings
from proxy.sessions import credential, tenant_of
from proxy.store.base import FactLog, SessionKey
from tests.agents import AgentRun, run_claude, run_codex
from tests.fakemessages import FakeMessages, _blocks
from tests.fakeresponses import FakeResponses
from tests.fakescript import content_text
from tests.proxyfixtures import read_log
from tests.test_agents_proxy import Rig, rig

WINDOW = 16_000
PROMPT = "Make the scripted edits, run the scripted steps, then say that you are done."
DONE = "All scripted edits and steps done."
BULKY_STEPS = 16
#: A section of the working set as ``proxy.context.keep.workingset`` renders a whole file.
SECTION = re.compile(r"### (?P<path>\S+) \(current as of log entry (?P<seq>\d+)(?P<bare>; no newline at end of file)?"
                     r"\)\n(?P<fence>`{3,})\n(?P<text>.*?)(?P=fence)", re.DOTALL)

FIRST = ("def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n"
         "    return 2 * (width + height)\n\n\nif __name__ == \"__main__\":\n    print(area(3, 4))\n")
SECOND = "# service settings\nhost = 127.0.0.1\nport = 8080\nworkers = 2\nlog_level = info\n"
#: The second file as many are written: no newline at its end (Claude Code's ``Read`` then numbers no empty line).
SECOND_BARE = SECOND.removesuffix("\n")
#: (old, new) of the edits of the first file, in three places (Claude Code makes the first and the last), and of
#: the one edit of the second.
AREA = ("    return width * height\n", "    # both sides in metres\n    return width * height\n")
PERIMETER = ("    return 2 * (width + height)\n", "    return 2 * width + 2 * height\n")
MAIN = ("    print(area(3, 4))\n", "    print(area(3, 4), perimeter(3, 4))\n")
SECOND_EDIT = ("port = 8080\n", "port = 9090\n")
#: Codex's patches as a model writes them: the first file's edits in two calls, the second with two hunks (context
#: lines, an ``@@`` header naming a line, ``*** End of File``); then the second file's edit.
CODEX_PATCHES = [
    "*** Begin Patch\n*** Update File: geometry.py\n@@ def area(width, height):\n-    return width * height\n"
    "+    # both sides in metres\n+    return width * height\n*** End Patch",
    "*** Begin Patch\n*** Update File: geometry.py\n@@\n def perimeter(width, height):\n"
    "-    return 2 * (width + height)\n+    return 2 * width + 2 * height\n@@\n if __name__ == \"__main__\":\n"
    "-    print(area(3, 4))\n+    print(area(3, 4), perimeter(3, 4))\n*** End of File\n*** End Patch",
    "*** Begin Patch\n*** Update File: service.conf\n@@\n host = 127.0.0.1\n-port = 8080\n+port = 9090\n"
    " workers = 2\n*** End Patch"]


def bulky(step: int) -> str:
    """A shell step printing about 2 KB (some 800 tokens)."""
    return f"seq 10000 10400 && echo bulk-{step}"


def expected(edits: list[tuple[str, str]], second: str) -> tuple[str, str]:
    """What the two files hold at the end, the first edited by ``edits``, the second starting as ``second``, if
    every tool did its work."""
    first = FIRST
    for old, new in edits:
        first = first.replace(old, new)
    return first, second.replace(*SECOND_EDIT)


def sections(body: Any) -> dict[str, tuple[int, str]]:
    """The working set's whole-file sections in a request: path -> (log entry, text)."""
    found: dict[str, tuple[int, str]] = {}
    for string in strings(body, []):
        for match in SECTION.finditer(string):
            text = match.group("text")
            if match.group("bare"):  # the line before the fence ends with a newline that is not the file's
                assert text.endswith("\n")
                text = text[:-1]
            found[match.group("path")] = (int(match.group("seq")), text)
    return found


async def result_seq(store: FactLog, headers: Any, session: str, call_id: str) -> int:
    """The seq of the log entry holding the result of the call ``call_id``."""
    facts = await read_log(store, SessionKey(tenant_of(credential(headers)), session))
    return next(f.seq for f in facts if f.kind == "message" and call_id in orjson.dumps(f.message).decode()
                and (f.message.get("role") == "user" or str(f.message.get("type", "")).endswith("_output")))




# -- Claude Code ---------------------------------------------------------------------------------


class PlannedMessages(FakeMessages):
    """A Messages fake that answers each turn with the next ``(tool, input)`` of ``plan``, then ``DONE``."""

    def __init__(self, plan: list[tuple[str, dict[str, Any]]], window: int) -> None:
        super().__init__(window=window)
        self.plan = plan
        #: The step of each call handed out, and what the agent answered to it.
        self.step_of: dict[str, int] = {}
        self.results: dict[int, str] = {}
        self.call_of: dict[int, str] = {}

    def _turn_output(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
        blocks = [b for m in messages for b in _blocks(m)]
        calls = [b["id"] for b in blocks if b.get("type") == "tool_use" and b.get("id") in self.step_of]
        step = self.step_of[calls[-1]] + 1 if calls else 0
        for block in blocks:
            if block.get("type") == "tool_result" and block.get("tool_use_id") in self.step_of:
                self.results[self.step_of[block["tool_use_id"]]] = content_text(block.get("content"))
        if step >= len(self.plan):
            return [{"type": "text", "text": DONE}], "end_turn"
        name, arguments = self.plan[step]
        call_id = f"toolu_{next(self._ids):06d}"
        self.step_of[call_id] = step
        self.call_of[step] = call_id
        return [{"type": "tool_use", "id": call_id, "name": name, "input": arguments}], "tool_use"


async def test_claude_codes_files_in_the_working_set_are_the_files_on_disk(aiohttp_server, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    first, second = work / "geometry.py", work / "service.conf"
    second.write_text(SECOND_BARE)
    plan: list[tuple[str, dict[str, Any]]] = [
        ("Write", {"file_path": str(first), "content": FIRST}),
        ("Read", {"file_path": str(first)}),
        *[("Edit", {"file_path": str(first), "old_string": old, "new_string": new}) for old, new in (AREA, MAIN)],
        ("Read", {"file_path": str(second)}),
        ("Edit", {"file_path": str(second), "old_string": SECOND_EDIT[0], "new_string": SECOND_EDIT[1]}),
        *[("Bash", {"command": bulky(n), "description": f"Print bulk {n}"}) for n in range(1, BULKY_STEPS + 1)]]
    fake = PlannedMessages(plan, WINDOW)
    parts = await rig(aiohttp_server, tmp_path, fake, WINDOW, "known")
    run: AgentRun = await run_claude(parts.url, tmp_path, PROMPT, max_turns=len(plan) + 5,
                                     tools="Bash,Read,Edit,Write")

    await check_run(run, fake, parts, expected([AREA, MAIN], SECOND_BARE), "X-Claude-Code-Session-Id",
              {str(first): first, str(second): second})


# -- Codex ---------------------------------------------------------------------------------------


def add_patch(path: str, text: str) -> str:
    return "\n".join(["*** Begin Patch", f"*** Add File: {path}", *(f"+{line}" for line in text.splitlines()),
                      "*** End Patch"])


class PlannedResponses(FakeResponses):
    """A Responses fake that answers each turn with the next call of ``plan`` (``("patch", text)``: Codex's
    ``apply_patch`` custom tool; ``("shell", command)``: ``exec_command``), then ``DONE``."""

    def __init__(self, plan: list[tuple[str, str]], window: int) -> None:
        super().__init__(window=window)
        self.plan = plan
        self.step_of: dict[str, int] = {}
        self.results: dict[int, str] = {}
        self.call_of: dict[int, str] = {}

    def _turn_output(self, body: dict[str, Any], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        calls = [i["call_id"] for i in items if i.get("type") in ("function_call", "custom_tool_call")
                 and i.get("call_id") in self.step_of]
        step = self.step_of[calls[-1]] + 1 if calls else 0
        for item in items:
            if str(item.get("type")).endswith("_output") and item.get("call_id") in self.step_of:
                self.results[self.step_of[item["call_id"]]] = content_text(item.get("output"))
        if step >= len(self.plan):
            return [self._message(DONE)]
        kind, text = self.plan[step]
        n = next(self._ids)
        call_id = f"call_{n}"
        self.step_of[call_id] = step
        self.call_of[step] = call_id
        if kind == "patch":
            return [{"type": "custom_tool_call", "id": f"ctc_{n}", "call_id": call_id, "status": "completed",
                     "name": "apply_patch", "input": text}]
        return [{"type": "function_call", "id": f"fc_{n}", "call_id": call_id, "status": "completed",
                 "name": "exec_command", "arguments": orjson.dumps({"cmd": text}).decode()}]


@pytest.mark.parametrize("read", ["cat", "sed -n '1,200p'"])
async def test_codexs_patched_files_in_the_working_set_are_the_files_on_disk(aiohttp_server, tmp_path: Path,
                                                                             read: str) -> None:
    """Codex reads with ``cat`` or, as it mostly does, ``sed -n '1,200p'`` (the whole file where it has fewer lines):
    the second file's text is known only from that read, which its patch then edits."""
    work = tmp_path / "work"
    work.mkdir()
    first, second = work / "geometry.py", work / "service.conf"
    second.write_text(SECOND_BARE)
    plan: list[tuple[str, str]] = [
        ("patch", add_patch("geometry.py", FIRST)),
        ("shell", f"{read} geometry.py"),
        *[("patch", patch) for patch in CODEX_PATCHES[:2]],
        ("shell", f"{read} service.conf"),
        ("patch", CODEX_PATCHES[2]),
        *[("shell", bulky(n)) for n in range(1, BULKY_STEPS + 1)]]
    fake = PlannedResponses(plan, WINDOW)
    parts = await rig(aiohttp_server, tmp_path, fake, WINDOW, "known")
    run: AgentRun = await run_codex(parts.url + "/v1", tmp_path, PROMPT)

    await check_run(run, fake, parts, expected([AREA, PERIMETER, MAIN], SECOND), "session-id",
                    {"geometry.py": first, "service.conf": second})


# -- the check ----------------------------------------------------------------------------------


async def check_run(run: AgentRun, fake: PlannedMessages | PlannedResponses, parts: Rig, texts: tuple[str, str],
                    session_header: str, disk: dict[str, Path]) -> None:
    """The agent did every step of the plan (the files on disk hold ``texts``: the tools did what they were asked),
    the proxy compacted, and in the last request the fake received each file's section (``disk``: the path as the
    agent named it, first file first) is its bytes on disk, current as of the log entry of its last change (the
    plan's fourth and sixth calls)."""
    assert (run.returncode, run.errors, run.final_text) == (0, [], DONE), (run.stderr, fake.results)
    assert tuple(path.read_text() for path in disk.values()) == texts, fake.results
    assert f"bulk-{BULKY_STEPS}" in fake.results[len(fake.plan) - 1]
    assert any(r.kind == "summary" for r in fake.requests), "the proxy compacted"
    headers = parts.tap.exchanges[0].headers
    seqs = {path: await result_seq(parts.store, headers, headers[session_header], fake.call_of[step])
            for path, step in zip(disk, (3, 5), strict=True)}
    found = sections(fake.turns()[-1].body)
    assert set(found) == set(disk), f"the working set carried {sorted(found)}, not {sorted(disk)}"
    for path, (seq, text) in found.items():
        assert text.encode() == disk[path].read_bytes(), path
        assert seq == seqs[path], path
