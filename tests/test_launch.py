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
import shlex
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from proxy.cli import main
from proxy.context.checkpoint import Checkpoint
from proxy.context.log.tiers import tiers_in_log
from proxy.launch.agents import AGENTS, Plan
from proxy.launch.run import Closing, RunFigures, agent_argv, exit_line
from proxy.savings import UsageTotals
from proxy.store.base import FactLog, NewFact, SessionKey
from tests.agents import codex_config
from tests.fakeupstream import FakeUpstream
from tests.test_run_agents import ROOT, closing_figures

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
    """The variables ``ctxproxy run --print-env AGENT`` prints, as a shell would set them (``alias``: the agent's
    arguments, split)."""
    result = CliRunner().invoke(main, ["run", "--print-env", "--proxy", PROXY, "--session", SESSION, *extra, agent],
                                env={"HOME": str(tmp_path / "home"), **(env or {})})
    assert result.exit_code == 0, result.output
    found = {}
    for line in result.output.splitlines():
        if line.startswith("#"):
            LEFT.append(Path(line.split(" in ", 1)[1].removesuffix(" (remove it when done)")))
        elif line.startswith("alias "):
            name, _, value = line.removeprefix("alias ").partition("=")
            found["alias"] = shlex.split(value)[0]
        else:
            name, _, value = line.removeprefix("export ").partition("=")
            found[name] = shlex.split(value)[0]
    return found


def test_claude_gets_its_base_url_with_the_session_and_its_auto_compaction_off(tmp_path: Path) -> None:
    assert print_env(tmp_path, "claude") == {"ANTHROPIC_BASE_URL": f"{PROXY}/s/{SESSION}", "DISABLE_AUTO_COMPACT": "1"}
    assert print_env(tmp_path, "claude", "--keep-agent-compaction") == {"ANTHROPIC_BASE_URL": f"{PROXY}/s/{SESSION}"}


def listing(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def test_codex_takes_its_provider_and_compaction_limits_as_overrides_and_keeps_its_own_home(tmp_path: Path) -> None:
    user = tmp_path / "codex-user"
    user.mkdir()
    config = codex_config("https://api.example.com/v1") + '\n[mcp_servers.docs]\ncommand = "docs-server"\n'
    (user / "config.toml").write_text(config)
    (user / "auth.json").write_text('{"tokens": "the user\'s"}')
    before = listing(user)

    env = print_env(tmp_path, "codex", env={"CODEX_HOME": str(user)})

    assert shlex.split(env.pop("alias")) == [
        "codex", "-c", f'model_providers.ctxproxy-test.base_url="{PROXY}/s/{SESSION}/v1"',
        "-c", "model_providers.ctxproxy-test.supports_websockets=false",
        "-c", "model_auto_compact_token_limit=1000000000", "-c", "model_context_window=1000000000"]
    assert env == {}
    assert listing(user) == before, "the user's Codex home is neither written nor copied"


def test_codex_with_the_built_in_provider_gets_openai_base_url(tmp_path: Path) -> None:
    user = tmp_path / "home" / ".codex"
    user.mkdir(parents=True)
    (user / "config.toml").write_text('model = "gpt-5.5"\n')
    overrides = ["codex", "-c", f'openai_base_url="{PROXY}/s/{SESSION}/v1"']
    env = print_env(tmp_path, "codex", "--keep-agent-compaction")
    assert (shlex.split(env.pop("alias")), env) == (overrides, {})
    # Codex's built-in provider reads OPENAI_BASE_URL too: a user's value is pointed at the proxy as well.
    env = print_env(tmp_path, "codex", "--keep-agent-compaction", env={"OPENAI_BASE_URL": "https://gw/v1"})
    assert (shlex.split(env.pop("alias")), env) == (overrides, {"OPENAI_BASE_URL": f"{PROXY}/s/{SESSION}/v1"})


def test_opencode_gets_an_inline_config_and_no_file(tmp_path: Path) -> None:
    env = print_env(tmp_path, "opencode")
    provider = {"options": {"baseURL": f"{PROXY}/s/{SESSION}/v1"}}
    assert {k: orjson.loads(v) for k, v in env.items()} == {"OPENCODE_CONFIG_CONTENT": {
        "provider": {"openai": provider, "anthropic": provider}, "compaction": {"auto": False}}}


def test_opencode_merges_its_config_into_the_users_inline_config(tmp_path: Path) -> None:
    users = {"theme": "dark", "provider": {"openai": {"options": {"baseURL": "https://gw.example/v1",
                                                                  "headers": {"X-Gateway-Key": "gk"}}}}}
    env = print_env(tmp_path, "opencode", env={"OPENCODE_CONFIG_CONTENT": orjson.dumps(users).decode()})
    assert orjson.loads(env["OPENCODE_CONFIG_CONTENT"]) == {
        "theme": "dark", "compaction": {"auto": False}, "provider": {
            "openai": {"options": {"baseURL": f"{PROXY}/s/{SESSION}/v1", "headers": {"X-Gateway-Key": "gk"}}},
            "anthropic": {"options": {"baseURL": f"{PROXY}/s/{SESSION}/v1"}}}}


def test_pi_gets_the_extension_that_points_it_at_the_proxy_and_no_home_of_its_own(tmp_path: Path) -> None:
    user = tmp_path / "home" / ".pi" / "agent"
    user.mkdir(parents=True)
    (user / "settings.json").write_bytes(orjson.dumps({"theme": "dark"}))
    before = listing(user)

    env = print_env(tmp_path, "pi")

    extension = shlex.split(env.pop("alias"))
    assert extension[:2] == ["pi", "-e"] and Path(extension[2]).is_file() and len(extension) == 3
    assert env == {"CTXPROXY_PI_OPENAI_BASE_URL": f"{PROXY}/s/{SESSION}/v1",
                   "CTXPROXY_PI_ANTHROPIC_BASE_URL": f"{PROXY}/s/{SESSION}", "CTXPROXY_PI_NO_AUTO_COMPACTION": "1"}
    assert listing(user) == before


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


def test_gemini_adds_the_session_header_to_the_users_own(tmp_path: Path) -> None:
    env = print_env(tmp_path, "gemini", env={"GEMINI_CLI_CUSTOM_HEADERS": "X-Gateway-Key: gk, X-Team: a"})
    assert env["GEMINI_CLI_CUSTOM_HEADERS"] == f"X-Gateway-Key: gk, X-Team: a, X-Session-Id: {SESSION}"


@pytest.mark.parametrize(("agent", "environ", "expected"), [
    ("claude", {"ANTHROPIC_BASE_URL": "https://gw.example/anthropic/"}, {"anthropic_upstream": "https://gw.example/anthropic"}),
    ("aider", {"OPENAI_API_BASE": "https://gw.example/v1"}, {"upstream": "https://gw.example/v1"}),
    ("qwen", {"OPENAI_BASE_URL": "https://gw.example/v1"}, {"upstream": "https://gw.example/v1"}),
    ("gemini", {"GOOGLE_GEMINI_BASE_URL": "https://gw.example"}, {"gemini_upstream": "https://gw.example"}),
    ("codex", {"OPENAI_BASE_URL": "https://gw.example/v1"}, {"upstream": "https://gw.example/v1"}),
    # The AI SDK's Anthropic URL carries /v1, the proxy's --anthropic-upstream does not.
    ("opencode", {"ANTHROPIC_BASE_URL": "https://gw.example/v1", "OPENCODE_CONFIG_CONTENT":
                  '{"provider": {"openai": {"options": {"baseURL": "https://gw.example/openai/v1"}}}}'},
     {"anthropic_upstream": "https://gw.example", "upstream": "https://gw.example/openai/v1"}),
    ("claude", {"ANTHROPIC_BASE_URL": " "}, {}),
])
def test_the_endpoint_the_users_environment_names_is_the_doors_upstream(
        agent: str, environ: dict[str, str], expected: dict[str, str], tmp_path: Path) -> None:
    assert AGENTS[agent].endpoints({"HOME": str(tmp_path), **environ}) == expected


def test_codex_and_pi_endpoints_come_from_their_config_files(tmp_path: Path) -> None:
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "config.toml").write_text(codex_config("https://gw.example/v1"))
    assert AGENTS["codex"].endpoints({"HOME": str(tmp_path)}) == {"upstream": "https://gw.example/v1"}
    (tmp_path / ".pi" / "agent").mkdir(parents=True)
    (tmp_path / ".pi" / "agent" / "models.json").write_bytes(orjson.dumps({"providers": {
        "anthropic": {"baseUrl": "https://gw.example/a"}}}))
    assert AGENTS["pi"].endpoints({"HOME": str(tmp_path)}) == {"anthropic_upstream": "https://gw.example/a"}


def test_an_invalid_session_name_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "--print-env", "--session", "a b", "claude"])
    assert result.exit_code == 2 and "--session" in result.output


# -- the launcher, with a stand-in agent ---------------------------------------------------------

STAND_IN = '''#!{python}
"""A stand-in for aider: one chat request at OPENAI_API_BASE with OPENAI_API_KEY (when ARGV[1] is not "quiet"; three
that may fail, when it is "fail"), its pid and the CTXPROXY_ variables it was given, then as ARGV[1] says: exit 3,
wait for SIGTERM, or ignore SIGTERM and SIGINT."""
import json, os, signal, sys, urllib.error, urllib.request
if sys.argv[1] == "fail":
    for _ in range(3):
        request = urllib.request.Request(os.environ["OPENAI_API_BASE"] + "/chat/completions", method="POST",
            data=json.dumps({{"model": "gpt-4o", "messages": [{{"role": "user", "content": "hi"}}]}}).encode(),
            headers={{"Content-Type": "application/json", "Authorization": "Bearer sk-test"}})
        try:
            urllib.request.urlopen(request).close()
        except urllib.error.HTTPError as error:
            print("status", error.code, flush=True)
elif sys.argv[1] != "quiet":
    request = urllib.request.Request(os.environ["OPENAI_API_BASE"] + "/chat/completions", method="POST",
        data=json.dumps({{"model": "gpt-4o", "messages": [{{"role": "user", "content": "hi"}}]}}).encode(),
        headers={{"Content-Type": "application/json",
                 "Authorization": "Bearer " + os.environ.get("OPENAI_API_KEY", "sk-test")}})
    with urllib.request.urlopen(request) as answer:
        print(answer.headers["X-Session-Id"], os.environ["AIDER_MAX_CHAT_HISTORY_TOKENS"], sys.argv[1:], flush=True)
print(os.getpid(), sorted(k for k in os.environ if k.startswith("CTXPROXY_")), flush=True)
if sys.argv[1] == "exit":
    sys.exit(3)
if sys.argv[1] in ("ignore", "quiet"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print("ready", flush=True)
while True:
    signal.pause()
'''

#: The proxy's secrets a user may have set for ``serve``: none may reach the agent.
SECRETS = {"CTXPROXY_UPSTREAM_KEY": "sk-upstream-secret", "CTXPROXY_ANTHROPIC_UPSTREAM_KEY": "sk-ant-secret",
           "CTXPROXY_GEMINI_UPSTREAM_KEY": "gemini-secret", "CTXPROXY_ADMIN_TOKEN": "admin-secret",
           "CTXPROXY_SECRET": "s" * 32, "CTXPROXY_CLIENT_KEYS": "sk-test,sk-other"}


def stand_in(tmp_path: Path, name: str = "aider", script: str = STAND_IN) -> dict[str, str]:
    """``script`` on PATH as ``name``; the environment to start the launcher with (HOME and TMPDIR in tmp_path)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(script.format(python=sys.executable))
    (bin_dir / name).chmod(0o755)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
            "TMPDIR": str(tmp_path / "tmp")}


async def launcher(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "run", *args, env={**stand_in(tmp_path), **(env or {})}, cwd=tmp_path,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def start_launcher(tmp_path: Path, upstream: str | None, *args: str,
                         env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    where = ["--upstream", upstream + "/v1"] if upstream is not None else []
    return await launcher(tmp_path, *where, "--store", f"sqlite:///{tmp_path}/facts.db", "--session", SESSION,
                          "aider", "--", *args, env=env)


def closing_line(stderr: bytes) -> dict[str, Any]:
    return closing_figures(stderr.decode().strip().splitlines()[-1])


async def test_the_agent_runs_through_an_embedded_proxy_and_its_exit_status_is_the_launchers(
        aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeUpstream()
    upstream: TestServer = await aiohttp_server(fake.app())
    proc = await start_launcher(tmp_path, str(upstream.make_url("")).rstrip("/"), "exit", "--yes")
    out, err = await asyncio.wait_for(proc.communicate(), 60)

    assert proc.returncode == 3
    assert out.decode().splitlines()[0] == f"{SESSION} 1000000000 ['exit', '--yes']"
    assert len(fake.requests) == 1
    line = closing_line(err)
    assert (line["session"], line["requests"], line["compactions"]) == (SESSION, "1", "0")
    assert line["dollars"] is not None, "gpt-4o has a price"


async def test_the_users_gateway_is_the_upstream_with_the_users_key(aiohttp_server: Any, tmp_path: Path) -> None:
    gateway = FakeUpstream()
    server: TestServer = await aiohttp_server(gateway.app())
    user = {"OPENAI_API_BASE": str(server.make_url("/v1")), "OPENAI_API_KEY": "sk-gateway-key"}

    proc = await start_launcher(tmp_path, None, "exit", env=user)  # no --upstream: api.openai.com is the default
    _, err = await asyncio.wait_for(proc.communicate(), 60)

    assert proc.returncode == 3, err.decode()
    assert len(gateway.requests) == 1, "the request reached the gateway, so none went to the default host"
    assert gateway.headers[0]["Authorization"] == "Bearer sk-gateway-key"
    assert closing_line(err)["requests"] == "1"


async def test_no_proxy_secret_reaches_the_agent(aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeUpstream()
    upstream: TestServer = await aiohttp_server(fake.app())
    mine = {"CTXPROXY_MY_OWN": "kept", "OPENAI_API_KEY": "sk-test"}
    proc = await start_launcher(tmp_path, str(upstream.make_url("")).rstrip("/"), "exit", env={**SECRETS, **mine})
    out, err = await asyncio.wait_for(proc.communicate(), 60)

    assert proc.returncode == 3, err.decode()
    assert out.decode().splitlines()[1].split(" ", 1)[1] == "['CTXPROXY_MY_OWN']"
    assert fake.headers[0]["Authorization"] == "Bearer sk-upstream-secret", "the proxy itself still has them"


async def test_with_proxy_no_store_is_opened_and_the_urls_password_is_not_printed(tmp_path: Path) -> None:
    proc = await launcher(tmp_path, "--proxy", "http://user:hunter2@127.0.0.1:9/", "--session", SESSION, "aider",
                          "--", "exit")
    _, err = await asyncio.wait_for(proc.communicate(), 60)

    lines = err.decode().strip().splitlines()
    assert lines[-1] == f"ctxproxy: session {SESSION}; inspector http://user:***@127.0.0.1:9/ui"
    assert "hunter2" not in err.decode()
    assert not (tmp_path / ".local" / "state").exists(), "no default store was created"


async def test_an_unwritable_state_directory_is_one_line_naming_it_and_the_flag(tmp_path: Path) -> None:
    (tmp_path / ".local").write_text("a file where the state directory would go")
    proc = await launcher(tmp_path, "aider", "--", "exit")
    out, err = await asyncio.wait_for(proc.communicate(), 60)

    assert proc.returncode == 2
    assert out == b"", "the agent never started"
    (line,) = err.decode().strip().splitlines()
    assert str(tmp_path / ".local" / "state" / "ctxproxy" / "facts.db") in line and "--store" in line


async def test_the_closing_line_counts_only_the_runs_own_tenant(aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeUpstream()
    upstream: TestServer = await aiohttp_server(fake.app())
    root = str(upstream.make_url("")).rstrip("/")
    for key in ("sk-other-tenant", "sk-other-tenant", "sk-test"):  # another tenant used the same session name twice
        proc = await start_launcher(tmp_path, root, "exit", env={"OPENAI_API_KEY": key})
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 3, err.decode()

    assert len(fake.requests) == 3
    assert closing_line(err)["requests"] == "1"


async def test_a_refusing_upstream_is_one_line_at_once_and_counted_in_the_closing_line(tmp_path: Path) -> None:
    proc = await start_launcher(tmp_path, "http://127.0.0.1:1", "fail")
    assert proc.stdout is not None and proc.stderr is not None
    await started(proc)  # the agent has made its three requests (each answered 502), and waits

    first = await asyncio.wait_for(proc.stderr.readline(), 60)  # while the agent still runs
    assert first.decode() == ("ctxproxy: a request failed: upstream 127.0.0.1:1 refused the connection (the closing "
                              "line counts any more)\n")
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 60)

    assert proc.returncode == 7
    assert len(err.decode().strip().splitlines()) == 1, "nothing else of the proxy's reached the terminal"
    line = closing_line(err)
    assert (line["requests"], line["failed"], line["cause"]) == (
        "3", "3", "upstream 127.0.0.1:1 refused the connection")


async def test_the_proxys_log_goes_to_the_file_the_closing_line_names_unless_verbose(
        aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeUpstream()
    upstream: TestServer = await aiohttp_server(fake.app())
    root = str(upstream.make_url("")).rstrip("/")

    proc = await start_launcher(tmp_path, root, "exit", env={"CTXPROXY_LOG_LEVEL": "INFO"})
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert len(err.decode().strip().splitlines()) == 1, "the terminal has the closing line alone"
    log = Path(closing_line(err)["log"])
    assert log == tmp_path / ".local" / "state" / "ctxproxy" / "logs" / f"run-{SESSION}.log"
    assert f"session={SESSION} status=200" in log.read_text(), "the access line, in the file"

    verbose = await launcher(tmp_path, "--upstream", root + "/v1", "--store", f"sqlite:///{tmp_path}/facts.db",
                             "--session", "loud", "--verbose", "aider", "--", "exit",
                             env={"CTXPROXY_LOG_LEVEL": "INFO"})
    _, err = await asyncio.wait_for(verbose.communicate(), 60)
    assert "session=loud status=200" in err.decode(), "--verbose: the log on the terminal"
    assert closing_line(err)["log"] is None and not (log.parent / "run-loud.log").exists()


async def test_the_closing_line_names_the_command_that_serves_its_inspector(
        aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeUpstream()
    upstream: TestServer = await aiohttp_server(fake.app())
    proc = await start_launcher(tmp_path, str(upstream.make_url("")).rstrip("/"), "exit")
    _, err = await asyncio.wait_for(proc.communicate(), 60)

    line = closing_line(err)
    command = shlex.split(line["command"])
    assert command[:4] == ["ctxproxy", "serve", "--store", f"sqlite:///{tmp_path}/facts.db"]
    assert command[4] == "--admin-token" and len(command[5]) >= 16 and len(command) == 6
    assert line["inspector"].startswith("http://127.0.0.1:8787/ui/sessions/") and line["inspector"].endswith("/s1")


async def test_the_closing_line_tells_summaries_masking_batches_and_model_free_checkpoints_apart(
        store: FactLog) -> None:
    key = SessionKey("t", SESSION)

    def checkpoint(tier: str, elision: str = "") -> NewFact:
        made = Checkpoint("", 1, "p", None, 100, 50, "gpt-4o", 0.0, elision=elision)
        return NewFact(kind="checkpoint", index=1, source="proxy",
                       extra={"checkpoint": orjson.loads(made.to_json()), "made_from": None, "tier": tier})

    summary = NewFact(kind="summary", index=1, source="proxy", message={"role": "user", "content": "so far"})
    facts = [summary, checkpoint("summary"), checkpoint("mask"), checkpoint("mask"), summary,
             checkpoint("fallback", "[messages 1-4 left out]")]
    await store.append(key, 0, facts, 1.0)
    [info] = [i async for i in store.sessions() if i.session == SESSION]

    found = await tiers_in_log(store, key, page=2)

    assert (found.summary, found.mask, found.fallback) == (1, 2, 1)
    line = exit_line(Closing(SESSION, "http://127.0.0.1:8787"), RunFigures([info], UsageTotals(), found))
    assert ", 1 summary, 2 masking batches, 1 model-free checkpoint, " in line
    assert closing_figures(line)["compactions"] == "4"


async def wait_for_exit(proc: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    return await asyncio.wait_for(proc.communicate(), 60)


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie nobody reaped yet counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


async def wait_gone(pid: int) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while not gone(pid):
        assert asyncio.get_running_loop().time() < deadline, f"process {pid} still runs"
        await asyncio.sleep(0.05)


async def started(proc: asyncio.subprocess.Process) -> int:
    """The stand-in's pid, once it is ready for signals."""
    assert proc.stdout is not None
    pid = 0
    while (line := await asyncio.wait_for(proc.stdout.readline(), 60)) != b"ready\n":
        assert line, "the stand-in ended early"
        if line[:1].isdigit():
            pid = int(line.split()[0])
    return pid


async def test_sigterm_to_the_launcher_reaches_the_agent(aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeUpstream()
    upstream: TestServer = await aiohttp_server(fake.app())
    proc = await start_launcher(tmp_path, str(upstream.make_url("")).rstrip("/"), "wait")
    await started(proc)

    proc.send_signal(signal.SIGTERM)
    _, err = await wait_for_exit(proc)

    assert proc.returncode == 7, err.decode()
    assert closing_line(err)["requests"] == "1"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_an_agent_ignoring_the_signal_is_killed_after_the_grace_period(
        aiohttp_server: Any, tmp_path: Path, sig: signal.Signals) -> None:
    fake = FakeUpstream()
    upstream: TestServer = await aiohttp_server(fake.app())
    proc = await start_launcher(tmp_path, str(upstream.make_url("")).rstrip("/"), "ignore")
    pid = await started(proc)

    proc.send_signal(sig)
    _, err = await wait_for_exit(proc)

    assert proc.returncode == 128 + signal.SIGKILL, err.decode()
    assert gone(pid)
    assert closing_line(err)["requests"] == "1"


async def test_the_agent_dies_with_the_launcher_and_nothing_is_left_behind(tmp_path: Path) -> None:
    # Gemini's recipe has files to give (its system settings): they must not outlive the launcher either.
    stand_in(tmp_path, "gemini", STAND_IN.replace("if sys.argv[1] != \"quiet\":", "if False:"))
    proc = await launcher(tmp_path, "--store", f"sqlite:///{tmp_path}/facts.db", "gemini", "--", "quiet")
    pid = await started(proc)

    proc.kill()
    await proc.wait()

    await wait_gone(pid)
    assert list((tmp_path / "tmp").iterdir()) == []


CODEX_STAND_IN = '''#!{python}
"""A stand-in for Codex: prints its arguments, then logs in and records a session in its home, as Codex does."""
import os, pathlib, sys
print(sys.argv[1:], flush=True)
home = pathlib.Path(os.environ.get("CODEX_HOME") or pathlib.Path.home() / ".codex")
(home / "auth.json.tmp").write_text('{{"tokens": "new login"}}')
(home / "auth.json.tmp").rename(home / "auth.json")
(home / "sessions" / "2026").mkdir(parents=True, exist_ok=True)
(home / "sessions" / "2026" / "rollout.jsonl").write_text("{{}}\\n")
'''


async def test_what_codex_writes_to_its_home_stays_in_the_users_home(tmp_path: Path) -> None:
    user = tmp_path / ".codex"
    user.mkdir()
    (user / "config.toml").write_text('model = "gpt-5.5"\n')
    stand_in(tmp_path, "codex", CODEX_STAND_IN)
    proc = await launcher(tmp_path, "--store", f"sqlite:///{tmp_path}/facts.db", "codex", "--", "exec", "hi")
    out, err = await wait_for_exit(proc)

    assert proc.returncode == 0, err.decode()
    assert out.decode().splitlines()[0].startswith("['-c', 'openai_base_url=\"http://127.0.0.1:")
    assert out.decode().splitlines()[0].endswith("'exec', 'hi']")
    assert (user / "auth.json").read_text() == '{"tokens": "new login"}'
    assert (user / "sessions" / "2026" / "rollout.jsonl").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_keep_agent_compaction_leaves_every_agents_own_switch_alone(tmp_path: Path) -> None:
    kept = {agent: print_env(tmp_path, agent, "--keep-agent-compaction") for agent in
            ("claude", "codex", "opencode", "pi", "aider", "qwen", "gemini")}
    assert "DISABLE_AUTO_COMPACT" not in kept["claude"] and "AIDER_MAX_CHAT_HISTORY_TOKENS" not in kept["aider"]
    assert "model_auto_compact_token_limit" not in kept["codex"]["alias"]
    assert "compaction" not in orjson.loads(kept["opencode"]["OPENCODE_CONFIG_CONTENT"])
    assert "CTXPROXY_PI_NO_AUTO_COMPACTION" not in kept["pi"]
    assert "context" not in orjson.loads(Path(kept["qwen"]["QWEN_CODE_SYSTEM_SETTINGS_PATH"]).read_bytes())
    assert "model" not in orjson.loads(Path(kept["gemini"]["GEMINI_CLI_SYSTEM_SETTINGS_PATH"]).read_bytes())


def test_pis_commands_that_call_no_model_get_no_extension() -> None:
    plan = Plan({}, ["-e", "ext.ts"])
    assert agent_argv("pi", "/bin/pi", plan, ["install", "npm:x"]) == ["/bin/pi", "install", "npm:x"]
    assert agent_argv("pi", "/bin/pi", plan, ["-p", "install it"]) == ["/bin/pi", "-e", "ext.ts", "-p", "install it"]
    # pi 0.73 has no `auth` command (`pi --help`): `pi auth` is a prompt, which must go through the proxy.
    assert agent_argv("pi", "/bin/pi", plan, ["auth"]) == ["/bin/pi", "-e", "ext.ts", "auth"]
    assert agent_argv("codex", "/bin/codex", plan, ["exec", "hi"]) == ["/bin/codex", "-e", "ext.ts", "exec", "hi"]
