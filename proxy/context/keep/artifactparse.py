"""Text the artifact trail reads exactly: patches, command lines and how a command ended.

Three small parsers for ``proxy.context.keep.artifacts``, each a function of one
string, none of them a guess: a patch names its files in fixed header lines
(Codex's ``*** Add File:`` envelope, a unified diff's ``---``/``+++``); a shell
call's command is an argv list or a string, often wrapped in ``bash -lc``; and
a result states its exit status in a header the client writes (Codex's ``Exit
code: N`` / ``Process exited with code N`` / JSON ``metadata.exit_code``,
Claude Code's ``Exit code N``, Gemini CLI's ``Exit Code: N``). A result that
states none gets no status: a line that merely looks like an error in a
command's output is the command's business, not evidence of how it ended.
Where the client says it refused the call or declined it
(``proxy.context.keep.refusals``), that is how it ended.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Any

import orjson

from proxy.context.keep.refusals import declined, reason, refused
from proxy.context.keep.shellwrites import bodies

#: Longest command text or error line an artifact carries.
NAME_CHARS = 200
LINE_CHARS = 160
_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "fish", "pwsh", "powershell"})
CODEX_FILE = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.+?)\s*$")
CODEX_MOVE = re.compile(r"^\*\*\* Move to: (.+?)\s*$")
_DIFF_OLD = re.compile(r"^--- (?:a/)?(.+?)(?:\t.*)?\s*$")
_DIFF_NEW = re.compile(r"^\+\+\+ (?:b/)?(.+?)(?:\t.*)?\s*$")
_GIT_RENAME = re.compile(r"^rename (from|to) (.+?)\s*$")
_EXIT = re.compile(r"^\W*(?:exit(?:ed with)? (?:code|status)|(?:process|command) exited with code|exit_code)\b[:=]?\s*"
                   r"(-?\d+)",
                   re.IGNORECASE)
#: What marks a line that says what went wrong, strongest first; a traceback's own first line only when nothing
#: better shows. Plain strings, found with ``str.find``: a regex alternation is twenty times slower on 30 KB.
ERROR_MARKS = (
    ("Error:", "Exception:", "error:", "ERROR:", "fatal:", "FATAL:"),
    ("command not found", "No such file", "Permission denied", "failed", "Failed", "FAILED", "ERROR "),
    ("Traceback (most recent call last)",),
)
#: A field a client prints empty (Gemini CLI's ``Error: (none)``, ``Signal: (none)``): no error, whatever its name.
NOTHING_LINE = re.compile(r":\s*\((?:none|empty)\)\s*$")
_TAG = re.compile(r"</?tool_use_error>")
#: Lines of a result looked at for a status header: its head (or all before Codex's ``Output:``) and its tail.
HEAD_LINES, TAIL_LINES = 8, 8
#: Characters of a result searched for an error line.
SCAN_CHARS = 200_000


def clip(text: str, limit: int) -> str:
    """``text`` with whitespace folded to single spaces, cut to ``limit`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def command_name(command: str) -> str:
    """``command`` as a trail line names it: clipped to ``NAME_CHARS``, and when it is longer, each heredoc or
    here-string body that its delimiter closes shown as how many lines it had (``cat > a.py <<'EOF' …(42 lines)…
    EOF``), so that what the command does with a body (its target, what follows it) survives the clip. The body is
    not lost: the log holds the whole command, and the literals a heredoc write's text
    (``proxy.context.keep.literals``)."""
    closed = [body for body in bodies(command) if body.closed and body.end > body.start]
    if not closed or len(" ".join(command.split())) <= NAME_CHARS:
        return clip(command, NAME_CHARS)
    lines = command.splitlines()
    for body in reversed(closed):
        count = body.end - body.start
        lines[body.start:body.end] = [f"…({count} line{'' if count == 1 else 's'})…"]
    return clip("\n".join(lines), NAME_CHARS)


def patch_files(patch: str) -> list[tuple[str, str]]:
    """(path, action) for each file a patch touches, in patch order: Codex's envelope or a unified diff.

    A move yields the new path ``moved from <old>`` and the old one ``moved to <new>``.
    """
    if "*** Begin Patch" in patch or _has_codex_header(patch):
        return _codex_files(patch)
    return _diff_files(patch)


def _has_codex_header(patch: str) -> bool:
    return any(CODEX_FILE.match(line) for line in patch.splitlines())


def _codex_files(patch: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    current: str | None = None
    for line in patch.splitlines():
        header = CODEX_FILE.match(line)
        if header is not None:
            verb, current = header.group(1), header.group(2)
            out.append((current, {"Add": "created", "Update": "edited", "Delete": "deleted"}[verb]))
            continue
        move = CODEX_MOVE.match(line)
        if move is not None and current is not None:
            target = move.group(1)
            out[-1] = (current, f"moved to {target}")
            out.append((target, f"moved from {current}"))
            current = None
    return out


def _diff_files(patch: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    old: str | None = None
    renamed: dict[str, str] = {}
    for line in patch.splitlines():
        rename = _GIT_RENAME.match(line)
        if rename is not None:
            renamed[rename.group(1)] = rename.group(2)
            if "from" in renamed and "to" in renamed:
                source, target = renamed["from"], renamed["to"]
                out += [(source, f"moved to {target}"), (target, f"moved from {source}")]
                renamed = {}
            continue
        if line.startswith("--- "):
            found = _DIFF_OLD.match(line)
            old = found.group(1) if found else None
        elif line.startswith("+++ ") and old is not None:
            found = _DIFF_NEW.match(line)
            new = found.group(1) if found else "/dev/null"
            if new == "/dev/null":
                out.append((old, "deleted"))
            elif old == "/dev/null":
                out.append((new, "created"))
            elif not any(path == new for path, _ in out):
                out.append((new, "edited"))
            old = None
    return out


def parsed_arguments(arguments: Any) -> Any:
    """Arguments as a dict where they are one (or JSON of one); a string that is not JSON stays text."""
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
        return parsed if isinstance(parsed, dict | str) else None
    return arguments if isinstance(arguments, dict) else None


def command_text(value: Any) -> str | None:
    """A shell call's command as one line: argv joined as a shell would read it, ``bash -lc "…"`` unwrapped.

    ``None`` when ``value`` is no command (not a string, nor a list of strings).
    """
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError:
            return value.strip() or None
        script = _unwrapped(argv)
        return (script if script is not None else value).strip() or None
    if isinstance(value, list) and value and all(isinstance(part, str) for part in value):
        script = _unwrapped(value)
        return (script if script is not None else shlex.join(value)).strip() or None
    return None


def _unwrapped(argv: list[str]) -> str | None:
    """The script of ``[bash, -lc, script]`` (any shell, any flags ending in ``c``); None for other argv."""
    if len(argv) >= 3 and argv[0].rsplit("/", 1)[-1] in _SHELLS:
        flags = argv[1:-1]
        if flags and all(flag.startswith("-") for flag in flags) and flags[-1].endswith("c"):
            return argv[-1]
    return None


def patch_in_command(command: str) -> str | None:
    """The patch a command feeds to ``apply_patch`` (or ``git apply`` / ``patch``), as Codex runs it in a shell."""
    if "*** Begin Patch" in command:
        return command[command.index("*** Begin Patch"):]
    if "\n+++ " in command and re.search(r"\b(?:apply_patch|git apply|patch)\b", command):
        return command
    return None


def outcome(text: str, is_error: bool) -> str:
    """How a call ended, as its result states it: ``exit 0``, ``exit 2: <line>``, ``error: <line>``, ``refused:
    <line>`` (its client's answer that it never ran, and why: ``proxy.context.keep.refusals``), or ``""``. A call
    its client declined (perhaps after it started) is an error as if the result were flagged one."""
    if refused(text):
        return f"refused: {clip(reason(text), LINE_CHARS)}"
    is_error = is_error or declined(text)
    body, code = _codex_json(text)
    if code is None:
        code = _exit_code(text)
    if code == 0:
        return "exit 0"
    if code is not None:
        line = error_line(body)
        return f"exit {code}: {line}" if line else f"exit {code}"
    if is_error:
        line = error_line(body) or _first_line(body)
        return f"error: {line}" if line else "error"
    return ""


def status_line(text: str) -> str:
    """The line of a result that states a non-zero exit status, exactly as written (``""``: none states one)."""
    for line in (*text.split("\n", HEAD_LINES)[:HEAD_LINES], *text.rsplit("\n", TAIL_LINES)[1:]):
        found = _EXIT.match(line.strip())
        if found is not None and int(found.group(1)) != 0:
            return line.strip()
    return ""


def _codex_json(text: str) -> tuple[str, int | None]:
    """Codex's older shell output, ``{"output": "…", "metadata": {"exit_code": N}}``: its output and code."""
    if not text.lstrip().startswith("{"):
        return text, None
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text, None
    metadata = parsed.get("metadata") if isinstance(parsed, dict) else None
    code = metadata.get("exit_code") if isinstance(metadata, dict) else None
    output = parsed.get("output") if isinstance(parsed, dict) else None
    if not isinstance(code, int) or isinstance(code, bool):
        return text, None
    return (output if isinstance(output, str) else ""), code


def _exit_code(text: str) -> int | None:
    pieces = text.split("\n", HEAD_LINES)
    head = pieces[:HEAD_LINES]
    for at, line in enumerate(head):
        if line.strip() == "Output:":  # Codex: the status is in the header, the rest is the command's own output
            return _first_code(head[:at])
    found = _first_code(head)
    if found is not None or len(pieces) <= HEAD_LINES:  # no tail beyond the head
        return found
    return _first_code(text.rsplit("\n", TAIL_LINES)[1:])


def _first_code(lines: Iterable[str]) -> int | None:
    for line in lines:
        found = _EXIT.match(line.strip())
        if found is not None:
            return int(found.group(1))
    return None


def error_line(text: str) -> str:
    """The first line of ``text`` that says what went wrong (clipped), or ``""``.

    Each mark is looked for with ``str.find`` from where the last candidate
    line ended, so a long output costs a few scans at C speed.
    """
    text = text[:SCAN_CHARS]
    for marks in ERROR_MARKS:
        found = {mark: text.find(mark) for mark in marks}
        while any(at >= 0 for at in found.values()):
            at = min(at for at in found.values() if at >= 0)
            start = text.rfind("\n", 0, at) + 1
            end = text.find("\n", at)
            end = end if end >= 0 else len(text)
            line = text[start:end].strip()
            if not (NOTHING_LINE.search(line) or _EXIT.match(line)):
                return clip(_TAG.sub("", line), LINE_CHARS)
            found = {mark: text.find(mark, end) if 0 <= where < end else where for mark, where in found.items()}
    return ""


def _first_line(text: str) -> str:
    line = next((line for line in text[:SCAN_CHARS].splitlines() if line.strip()), "")
    return clip(_TAG.sub("", line), LINE_CHARS)
