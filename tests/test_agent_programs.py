"""``ctxproxy run AGENT`` finds the agent ``scripts/install-clients`` installed in the checkout though it is on no
PATH, and names the command that installs an agent it cannot find."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from click.testing import CliRunner

from proxy.cli import main
from proxy.launch.agents import AGENTS
from proxy.launch.programs import CHECKOUT_AGENTS, INSTALL
from tests.test_launch import SESSION, launcher


async def test_an_agent_the_checkout_installed_runs_though_it_is_on_no_path(tmp_path: Path) -> None:
    assert (CHECKOUT_AGENTS / "claude").exists(), "scripts/install-clients puts the pinned agents here"
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "claude").exists())
    proc = await launcher(tmp_path, "--store", f"sqlite:///{tmp_path}/facts.db", "--session", SESSION, "claude",
                          "--", "--version", env={"PATH": path})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "Claude Code" in out.decode()


def test_an_agent_found_nowhere_is_one_line_naming_its_install_command(tmp_path: Path) -> None:
    # aider: a Python program, so never among the checkout's npm agents (opencode is one of them now)
    result = CliRunner().invoke(main, ["run", "aider"], env={"PATH": str(tmp_path)})
    assert result.exit_code == 1
    assert result.output == "Error: aider is not on PATH: install it with `pipx install aider-chat`\n"


def test_every_agent_has_an_install_command() -> None:
    assert set(INSTALL) == set(AGENTS)
