"""What ``--help`` tells a newcomer: the four doors, ``serve``'s flags under headings, ``run``'s own flags first.

Through the command as a user calls it (click's runner, in this process).
"""

from __future__ import annotations

import re
import tomllib

import click
from click.testing import CliRunner

from proxy.cli import main
from tests.test_run_agents import ROOT

HEADINGS = ["Network", "Upstreams", "Keys", "Store", "Window", "Summaries", "Masking", "Limits", "Logging"]
DOORS = ["OpenAI Chat Completions", "Responses", "Anthropic Messages", "Gemini API"]
RUN_FLAGS = ["--proxy", "--session", "--keep-agent-compaction", "--print-env", "--verbose"]


def help_of(*command: str) -> str:
    result = CliRunner().invoke(main, [*command, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


def option_lines(text: str) -> list[str]:
    """The flag each option line of a help text starts with, in order."""
    return re.findall(r"^ {2}(--[a-z-]+)", text, re.MULTILINE)


def flags_of(name: str) -> list[str]:
    command = main.commands[name]  # type: ignore[attr-defined]
    return [p.opts[0] for p in command.params if isinstance(p, click.Option) and p.opts[0] != "--help"]


def test_serve_help_shows_every_flag_once_under_its_heading() -> None:
    text = help_of("serve")
    headings = re.findall(r"^(\w[\w ]*):$", text, re.MULTILINE)
    assert headings == [*HEADINGS, "Other options"]
    listed = option_lines(text)
    assert sorted(listed) == sorted(flags_of("serve")) and len(listed) == len(set(listed)) == 40
    others = text.split("\nOther options:\n", 1)[1]
    assert option_lines(others) == [], "every flag but --help has a heading"
    network = text.split("\nNetwork:\n", 1)[1].split("\n\n", 1)[0]
    assert option_lines(network) == ["--host", "--port", "--workers"]


def test_run_help_lists_its_own_flags_first_and_claims_no_port_it_does_not_bind() -> None:
    text = help_of("run")
    listed = option_lines(text)
    assert listed[:len(RUN_FLAGS)] == RUN_FLAGS
    assert sorted(listed) == sorted(flags_of("run")) and len(listed) == len(set(listed))
    assert "--workers" not in listed
    port = text.split("  --port ", 1)[1].split("\n  --", 1)[0]
    assert "[default: 8787]" not in port and "free loopback port" in " ".join(port.split())


def test_the_description_and_the_main_help_name_all_four_doors() -> None:
    text = " ".join(help_of().split())
    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    for door in DOORS:
        assert door in text and door in description
    assert "OPENAI_BASE_URL" not in text
