"""The demo's task, the steps the scripted model takes, and the workspace its tool calls act on.

The workspace is a dict in memory: the demo writes no file of the user's. Tool
names and arguments are Gemini CLI's (``read_file``, ``write_file``,
``replace``, ``run_shell_command``), which the proxy's working set and artifact
trail read, so the edited file's text is carried past compactions as it would
be for a real agent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SYSTEM = "You are a coding agent working in a Python repository. Use the tools to read, edit and test the code."
#: The user's constraint: carried verbatim past every compaction (the report checks the last prompt for it).
CONSTRAINT = "Never change the public signature of parse_args(); other tools import it."
TASK = ("Add a --dry-run flag to app/cli.py that prints what would change and changes nothing, with a test. "
        + CONSTRAINT)
EDITED = "app/cli.py"
#: A line of the edited file's final text: the report checks that the last prompt still holds it.
EDITED_LINE = 'DRY_RUN_HELP = "print what would change, change nothing"'
FINAL = "Done: app/cli.py has --dry-run (DRY_RUN_HELP), tests/test_cli.py covers it, and the suite passes."

CLI_BEFORE = '''"""Command line of the sync tool."""
import argparse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="sync")
    parser.add_argument("source")
    parser.add_argument("target")
    return parser.parse_args(argv)
'''
CLI_AFTER = CLI_BEFORE.replace('    return parser.parse_args(argv)\n', (
    '    parser.add_argument("--dry-run", action="store_true", help=DRY_RUN_HELP)\n'
    '    return parser.parse_args(argv)\n')).replace("import argparse\n", f"import argparse\n\n{EDITED_LINE}\n")
TEST_CLI = '''from app.cli import parse_args


def test_dry_run():
    assert parse_args(["a", "b", "--dry-run"]).dry_run
'''


def _module(name: str, lines: int) -> str:
    """A plausible module of ``lines`` functions: what reading the repository shows the agent."""
    body = "\n".join(f"def {name}_{n}(items, limit={n}):\n    \"\"\"Step {n} of the {name} pass.\"\"\"\n"
                     f"    return [item for item in items if len(item) > limit][:{n + 3}]\n" for n in range(lines))
    return f'"""The {name} pass of the sync tool."""\n\n{body}'


def _test_log(failing: int) -> str:
    """A test run's output: ``failing`` failures, then the summary line."""
    passed = [f"tests/test_sync.py::test_case_{n} PASSED" for n in range(60)]
    failed = ["tests/test_cli.py::test_dry_run FAILED\nE   AttributeError: 'Namespace' object has no attribute "
              "'dry_run'"] * failing
    ending = f"{failing} failed, 60 passed" if failing else "61 passed"
    return "\n".join([*passed, *failed, f"==== {ending} in 0.{4 + failing}1s ===="])


def initial_files() -> dict[str, str]:
    files = {EDITED: CLI_BEFORE, "config/prod.yaml": "target: s3://prod-bucket\nretries: 5\n"}
    for name in ("scan", "diff", "copy", "verify", "report", "retry"):
        files[f"app/{name}.py"] = _module(name, 14)
    return files


#: The model's moves, one per turn: (tool, arguments). Long reads and test runs fill the window; the edit and
#: the test come early, then more reading and testing, so that the edited file's text reaches the last request
#: only if compaction carried it (it is not read again).
STEPS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("run_shell_command", {"command": "ls -R app tests config"}),
    ("read_file", {"path": EDITED}),
    *(("read_file", {"path": f"app/{name}.py"}) for name in ("scan", "diff", "copy")),
    ("run_shell_command", {"command": "python -m pytest -q"}),
    *(("read_file", {"path": f"app/{name}.py"}) for name in ("verify", "report", "retry")),
    ("run_shell_command", {"command": "grep -rn parse_args app"}),
    ("write_file", {"file_path": "tests/test_cli.py", "content": TEST_CLI}),
    ("run_shell_command", {"command": "python -m pytest -q"}),
    ("write_file", {"file_path": EDITED, "content": CLI_AFTER}),
    *(step for name in ("scan", "diff", "copy", "verify", "report", "retry") for step in (
        ("read_file", {"path": f"app/{name}.py"}),
        ("run_shell_command", {"command": f"python -m pytest -q tests/test_{name}.py"}))),
    ("run_shell_command", {"command": "python -m pytest -q"}),
    *(("read_file", {"path": f"app/{name}.py"}) for name in ("scan", "diff", "copy", "verify", "report", "retry")),
    ("run_shell_command", {"command": "python -m pytest -q"}),
    ("run_shell_command", {"command": "python -m pytest -q tests/test_cli.py"}),
    ("run_shell_command", {"command": "git diff --stat"}),
    ("run_shell_command", {"command": "python -m pytest -q"}),
)


@dataclass
class Workspace:
    """The files the agent works on, in memory; ``run`` answers one tool call as the tool would."""

    files: dict[str, str] = field(default_factory=initial_files)

    def run(self, tool: str, args: dict[str, Any]) -> str:
        if tool == "read_file":
            return self.files.get(str(args.get("path")), f"Error: no such file {args.get('path')}")
        if tool == "write_file":
            path = str(args.get("file_path"))
            self.files[path] = str(args.get("content", ""))
            return f"Successfully wrote to {path}."
        if tool == "run_shell_command":
            return self.shell(str(args.get("command", "")))
        return f"Error: unknown tool {tool}"

    def shell(self, command: str) -> str:
        if command.startswith("python -m pytest"):
            return _test_log(0 if "--dry-run" in self.files[EDITED] else 1)
        if command.startswith("ls"):
            return "\n".join(sorted(self.files))
        if command.startswith("grep"):
            return "\n".join(f"{path}:{n}:{line}" for path, text in sorted(self.files.items())
                             for n, line in enumerate(text.splitlines(), 1) if "parse_args" in line)
        if command.startswith("git diff"):
            return f" {EDITED}        | 3 +++\n tests/test_cli.py | 5 +++++\n 2 files changed, 8 insertions(+)"
        return f"sh: {command.split()[0]}: command not found"
