"""Where ``ctxproxy run AGENT`` finds the agent's program, and how to install one it cannot find.

First PATH, as a shell would; then, when ctxproxy runs from a checkout, the pinned
agents ``scripts/install-clients`` puts in ``tests/clients/node_modules/.bin``
(which is on no PATH), so a fresh clone runs its own agents without a global install.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import proxy

#: The checkout's pinned agents; absent when ctxproxy is an installed package (nothing of tests/ is shipped).
CHECKOUT_AGENTS = Path(proxy.__file__).resolve().parents[1] / "tests" / "clients" / "node_modules" / ".bin"

#: The command that installs each agent's program, for the one line that says it is missing.
INSTALL = {
    "claude": "npm install -g @anthropic-ai/claude-code",
    "codex": "npm install -g @openai/codex",
    "opencode": "npm install -g opencode-ai",
    "pi": "npm install -g @mariozechner/pi-coding-agent",
    "aider": "pipx install aider-chat",
    "qwen": "npm install -g @qwen-code/qwen-code",
    "gemini": "npm install -g @google/gemini-cli",
}


def find_program(command: str) -> str | None:
    """The path of ``command`` on PATH, else in the checkout's pinned agents, else None."""
    return shutil.which(command) or shutil.which(command, path=str(CHECKOUT_AGENTS))


def missing_line(agent: str, command: str) -> str:
    """One line: the program is not found, and the command that installs it."""
    return f"{command} is not on PATH: install it with `{INSTALL[agent]}`"
