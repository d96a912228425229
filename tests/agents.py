"""The real coding agents as child processes: Codex CLI, Claude Code, Gemini CLI, Qwen Code, pi, opencode and
cline, pinned in tests/clients/package.json, and mini-swe-agent and aider, pinned in
tests/clients/requirements-mini.txt and requirements-aider.txt (each installed into a virtualenv of its own,
tests/clients/venv-mini and venv-aider).

``scripts/install-clients`` installs them (npm, native binaries included) into
tests/clients/node_modules. Each run gets its own HOME (and CODEX_HOME) under
the test's tmp_path and an environment built from nothing but PATH, so no user
configuration, key or proxy setting leaks in, and both agents talk to the one
loopback base URL they are given and nothing else:

- Codex: a custom ``[model_providers.…]`` with ``wire_api = "responses"``; the
  features that reach other hosts at startup are off (``features.plugins``
  looks up github.com, api.github.com and chatgpt.com; ``analytics`` posts to
  ab.chatgpt.com); retries are off so an error shows at once instead of after
  backoff; the context window and auto-compaction limit are set far above any
  test's window, so the proxy has to do the compacting.
- Claude Code: ``ANTHROPIC_BASE_URL`` and a dummy key, its auto-compaction off
  (``DISABLE_AUTO_COMPACT``), non-essential traffic (telemetry, update checks)
  off, only the Bash tool offered and allowed.
- aider: ``--openai-api-base`` and a dummy key, its history summary out of reach,
  typed its messages on stdin (``run_aider``); no model list fetched (a local
  model metadata file, litellm's bundled price list).

Runs are bounded by ``timeout``; on expiry the agent's whole process group is
killed and the run reported with return code ``None``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.launch.agents import OUT_OF_REACH

CLIENTS = Path(__file__).resolve().parent / "clients"
BIN = CLIENTS / "node_modules" / ".bin"
PINNED: dict[str, str] = json.loads((CLIENTS / "package.json").read_text())["dependencies"]
CODEX_VERSION = PINNED["@openai/codex"]
CLAUDE_VERSION = PINNED["@anthropic-ai/claude-code"]
GEMINI_VERSION = PINNED["@google/gemini-cli"]
QWEN_VERSION = PINNED["@qwen-code/qwen-code"]
OPENCODE_VERSION = PINNED["opencode-ai"]
CLINE_VERSION = PINNED["cline"]
#: mini-swe-agent's virtualenv (scripts/install-clients) and its pin.
MINI_VENV = CLIENTS / "venv-mini"
MINI_VERSION = (CLIENTS / "requirements-mini.txt").read_text().strip().removeprefix("mini-swe-agent==")
#: LiteLLM's OpenAI provider (Chat Completions at ``api_base``) and a model it knows; the fakes answer any name.
MINI_MODEL = "openai/gpt-5.5"
#: The first line of a command's output that ends a mini-swe-agent run (its LocalEnvironment._check_finished): the
#: lines after it are the submission.
MINI_SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: A model Gemini CLI knows (it sends it as ``gemini-3.1-pro-preview``); the fakes answer any name.
GEMINI_MODEL = "gemini-3-pro-preview"
#: A model name Qwen Code knows nothing of (it then assumes a 200k window); the fake answers any name.
QWEN_MODEL = "qwen3-coder-plus"
#: A model Codex knows (so it sends what it sends for a real model); the fakes answer any name.
CODEX_MODEL = "gpt-5.5"
#: A model pi's built-in openai provider (Responses API) knows; the fakes answer any name.
PI_MODEL = "gpt-5.5"
#: A model opencode's anthropic provider knows (from the snapshot it ships: it fetches no list).
OPENCODE_MODEL = "anthropic/claude-sonnet-4-5"
#: Codex's window and auto-compaction limit: far above any test's window.
CODEX_WINDOW = 1_000_000
#: aider, in its own virtualenv (``scripts/install-clients``: aider-chat as requirements-aider.txt pins it).
AIDER = CLIENTS / "venv-aider" / "bin" / "aider"
#: A model aider knows (its edit format for it is ``diff``, SEARCH/REPLACE blocks); the fakes answer any name.
AIDER_MODEL = "openai/gpt-5"
TIMEOUT = 60.0


@dataclass
class AgentRun:
    """A finished run. ``final_text``: the agent's last answer; ``errors``: the errors it reported."""

    returncode: int | None
    stdout: str
    stderr: str
    events: list[dict[str, Any]] = field(default_factory=list)
    final_text: str | None = None
    errors: list[str] = field(default_factory=list)


def binary(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        raise RuntimeError(f"{path} is missing: run scripts/install-clients")
    return path


def base_env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
            "TERM": "dumb", "NO_COLOR": "1"}


def codex_config(base_url: str, window: int = CODEX_WINDOW) -> str:
    """The config.toml of a Codex run against ``base_url`` (``…/v1``)."""
    return "\n".join([
        f'model = "{CODEX_MODEL}"',
        'model_provider = "ctxproxy-test"',
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        f"model_context_window = {window}",
        f"model_auto_compact_token_limit = {window}",
        "",
        "[model_providers.ctxproxy-test]",
        'name = "ctxproxy test upstream"',
        f'base_url = "{base_url}"',
        'env_key = "CTXPROXY_TEST_KEY"',
        'wire_api = "responses"',
        "request_max_retries = 0",
        "stream_max_retries = 0",
        "",
        "[features]",
        "plugins = false",
        "",
        "[analytics]",
        "enabled = false",
        "",
    ])


async def run_codex(base_url: str, root: Path, prompt: str, *, timeout: float = TIMEOUT) -> AgentRun:
    """``codex exec --json`` in ``root/work``, configured by ``root/codex-home/config.toml``."""
    home, work = _dirs(root)
    codex_home = root / "codex-home"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url))
    env = {**base_env(home), "CODEX_HOME": str(codex_home), "CTXPROXY_TEST_KEY": "sk-ctxproxy-test"}
    argv = [str(binary("codex")), "exec", "--skip-git-repo-check", "-C", str(work), "--json", prompt]
    run = await _run(argv, env, work, timeout)
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            run.events.append(json.loads(line))
    for event in run.events:
        item = event.get("item") or {}
        if event.get("type") == "item.completed" and item.get("type") == "agent_message":
            run.final_text = item.get("text")
        elif event.get("type") == "error" or item.get("type") == "error":
            run.errors.append(str(event.get("message") or item.get("message")))
        elif event.get("type") == "turn.failed":
            run.errors.append(str((event.get("error") or {}).get("message")))
    return run


async def run_claude(base_url: str, root: Path, prompt: str, *, max_turns: int, tools: str = "Bash",
                     timeout: float = TIMEOUT) -> AgentRun:
    """``claude -p --output-format json`` in ``root/work`` with only ``tools`` (comma-separated) offered and
    allowed, at ``base_url`` (no ``/v1``)."""
    home, work = _dirs(root)
    env = {**base_env(home), "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-ant-ctxproxy-test",
           "DISABLE_AUTO_COMPACT": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    argv = [str(binary("claude")), "-p", "--tools", tools, "--allowedTools", tools, "--max-turns", str(max_turns),
            "--output-format", "json", prompt]
    run = await _run(argv, env, work, timeout)
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            run.events.append(json.loads(line))
    result = next((e for e in reversed(run.events) if e.get("type") == "result"), None)
    if result is not None:
        if result.get("is_error"):
            run.errors.append(str(result.get("result")))
        else:
            run.final_text = result.get("result")
    return run


def gemini_settings(compression_threshold: float = 1.0) -> dict[str, Any]:
    """``~/.gemini/settings.json`` of a run: the API-key auth, its compression at ``compression_threshold`` of its
    assumed 1,048,576-token window (1.0: off), nothing reported anywhere."""
    return {"security": {"auth": {"selectedType": "gemini-api-key"}},
            "model": {"compressionThreshold": compression_threshold},
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}


async def run_gemini(base_url: str, root: Path, prompt: str, *, compression_threshold: float = 1.0,
                     timeout: float = TIMEOUT) -> AgentRun:
    """``gemini -p … --output-format json`` in ``root/work``, at ``base_url`` (no ``/v1beta``)."""
    home, work = _dirs(root)
    (home / ".gemini").mkdir(exist_ok=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(gemini_settings(compression_threshold)))
    env = {**base_env(home), "GOOGLE_GEMINI_BASE_URL": base_url, "GEMINI_API_KEY": "gemini-ctxproxy-test"}
    argv = [str(binary("gemini")), "-p", prompt, "--yolo", "--skip-trust", "-m", GEMINI_MODEL,
            "--output-format", "json"]
    run = await _run(argv, env, work, timeout)
    # The JSON result goes to stdout; after a failed turn, to the end of stderr, after the stack trace.
    text = run.stdout if run.stdout.lstrip().startswith("{") else run.stderr[run.stderr.rfind("\n{\n") + 1:]
    try:
        result = json.loads(text)
    except json.JSONDecodeError:
        result = {}
    run.events.append(result)
    if result.get("error"):
        run.errors.append(str(result["error"].get("message")))
    run.final_text = result.get("response")
    return run


def qwen_settings() -> dict[str, Any]:
    """``~/.qwen/settings.json`` of a run: the OpenAI auth, its compaction at 1.0 of the window, no memory agents."""
    return {"security": {"auth": {"selectedType": "openai"}}, "context": {"autoCompactThreshold": 1.0},
            "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False, "enableAutoSkill": False},
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}


async def run_qwen(base_url: str, root: Path, prompt: str, *, timeout: float = TIMEOUT) -> AgentRun:
    """``qwen -p … --yolo --output-format json`` in ``root/work``, at ``base_url`` (``…/v1``)."""
    home, work = _dirs(root)
    (home / ".qwen").mkdir(exist_ok=True)
    (home / ".qwen" / "settings.json").write_text(json.dumps(qwen_settings()))
    env = {**base_env(home), "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "sk-qwen-ctxproxy-test",
           "OPENAI_MODEL": QWEN_MODEL, "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}
    argv = [str(binary("qwen")), "-p", prompt, "--yolo", "--output-format", "json"]
    run = await _run(argv, env, work, timeout)
    start = run.stdout.find("[")
    try:
        run.events = json.loads(run.stdout[start:]) if start != -1 else []
    except json.JSONDecodeError:
        run.events = []
    result = next((e for e in reversed(run.events) if e.get("type") == "result"), None)
    if result is not None:
        if result.get("is_error"):
            run.errors.append(str(result.get("result") or result.get("error")))
        else:
            run.final_text = result.get("result")
    return run


async def run_pi(base_url: str, root: Path, prompt: str, *, timeout: float = TIMEOUT) -> AgentRun:
    """``pi -p --mode json`` in ``root/work`` with its openai provider (Responses API) at ``base_url`` (``…/v1``)
    and its own compaction off (``~/.pi/agent/settings.json``)."""
    home, work = _dirs(root)
    agent = home / ".pi" / "agent"
    agent.mkdir(parents=True, exist_ok=True)
    (agent / "models.json").write_text(json.dumps({"providers": {"openai": {"baseUrl": base_url}}}))
    (agent / "settings.json").write_text(json.dumps({"compaction": {"enabled": False}}))
    env = {**base_env(home), "OPENAI_API_KEY": "sk-pi-ctxproxy-test", "PI_OFFLINE": "1"}
    argv = [str(binary("pi")), "-p", "--mode", "json", "--provider", "openai", "--model", PI_MODEL, prompt]
    run = await _run(argv, env, work, timeout)
    run.events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    answers = [e["message"] for e in run.events if e.get("type") == "message_end"
               and e["message"].get("role") == "assistant"]
    if answers:
        run.final_text = "".join(c.get("text", "") for c in answers[-1]["content"] if c.get("type") == "text")
        if answers[-1].get("errorMessage"):
            run.errors.append(str(answers[-1]["errorMessage"]))
    return run


def opencode_config(base_url: str) -> dict[str, Any]:
    """The inline config (``OPENCODE_CONFIG_CONTENT``) of a run: its anthropic provider at ``base_url`` (``…/v1``),
    its compaction off, every tool allowed, nothing shared or updated."""
    return {"provider": {"anthropic": {"options": {"baseURL": base_url, "apiKey": "sk-ant-opencode-test"}}},
            "model": OPENCODE_MODEL, "compaction": {"auto": False}, "permission": {"bash": "allow"},
            "share": "disabled", "autoupdate": False}


async def run_opencode(base_url: str, root: Path, prompt: str, *, timeout: float = TIMEOUT) -> AgentRun:
    """``opencode run --format json`` in ``root/work``, configured inline (``opencode_config``)."""
    home, work = _dirs(root)
    env = {**base_env(home), "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(base_url)),
           "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"}
    argv = [str(binary("opencode")), "run", "--format", "json", prompt]
    run = await _run(argv, env, work, timeout)
    run.events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    texts = [e["part"]["text"] for e in run.events if e.get("type") == "text"]
    run.final_text = texts[-1] if texts else None
    run.errors = [str(e.get("error")) for e in run.events if e.get("type") == "error"]
    return run


async def run_cline(base_url: str, root: Path, prompt: str, *, timeout: float = TIMEOUT) -> AgentRun:
    """``cline --json`` in ``root/work`` with its OpenAI-compatible provider (Chat Completions) at ``base_url``
    (``…/v1``, set by ``cline auth``, which writes its settings), its compaction off."""
    home, work = _dirs(root)
    env = base_env(home)
    auth = await _run([str(binary("cline")), "auth", "-p", "openai", "-k", "sk-cline-ctxproxy-test", "-m", QWEN_MODEL,
                       "-b", base_url], env, work, timeout)
    if auth.returncode != 0:
        return auth
    argv = [str(binary("cline")), "--json", "--compaction", "off", "-c", str(work), prompt]
    run = await _run(argv, env, work, timeout)
    run.events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    for event in run.events:
        if event.get("type") == "run_result":
            run.final_text = event.get("text")
        elif event.get("type") == "error":
            run.errors.append(str(event.get("message")))
    return run


def mini_config(base_url: str) -> dict[str, Any]:
    """The config a mini-swe-agent run merges over its own ``mini.yaml``: LiteLLM's OpenAI provider at ``base_url``
    (``…/v1``) with a dummy key and the OpenAI SDK's retries off (an error shows at once), commands run unconfirmed
    (yolo) and the run ended at the submission without asking, no step or cost limit, and an answer LiteLLM cannot
    price (or prices at 0) counted as costing nothing rather than as an error that ends the run. mini-swe-agent has
    no compaction of its own: it sends its whole history every step (an output over 10,000 characters is cut to its
    head and tail, far above the tests')."""
    return {"agent": {"mode": "yolo", "confirm_exit": False, "step_limit": 0, "cost_limit": 0},
            "model": {"model_name": MINI_MODEL, "cost_tracking": "ignore_errors",
                      "model_kwargs": {"api_base": base_url, "api_key": "sk-mini-ctxproxy-test", "drop_params": True,
                                       "max_retries": 0}}}


async def run_mini(base_url: str, root: Path, prompt: str, *, timeout: float = TIMEOUT) -> AgentRun:
    """``mini -y --exit-immediately`` in ``root/work`` configured by ``root/mini.yaml`` (``mini_config``), its
    trajectory in ``root/mini.traj.json``: the final text is its submission, an exit other than ``Submitted`` an
    error. Its first-run wizard is skipped (``MSWEA_CONFIGURED``), its global config kept under the run's HOME,
    LiteLLM's price map read from the package rather than fetched, and a failed model call not retried."""
    home, work = _dirs(root)
    config, trajectory = root / "mini.yaml", root / "mini.traj.json"
    config.write_text(json.dumps(mini_config(base_url)))  # JSON is YAML
    mini = MINI_VENV / "bin" / "mini"
    if not mini.exists():
        raise RuntimeError(f"{mini} is missing: run scripts/install-clients")
    env = {**base_env(home), "MSWEA_CONFIGURED": "true", "MSWEA_SILENT_STARTUP": "1",
           "MSWEA_GLOBAL_CONFIG_DIR": str(home / "mini-swe-agent"), "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    argv = [str(mini), "-c", "mini.yaml", "-c", str(config), "-y", "--exit-immediately", "-o", str(trajectory),
            "-t", prompt]
    run = await _run(argv, env, work, timeout)
    if trajectory.exists():
        saved = json.loads(trajectory.read_text())
        run.events = saved["messages"]
        info = saved["info"]
        if info.get("exit_status") == "Submitted":
            run.final_text = info.get("submission")
        else:
            run.errors.append(f"{info.get('exit_status')}: {run.events[-1].get('content') if run.events else ''}")
    return run


def aider_metadata() -> dict[str, Any]:
    """What aider is told of its model (``--model-metadata-file``), so that it looks up no model list online (it
    fetches litellm's price list from GitHub for a model it has no local metadata of). The window is the one
    litellm's bundled map gives GPT-5."""
    return {AIDER_MODEL: {"max_input_tokens": 272_000, "max_output_tokens": 128_000, "litellm_provider": "openai",
                          "mode": "chat", "input_cost_per_token": 1.25e-06, "output_cost_per_token": 1e-05}}


async def run_aider(base_url: str, root: Path, messages: list[str], files: list[str], *,
                    timeout: float = TIMEOUT) -> AgentRun:
    """aider in ``root/work`` with ``files`` (there already) in its chat, at ``base_url`` (``…/v1``), typing
    ``messages`` one per line on its stdin (``TERM=dumb``: plain ``input()``, no prompt_toolkit) and ending at their
    end; git, analytics, the update check, linting and its repo map off, its history summary out of reach
    (``--max-chat-history-tokens``, as ``ctxproxy run aider`` sets it). It streams, its default."""
    if not AIDER.exists():
        raise RuntimeError(f"{AIDER} is missing: run scripts/install-clients")
    home, work = _dirs(root)
    metadata = root / "aider-models.json"
    metadata.write_text(json.dumps(aider_metadata()))
    # litellm fetches its own price list from GitHub at import unless told to use the one it ships.
    env = {**base_env(home), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    argv = [str(AIDER), "--model", AIDER_MODEL, "--weak-model", AIDER_MODEL, "--openai-api-base", base_url,
            "--openai-api-key", "sk-aider-ctxproxy-test", "--model-metadata-file", str(metadata),
            "--yes-always", "--no-git", "--no-auto-commits", "--no-pretty", "--no-fancy-input", "--map-tokens", "0",
            "--no-auto-lint", "--no-check-update", "--no-analytics", "--analytics-disable",
            "--no-show-release-notes", "--max-chat-history-tokens", str(OUT_OF_REACH), *files]
    return await _run(argv, env, work, timeout, "".join(f"{m}\n" for m in messages).encode())


def codex_outputs(run: AgentRun) -> list[str]:
    """What each shell command of a Codex run printed, in order."""
    return [e["item"]["aggregated_output"] for e in run.events
            if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"]


def without_cache_control(value: Any) -> Any:
    """A message as the model reads it: no ``cache_control``, and a lone text block the same as its string.

    Claude Code moves its one cache breakpoint to the newest message on every
    request and turns the first system message's lone text block into a plain
    string once it loses the breakpoint (docs/CLIENTS.md): neither is an edit.
    """
    if isinstance(value, dict):
        return {k: without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        if len(value) == 1 and isinstance(value[0], dict) and set(value[0]) - {"cache_control"} == {"type", "text"}:
            return value[0]["text"]
        return [without_cache_control(v) for v in value]
    return value


def _dirs(root: Path) -> tuple[Path, Path]:
    home, work = root / "home", root / "work"
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    return home, work


async def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float,
               stdin: bytes | None = None) -> AgentRun:
    """Run to the end or to ``timeout``, reading ``stdin`` (none: stdin closed); in its own session, so its shells
    die with it."""
    source = asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE
    proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=cwd, stdin=source,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = await proc.communicate()
        return AgentRun(None, out.decode(errors="replace"), err.decode(errors="replace"))
    return AgentRun(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
