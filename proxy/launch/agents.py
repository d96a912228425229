"""How each coding agent is pointed at the proxy: one recipe per agent, in one table (``AGENTS``).

A recipe turns a ``Target`` (the proxy's root URL, the session's name, whether
the agent keeps its own auto-compaction, a private directory and the user's
environment) into the environment variables to run the agent with. Whatever a
recipe must write goes into that private directory; the user's own config files
are read, never written:

- Claude Code: ``ANTHROPIC_BASE_URL`` (no ``/v1``), ``DISABLE_AUTO_COMPACT=1``.
- Codex CLI: a ``CODEX_HOME`` overlay. Its ``config.toml`` is the user's with the
  provider's ``base_url`` (a custom ``model_provider``) or ``openai_base_url`` (the
  built-in one) set to the proxy and ``model_auto_compact_token_limit`` raised out
  of reach, ``model_context_window`` with it (Codex caps the limit at 90 % of that
  window); every other entry of the user's ``CODEX_HOME`` (``auth.json``, sessions,
  history) is a symlink to the user's own, so the login is theirs and what Codex
  records lands where it always does.
- opencode: ``OPENCODE_CONFIG_CONTENT``, the inline config opencode merges over
  every file (global, ``OPENCODE_CONFIG``, project): the openai and anthropic
  providers' ``baseURL`` and ``compaction.auto = false``; no file at all.
- pi: a ``PI_CODING_AGENT_DIR`` overlay like Codex's: ``settings.json`` with
  ``compaction.enabled = false``, ``models.json`` with the openai and anthropic
  providers' ``baseUrl`` at the proxy, the rest symlinked.
- aider: ``OPENAI_API_BASE``; ``AIDER_MAX_CHAT_HISTORY_TOKENS`` so high that its
  history summary never starts.
- Qwen Code: ``OPENAI_BASE_URL`` and a system settings file
  (``QWEN_CODE_SYSTEM_SETTINGS_PATH``, the layer over the user's settings):
  ``security.auth.selectedType = "openai"``, ``context.autoCompactThreshold = 1``.
- Gemini CLI: ``GOOGLE_GEMINI_BASE_URL`` at the proxy's root, the session as
  ``GEMINI_CLI_CUSTOM_HEADERS="X-Session-Id: …"`` (its door has no ``/s/`` prefix), and
  a system settings file (``GEMINI_CLI_SYSTEM_SETTINGS_PATH``):
  ``security.auth.selectedType = "gemini-api-key"``, ``model.compressionThreshold = 1``.

A system settings file replaces the machine's own (``/etc/…/settings.json``), so
the recipe starts from that file's settings when there is one. Every other agent
is named by the ``/s/SESSION`` prefix of its base URL.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import tomli_w

from proxy.constants import HEADER_SESSION

#: Far above any window: the agent's own compaction never starts.
OUT_OF_REACH = 1_000_000_000


@dataclass(frozen=True)
class Target:
    """Where an agent is sent and what a recipe may use to send it there."""

    #: The proxy's root URL, e.g. ``http://127.0.0.1:43117`` (no trailing slash).
    root: str
    session: str
    keep_compaction: bool
    #: A private directory for the files a recipe writes (removed after the run, kept by ``--print-env``).
    workdir: Path
    #: The user's environment: where their own config directories are.
    environ: Mapping[str, str]

    @property
    def session_root(self) -> str:
        return f"{self.root}/s/{self.session}"

    @property
    def home(self) -> Path:
        return Path(self.environ.get("HOME") or Path.home())


@dataclass(frozen=True)
class Recipe:
    name: str
    #: The program ``ctxproxy run NAME`` starts.
    command: str
    env: Callable[[Target], dict[str, str]]


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        old = merged.get(key)
        merged[key] = _deep_merge(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
    return merged


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a user's file, or an empty one when it is missing or not an object."""
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def overlay(user_dir: Path, dest: Path, files: Mapping[str, bytes]) -> Path:
    """``dest`` holding ``files`` and a symlink to every other entry of ``user_dir`` (when it exists)."""
    dest.mkdir(parents=True, exist_ok=True)
    if user_dir.is_dir():
        for entry in user_dir.iterdir():
            if entry.name not in files:
                (dest / entry.name).symlink_to(entry.resolve())
    for name, content in files.items():
        (dest / name).write_bytes(content)
    return dest


def _write(target: Target, name: str, content: bytes) -> str:
    path = target.workdir / name
    path.write_bytes(content)
    return str(path)


def claude(t: Target) -> dict[str, str]:
    env = {"ANTHROPIC_BASE_URL": t.session_root}
    return env if t.keep_compaction else {**env, "DISABLE_AUTO_COMPACT": "1"}


def codex(t: Target) -> dict[str, str]:
    user = Path(t.environ.get("CODEX_HOME") or t.home / ".codex")
    try:
        config: dict[str, Any] = tomllib.loads((user / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        config = {}
    base_url = t.session_root + "/v1"
    provider = config.get("model_provider")
    providers = config.get("model_providers")
    if isinstance(provider, str) and isinstance(providers, dict) and isinstance(providers.get(provider), dict):
        config = _deep_merge(config, {"model_providers": {provider: {"base_url": base_url}}})
    else:
        config["openai_base_url"] = base_url
    if not t.keep_compaction:  # Codex caps the limit at 90 % of the window it believes: both go out of reach
        config["model_auto_compact_token_limit"] = config["model_context_window"] = OUT_OF_REACH
    home = overlay(user, t.workdir / "codex-home", {"config.toml": tomli_w.dumps(config).encode()})
    return {"CODEX_HOME": str(home)}


def opencode(t: Target) -> dict[str, str]:
    base = {"options": {"baseURL": t.session_root + "/v1"}}
    config: dict[str, Any] = {"provider": {"openai": base, "anthropic": base}}
    if not t.keep_compaction:
        config["compaction"] = {"auto": False}
    return {"OPENCODE_CONFIG_CONTENT": orjson.dumps(config).decode()}


def pi(t: Target) -> dict[str, str]:
    user = Path(t.environ.get("PI_CODING_AGENT_DIR") or t.home / ".pi" / "agent")
    models = _deep_merge(_read_json(user / "models.json"), {"providers": {
        "openai": {"baseUrl": t.session_root + "/v1"}, "anthropic": {"baseUrl": t.session_root}}})
    files = {"models.json": orjson.dumps(models, option=orjson.OPT_INDENT_2)}
    if not t.keep_compaction:
        settings = _deep_merge(_read_json(user / "settings.json"), {"compaction": {"enabled": False}})
        files["settings.json"] = orjson.dumps(settings, option=orjson.OPT_INDENT_2)
    return {"PI_CODING_AGENT_DIR": str(overlay(user, t.workdir / "pi-agent", files))}


def aider(t: Target) -> dict[str, str]:
    env = {"OPENAI_API_BASE": t.session_root + "/v1"}
    return env if t.keep_compaction else {**env, "AIDER_MAX_CHAT_HISTORY_TOKENS": str(OUT_OF_REACH)}


def _system_settings(t: Target, variable: str, machine_file: str, settings: Mapping[str, Any]) -> dict[str, str]:
    """A system settings file (the layer over the user's own) holding ``settings`` over the machine's."""
    base = _read_json(Path(t.environ.get(variable) or machine_file))
    name = variable.lower().removesuffix("_path") + ".json"
    return {variable: _write(t, name, orjson.dumps(_deep_merge(base, settings), option=orjson.OPT_INDENT_2))}


def qwen(t: Target) -> dict[str, str]:
    settings: dict[str, Any] = {"security": {"auth": {"selectedType": "openai"}}}
    if not t.keep_compaction:
        settings["context"] = {"autoCompactThreshold": 1.0}
    return {"OPENAI_BASE_URL": t.session_root + "/v1",
            **_system_settings(t, "QWEN_CODE_SYSTEM_SETTINGS_PATH", "/etc/qwen-code/settings.json", settings)}


def gemini(t: Target) -> dict[str, str]:
    settings: dict[str, Any] = {"security": {"auth": {"selectedType": "gemini-api-key"}}}
    if not t.keep_compaction:
        settings["model"] = {"compressionThreshold": 1.0}
    return {"GOOGLE_GEMINI_BASE_URL": t.root, "GEMINI_CLI_CUSTOM_HEADERS": f"{HEADER_SESSION}: {t.session}",
            **_system_settings(t, "GEMINI_CLI_SYSTEM_SETTINGS_PATH", "/etc/gemini-cli/settings.json", settings)}


AGENTS: dict[str, Recipe] = {r.name: r for r in (
    Recipe("claude", "claude", claude),
    Recipe("codex", "codex", codex),
    Recipe("opencode", "opencode", opencode),
    Recipe("pi", "pi", pi),
    Recipe("aider", "aider", aider),
    Recipe("qwen", "qwen", qwen),
    Recipe("gemini", "gemini", gemini),
)}


def agent_env(name: str, target: Target) -> dict[str, str]:
    """The variables ``name`` runs with (its recipe's files written into ``target.workdir``)."""
    target.workdir.mkdir(parents=True, exist_ok=True)
    return AGENTS[name].env(target)
