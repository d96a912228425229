"""The test command, ``scripts/test``, on a machine that lacks what the suite drives, and ``.ci/run`` calling it.

The script runs for real with a PATH that holds only the few tools it needs before it looks for the system
packages: no redis-server, no npm and no apt-get, so it must name what is missing in one line and stop.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.test_run_agents import ROOT


def test_without_apt_get_the_missing_packages_are_one_line_and_the_script_stops(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    for tool in ("dirname", "id"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, str(ROOT / "scripts" / "test")], env={"PATH": str(bin_dir)}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("scripts/test: missing redis-server ") and "nodejs npm" in line
    assert "apt-get install redis-server" in line


def test_ci_runs_exactly_the_test_command() -> None:
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[-1] == "exec scripts/test"
