"""The tools the demo's agent offers the model (Gemini CLI's names and arguments, in Chat Completions form)."""

from __future__ import annotations

from typing import Any


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {p: {"type": "string", "description": d} for p, d in params.items()},
        "required": list(params)}}}


TOOLS = [
    _tool("read_file", "Reads a whole file.", path="The file's path."),
    _tool("write_file", "Writes a file whole.", file_path="The file's path.", content="Its new text."),
    _tool("run_shell_command", "Runs a shell command.", command="The command line."),
]
