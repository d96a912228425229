"""``ctxproxy run``: what each agent's recipe sets (``--print-env``), and the launcher's own duties.

The recipes are checked through the command as a user calls it (click's
runner, in this process): the variables printed, the files they name, and that
the user's own config files are read and never written. The launcher itself
(an embedded proxy on a free port, the session named, the agent's arguments,
its exit status, signals passed on) is checked with a stand-in agent: a small
program on PATH under an agent's name that calls the proxy the way that agent
would, through a fake upstream.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from proxy.cli import main
from tests.agents import codex_config
from tests.fakeupstream import FakeUpstream
from tests.test_run_agents import EXIT_LINE, ROOT

PROXY = "http://127.0.0.1:9911"
SESSION = "s1"


#: The directories ``--print-env`` left for the shell (it names them); removed after each test.
LEFT: list[Path] = []


@pytest.fixture(autouse=True)
def _remove_printed_dirs() -> Iterator[None]:
    yield
    while LEFT:
        shutil.rmtree(LEFT.pop())


def print_env(tmp_path: Path, agent: str, *extra: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The variables ``ctxproxy run --print-env AGENT`` prints, as a shell would set them."""
    result = CliRunner().invoke(main, ["run", "--print-env", "--proxy", PROXY, "--session", SESSION, *extra, agent],
                                env={"HOME": str(tmp_path / "home"), **(env or {})})
    assert result.exit_code == 0, result.output
    found = {}
    for line in result.output.splitlines():
        if line.startswith("#"):
            LEFT.append(Path(line.split(" in ", 1)[1].removesuffix(" (remove it when done)")))
            continue
        name, _, value = line.removeprefix("export ").partition("=")
        found[name] = value.strip("'")
    return found


def test_claude_gets_its_base_url_with_the_session_and_its_auto_compaction_off(tmp_path: Path) -> None:
    assert print_env(tmp_path, "claude") == {"ANTHROPIC_BASE_URL": f"{PROXY}/s/{SESSION}", "DISABLE_AUTO_COMPACT": "1"}
    assert print_env(tmp_path, "claude", "--keep-agent-compaction") == {"ANTHROPIC_BASE_URL": f"{PROXY}/s/{SESSION}"}


def test_codex_gets_an_overlay_of_the_users_codex_home_their_config_repointed_their_login_kept(
        tmp_path: Path) -> None:
    user = tmp_path / "codex-user"
    user.mkdir()
    config = codex_config("https://api.example.com/v1") + '\n[mcp_servers.docs]\ncommand = "docs-server"\n'
    (user / "config.toml").write_text(config)
    (user / "auth.json").write_text('{"tokens": "the user\'s"}')
    (user / "sessions").mkdir()

    env = print_env(tmp_path, "codex", env={"CODEX_HOME": str(user)})

    overlay = Path(env.pop("CODEX_HOME"))
    assert env == {}
    written = tomllib.loads((overlay / "config.toml").read_text())
    expected = tomllib.loads(config)
    expected["model_providers"]["ctxproxy-test"]["base_url"] = f"{PROXY}/s/{SESSION}/v1"
    expected["model_auto_compact_token_limit"] = expected["model_context_window"] = 1_000_000_000
    assert written == expected
    assert (overlay / "auth.json").resolve() == (user / "auth.json").resolve()
    assert (overlay / "sessions").resolve() == (user / "sessions").resolve()
    assert (user / "config.toml").read_text() == config, "the user's own file is untouched"


def test_codex_with_the_built_in_provider_gets_openai_base_url(tmp_path: Path) -> None:
    user = tmp_path / "home" / ".codex"
    user.mkdir(parents=True)
    (user / "config.toml").write_text('model = "gpt-5.5"\n')
    overlay = Path(print_env(tmp_path, "codex", "--keep-agent-compaction")["CODEX_HOME"])
    assert tomllib.loads((overlay / "config.toml").read_text()) == {
        "model": "gpt-5.5", "openai_base_url": f"{PROXY}/s/{SESSION}/v1"}


def test_opencode_gets_an_inline_config_and_no_file(tmp_path: Path) -> None:
    env = print_env(tmp_path, "opencode")
    provider = {"options": {"baseURL": f"{PROXY}/s/{SESSION}/v1"}}
    assert {k: orjson.loads(v) for k, v in env.items()} == {"OPENCODE_CONFIG_CONTENT": {
        "provider": {"openai": provider, "anthropic": provider}, "compaction": {"auto": False}}}


def test_pi_gets_an_overlay_with_compaction_off_and_both_providers_at_the_proxy(tmp_path: Path) -> None:
    user = tmp_path / "home" / ".pi" / "agent"
    user.mkdir(parents=True)
    settings = {"theme": "dark", "compaction": {"reserveTokens": 9000}}
    (user / "settings.json").write_bytes(orjson.dumps(settings))
    (user / "auth.json").write_text("{}")

    overlay = Path(print_env(tmp_path, "pi")["PI_CODING_AGENT_DIR"])

    assert orjson.loads((overlay / "settings.json").read_bytes()) == {
        "theme": "dark", "compaction": {"reserveTokens": 9000, "enabled": False}}
    assert orjson.loads((overlay / "models.json").read_bytes()) == {"providers": {
        "openai": {"baseUrl": f"{PROXY}/s/{SESSION}/v1"}, "anthropic": {"baseUrl": f"{PROXY}/s/{SESSION}"}}}
    assert (overlay / "auth.json").resolve() == (user / "auth.json").resolve()
    assert orjson.loads((user / "settings.json").read_bytes()) == settings


def test_aider_gets_its_base_url_and_a_history_limit_out_of_reach(tmp_path: Path) -> None:
    assert print_env(tmp_path, "aider") == {"OPENAI_API_BASE": f"{PROXY}/s/{SESSION}/v1",
                                            "AIDER_MAX_CHAT_HISTORY_TOKENS": "1000000000"}


def test_qwen_gets_a_system_settings_file_over_the_machines_own(tmp_path: Path) -> None:
    machine = tmp_path / "qwen-system.json"
    machine.write_bytes(orjson.dumps({"general": {"checkpointing": True}}))
    env = print_env(tmp_path, "qwen", env={"QWEN_CODE_SYSTEM_SETTINGS_PATH": str(machine)})
    settings = Path(env.pop("QWEN_CODE_SYSTEM_SETTINGS_PATH"))
    assert env == {"OPENAI_BASE_URL": f"{PROXY}/s/{SESSION}/v1"}
    assert orjson.loads(settings.read_bytes()) == {"general": {"checkpointing": True}, "security": {
        "auth": {"selectedType": "openai"}}, "context": {"autoCompactThreshold": 1.0}}
    assert orjson.loads(machine.read_bytes()) == {"general": {"checkpointing": True}}


def test_gemini_gets_the_proxy_root_the_session_as_a_header_and_its_compression_off(tmp_path: Path) -> None:
    env = print_env(tmp_path, "gemini")
    settings = Path(env.pop("GEMINI_CLI_SYSTEM_SETTINGS_PATH"))
    assert env == {"GOOGLE_GEMINI_BASE_URL": PROXY, "GEMINI_CLI_CUSTOM_HEADERS": f"X-Session-Id: {SESSION}"}
    assert orjson.loads(settings.read_bytes()) == {"security": {"auth": {"selectedType": "gemini-api-key"}},
                                                   "model": {"compressionThreshold": 1.0}}


def test_an_invalid_session_name_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "--print-env", "--session", "a b", "claude"])
    assert result.exit_code == 2 and "--session" in result.output


# -- the launcher, with a stand-in agent ---------------------------------------------------------

STAND_IN = '''#!{python}
"""A stand-in for aider: one chat request at OPENAI_API_BASE, then as ARGV[1] says: exit 3, or wait for SIGTERM."""
import json, os, signal, sys, urllib.request
request = urllib.request.Request(os.environ["OPENAI_API_BASE"] + "/chat/completions", method="POST",
    data=json.dumps({{"model": "gpt-4o", "messages": [{{"role": "user", "content": "hi"}}]}}).encode(),
    headers={{"Content-Type": "application/json", "Authorization": "Bearer sk-test"}})
with urllib.request.urlopen(request) as answer:
    print(answer.headers["X-Session-Id"], os.environ["AIDER_MAX_CHAT_HISTORY_TOKENS"], sys.argv[1:], flush=True)
if sys.argv[1] == "exit":
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print("ready", flush=True)
signal.pause()
'''


async def start_launcher(tmp_path: Path, upstream: str, *args: str) -> asyncio.subprocess.Process:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aider").write_text(STAND_IN.format(python=sys.executable))
    (bin_dir / "aider").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "run", "--upstream", upstream + "/v1", "--store",
        f"sqlite:///{tmp_path}/facts.db", "--session", SESSION, "aider", "--", *args, env=env, cwd=tmp_path,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


def closing_line(stderr: bytes) -> dict[str, Any]:
    found = EXIT_LINE.fullmatch(stderr.decode().strip().splitlines()[-1])
    assert found is not None, stderr.decode()
    return found.groupdict()


async def test_the_agent_runs_through_an_embedded_proxy_and_its_exit_status_is_the_launchers(
        aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeUpstream()
    upstream: TestServer = await aiohttp_server(fake.app())
    proc = await start_launcher(tmp_path, str(upstream.make_url("")).rstrip("/"), "exit", "--yes")
    out, err = await asyncio.wait_for(proc.communicate(), 60)

    assert proc.returncode == 3
    assert out.decode().splitlines() == [f"{SESSION} 1000000000 ['exit', '--yes']"]
    assert len(fake.requests) == 1
    line = closing_line(err)
    assert (line["session"], line["requests"], line["compactions"]) == (SESSION, "1", "0")
    assert line["dollars"] is not None, "gpt-4o has a price"


async def test_sigterm_to_the_launcher_reaches_the_agent(aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeUpstream()
    upstream: TestServer = await aiohttp_server(fake.app())
    proc = await start_launcher(tmp_path, str(upstream.make_url("")).rstrip("/"), "wait")
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert first.decode().startswith(SESSION)
    assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"ready\n"

    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 60)

    assert proc.returncode == 7, err.decode()
    assert closing_line(err)["requests"] == "1"


def test_keep_agent_compaction_leaves_every_agents_own_switch_alone(tmp_path: Path) -> None:
    kept = {agent: print_env(tmp_path, agent, "--keep-agent-compaction") for agent in
            ("claude", "codex", "opencode", "pi", "aider", "qwen", "gemini")}
    assert "DISABLE_AUTO_COMPACT" not in kept["claude"] and "AIDER_MAX_CHAT_HISTORY_TOKENS" not in kept["aider"]
    codex = tomllib.loads((Path(kept["codex"]["CODEX_HOME"]) / "config.toml").read_text())
    assert "model_auto_compact_token_limit" not in codex and "model_context_window" not in codex
    assert "compaction" not in orjson.loads(kept["opencode"]["OPENCODE_CONFIG_CONTENT"])
    assert not (Path(kept["pi"]["PI_CODING_AGENT_DIR"]) / "settings.json").exists()
    assert "context" not in orjson.loads(Path(kept["qwen"]["QWEN_CODE_SYSTEM_SETTINGS_PATH"]).read_bytes())
    assert "model" not in orjson.loads(Path(kept["gemini"]["GEMINI_CLI_SYSTEM_SETTINGS_PATH"]).read_bytes())
