"""Which files are an agent's instructions, and which tool calls read one whole.

Agents take standing instructions from files in the project or the home
directory (``AGENTS.md`` for Codex and many others, ``CLAUDE.md`` for Claude
Code, ``GEMINI.md`` for Gemini CLI, ``.cursorrules`` and the like). What the
agent reads of them must stay in front of it verbatim (``proxy.context.keep.pins``),
so the masker never hides such a read's output and the pins carry it past a
summary. A leaf module: both the masker and the pins ask it, and it asks
nothing of them (which calls read a file whole is ``proxy.context.keep.toolkinds``'
to say).
"""

from __future__ import annotations

from typing import Any

from proxy.context.keep.toolkinds import whole_read

#: File names that hold an agent's instructions, wherever they are.
NAMES = frozenset({
    "AGENTS.md", "AGENTS.override.md", "AGENT.md", "CLAUDE.md", "CLAUDE.local.md", "GEMINI.md", "QWEN.md",
    ".cursorrules", ".windsurfrules", ".clinerules", "copilot-instructions.md",
})


def is_instruction_file(path: str) -> bool:
    """Whether ``path`` names an instruction file (by its base name; Cursor's ``.cursor/rules/*.mdc`` too)."""
    path = path.replace("\\", "/").rstrip("/")
    name = path.rsplit("/", 1)[-1]
    return name in NAMES or (name.endswith(".mdc") and ".cursor/rules/" in f"/{path}")


def read_path(name: str, arguments: Any) -> str | None:
    """The instruction file a call reads whole (its path as the call gives it), or None (``whole_read``)."""
    path = whole_read(name, arguments)
    return path if path is not None and is_instruction_file(path) else None
