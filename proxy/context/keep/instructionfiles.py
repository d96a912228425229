"""Which files are an agent's instructions, and which tool calls read one whole.

Agents take standing instructions from files in the project or the home
directory (``AGENTS.md`` for Codex and many others, ``CLAUDE.md`` for Claude
Code, ``GEMINI.md`` for Gemini CLI, ``.cursorrules`` and the like). What the
agent reads of them must stay in front of it verbatim (``proxy.context.keep.pins``),
so the masker never hides such a read's output and the pins carry it past a
summary. A leaf module: both the masker and the pins ask it, and it asks
nothing of them.
"""

from __future__ import annotations

import shlex
from typing import Any

import orjson

from proxy.context.keep.artifactparse import command_text

#: File names that hold an agent's instructions, wherever they are.
NAMES = frozenset({
    "AGENTS.md", "AGENTS.override.md", "AGENT.md", "CLAUDE.md", "CLAUDE.local.md", "GEMINI.md", "QWEN.md",
    ".cursorrules", ".windsurfrules", ".clinerules", "copilot-instructions.md",
})
#: Argument names a read tool gives its file under (Claude Code, Gemini CLI, opencode, Qwen Code and others).
PATH_KEYS = ("file_path", "absolute_path", "filePath", "path", "filename", "file")
#: Arguments that make a read partial: a partial read is not the file's text.
PARTIAL_KEYS = ("offset", "limit", "start_line", "end_line", "line", "lines")


def is_instruction_file(path: str) -> bool:
    """Whether ``path`` names an instruction file (by its base name; Cursor's ``.cursor/rules/*.mdc`` too)."""
    path = path.replace("\\", "/").rstrip("/")
    name = path.rsplit("/", 1)[-1]
    return name in NAMES or (name.endswith(".mdc") and ".cursor/rules/" in f"/{path}")


def read_path(name: str, arguments: Any) -> str | None:
    """The instruction file a call reads whole (its path as the call gives it), or None (``whole_read``)."""
    path = whole_read(name, arguments)
    return path if path is not None and is_instruction_file(path) else None


def whole_read(name: str, arguments: Any) -> str | None:
    """The file a call reads whole (its path as the call gives it), or None.

    A read tool (a name holding ``read``, or ``view``) with a path argument and
    no range, or a shell call that is exactly ``cat <file>`` or PowerShell's
    ``Get-Content [-Raw] <file>`` (as Codex runs it on Windows).
    """
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    lowered = name.lower()
    if "read" in lowered or lowered == "view":
        if any(arguments.get(key) is not None for key in PARTIAL_KEYS):
            return None
        return next((value for key in PATH_KEYS if isinstance(value := arguments.get(key), str)), None)
    command = command_text(arguments.get("command", arguments.get("cmd")))
    if command is None:
        return None
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if len(argv) == 2 and argv[0] == "cat":
        return argv[1]
    if len(argv) > 1 and argv[0] == "Get-Content" and [a.lower() for a in argv[1:-1]] in ([], ["-raw"]):
        return argv[-1]
    return None
