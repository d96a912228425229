"""How each coding agent is pointed at the proxy: one recipe per agent, in one table (``AGENTS``).

A recipe turns a ``Target`` (the proxy's root URL, the session's name, whether
the agent keeps its own auto-compaction, where its files go and the user's
environment) into a ``Plan``: the variables to run the agent with and the
arguments put before the user's. The user's own config files are read, never
written, nor copied: nothing the agent writes to its home goes anywhere but the
user's home. A variable the user already set that the recipe must change is
extended (a header list, an inline JSON config), not replaced.

Each recipe also says where the user's environment already sends the agent
(``endpoints``): that endpoint becomes the embedded proxy's upstream for that
door, so a user's gateway (and the gateway's key) keeps being where requests go.

- Claude Code: ``ANTHROPIC_BASE_URL`` (no ``/v1``), ``DISABLE_AUTO_COMPACT=1``.
- Codex CLI: ``-c`` overrides: the provider's ``base_url`` (the user's custom
  ``model_provider``) or ``openai_base_url`` (the built-in one) at the proxy, and
  ``model_auto_compact_token_limit`` raised out of reach, ``model_context_window``
  with it (Codex caps the limit at 90 % of that window); the user's custom provider's
  ``supports_websockets`` off (the proxy answers a websocket upgrade 426, which
  Codex logs as an ERROR line before it falls back to HTTP; its built-in
  provider cannot be overridden); ``CODEX_HOME`` is the user's.
- opencode: ``OPENCODE_CONFIG_CONTENT``, the inline config opencode merges over
  every file: the user's own inline config with the openai and anthropic
  providers' ``baseURL`` and ``compaction.auto = false`` merged in.
- pi: an extension shipped with ctxproxy (``-e pi_extension.ts``) that points
  the openai and anthropic providers at the proxy and cancels pi's automatic
  compactions, told where by ``CTXPROXY_PI_*`` variables.
- aider: ``OPENAI_API_BASE`` (and ``OPENAI_BASE_URL``, which litellm prefers, when
  the user set it); ``AIDER_MAX_CHAT_HISTORY_TOKENS`` so high that its history
  summary never starts.
- Qwen Code: ``OPENAI_BASE_URL`` and a system settings file
  (``QWEN_CODE_SYSTEM_SETTINGS_PATH``, the layer over the user's settings):
  ``security.auth.selectedType = "openai"``, ``context.autoCompactThreshold = 1``.
- Gemini CLI: ``GOOGLE_GEMINI_BASE_URL`` at the proxy's root, the session as
  ``X-Session-Id`` added to ``GEMINI_CLI_CUSTOM_HEADERS`` (its door has no ``/s/``
  prefix), and a system settings file (``GEMINI_CLI_SYSTEM_SETTINGS_PATH``):
  ``security.auth.selectedType = "gemini-api-key"``, ``model.compressionThreshold = 1``.

A system settings file replaces the machine's own (``/etc/…/settings.json``), so
the recipe starts from that file's settings when there is one. Every other agent
is named by the ``/s/SESSION`` prefix of its base URL.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import orjson

from proxy.constants import HEADER_SESSION
from proxy.settings import Settings

#: Far above any window: the agent's own compaction never starts.
OUT_OF_REACH = 1_000_000_000
#: The pi extension ``ctxproxy run pi`` loads (``-e``): shipped with the package, so nothing is written for it.
PI_EXTENSION = Path(__file__).with_name("pi_extension.ts")
#: pi's commands that call no model (``pi install …``; those of ``pi --help``): ``-e`` before them would make them
#: a prompt. Any other first word is a prompt already, which must reach the model through the proxy.
PI_COMMANDS = frozenset({"install", "remove", "uninstall", "update", "list", "config"})
#: The ``Settings`` field of each door's upstream.
OPENAI, ANTHROPIC, GEMINI = "upstream", "anthropic_upstream", "gemini_upstream"


class Files(Protocol):
    """Where a recipe's files go: ``put`` returns the path the agent reads ``content`` at."""

    def put(self, name: str, content: bytes) -> str: ...


@dataclass(frozen=True)
class Target:
    """Where an agent is sent and what a recipe may use to send it there."""

    #: The proxy's root URL, e.g. ``http://127.0.0.1:43117`` (no trailing slash).
    root: str
    session: str
    keep_compaction: bool
    files: Files
    #: The user's environment: where their own config directories are, and the variables to extend.
    environ: Mapping[str, str]

    @property
    def session_root(self) -> str:
        return f"{self.root}/s/{self.session}"

    @property
    def home(self) -> Path:
        return Path(self.environ.get("HOME") or Path.home())


@dataclass(frozen=True)
class Plan:
    """What the agent runs with: variables over the user's, and arguments before the user's."""

    env: dict[str, str]
    args: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Recipe:
    name: str
    #: The program ``ctxproxy run NAME`` starts.
    command: str
    plan: Callable[[Target], Plan]
    #: Where the user's environment already sends the agent: ``Settings`` field of the door -> base URL, in the
    #: form that field takes (OpenAI's with its ``/v1``, Anthropic's and Gemini's without a version).
    endpoints: Callable[[Mapping[str, str]], dict[str, str]]
    #: The agent's commands that call no model: run without the plan's arguments.
    bare_commands: frozenset[str] = frozenset()


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        old = merged.get(key)
        merged[key] = _deep_merge(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
    return merged


def _json_object(raw: bytes | str) -> dict[str, Any]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a user's file, or an empty one when it is missing or not an object."""
    try:
        return _json_object(path.read_bytes())
    except OSError:
        return {}


def _dig(data: Any, *path: str) -> str | None:
    """The non-empty string at ``path`` in nested objects, else None."""
    for name in path:
        data = data.get(name) if isinstance(data, dict) else None
    return data.rstrip("/") if isinstance(data, str) and data.strip() else None


def _named(environ: Mapping[str, str], **doors: str | tuple[str, ...]) -> dict[str, str]:
    """door -> the first of its variables the user set (non-empty), without a trailing slash."""
    found = {}
    for door, names in doors.items():
        for name in (names,) if isinstance(names, str) else names:
            if environ.get(name, "").strip():
                found[door] = environ[name].strip().rstrip("/")
                break
    return found


def _present(**candidates: str | None) -> dict[str, str]:
    return {door: url for door, url in candidates.items() if url is not None}


def claude(t: Target) -> Plan:
    env = {"ANTHROPIC_BASE_URL": t.session_root}
    return Plan(env if t.keep_compaction else {**env, "DISABLE_AUTO_COMPACT": "1"})


def _claude_endpoints(environ: Mapping[str, str]) -> dict[str, str]:
    return _named(environ, anthropic_upstream="ANTHROPIC_BASE_URL")


def _codex_config(environ: Mapping[str, str]) -> dict[str, Any]:
    home = Path(environ.get("HOME") or Path.home())
    try:
        return tomllib.loads((Path(environ.get("CODEX_HOME") or home / ".codex") / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}


def _codex_provider(config: Mapping[str, Any]) -> str | None:
    """The user's custom provider, when their config selects one it defines."""
    provider, providers = config.get("model_provider"), config.get("model_providers")
    if isinstance(provider, str) and isinstance(providers, dict) and isinstance(providers.get(provider), dict):
        return provider
    return None


def codex(t: Target) -> Plan:
    provider = _codex_provider(_codex_config(t.environ))
    where = f"model_providers.{provider}.base_url" if provider is not None else "openai_base_url"
    base_url = t.session_root + "/v1"
    args = ["-c", f"{where}={orjson.dumps(base_url).decode()}"]  # a TOML basic string
    if provider is not None:
        args += ["-c", f"model_providers.{provider}.supports_websockets=false"]
    if not t.keep_compaction:  # Codex caps the limit at 90 % of the window it believes: both go out of reach
        args += ["-c", f"model_auto_compact_token_limit={OUT_OF_REACH}", "-c", f"model_context_window={OUT_OF_REACH}"]
    # The built-in provider reads OPENAI_BASE_URL too: a user's value would send Codex around the proxy.
    env = {"OPENAI_BASE_URL": base_url} if provider is None and "OPENAI_BASE_URL" in t.environ else {}
    return Plan(env, args)


def _codex_endpoints(environ: Mapping[str, str]) -> dict[str, str]:
    config = _codex_config(environ)
    provider = _codex_provider(config)
    if provider is not None:
        return _present(upstream=_dig(config, "model_providers", provider, "base_url"))
    return _present(upstream=_dig(config, "openai_base_url")) or _named(environ, upstream="OPENAI_BASE_URL")


def _opencode_inline(environ: Mapping[str, str]) -> dict[str, Any]:
    return _json_object(environ.get("OPENCODE_CONFIG_CONTENT") or "{}")


def opencode(t: Target) -> Plan:
    base = {"options": {"baseURL": t.session_root + "/v1"}}
    config: dict[str, Any] = {"provider": {"openai": base, "anthropic": base}}
    if not t.keep_compaction:
        config["compaction"] = {"auto": False}
    merged = _deep_merge(_opencode_inline(t.environ), config)
    return Plan({"OPENCODE_CONFIG_CONTENT": orjson.dumps(merged).decode()})


def _opencode_endpoints(environ: Mapping[str, str]) -> dict[str, str]:
    """Its inline config's providers, else the AI SDK's variables; the AI SDK's Anthropic URL ends in ``/v1``."""
    inline = _opencode_inline(environ)
    found = {**_named(environ, upstream="OPENAI_BASE_URL", anthropic_upstream="ANTHROPIC_BASE_URL"),
             **_present(upstream=_dig(inline, "provider", "openai", "options", "baseURL"),
                        anthropic_upstream=_dig(inline, "provider", "anthropic", "options", "baseURL"))}
    if ANTHROPIC in found:
        found[ANTHROPIC] = found[ANTHROPIC].removesuffix("/v1")
    return found


def pi(t: Target) -> Plan:
    env = {"CTXPROXY_PI_OPENAI_BASE_URL": t.session_root + "/v1", "CTXPROXY_PI_ANTHROPIC_BASE_URL": t.session_root}
    if not t.keep_compaction:
        env["CTXPROXY_PI_NO_AUTO_COMPACTION"] = "1"
    return Plan(env, ["-e", str(PI_EXTENSION)])


def _pi_endpoints(environ: Mapping[str, str]) -> dict[str, str]:
    home = Path(environ.get("HOME") or Path.home())
    models = _read_json(Path(environ.get("PI_CODING_AGENT_DIR") or home / ".pi" / "agent") / "models.json")
    return _present(upstream=_dig(models, "providers", "openai", "baseUrl"),
                    anthropic_upstream=_dig(models, "providers", "anthropic", "baseUrl"))


def aider(t: Target) -> Plan:
    env = {"OPENAI_API_BASE": t.session_root + "/v1"}
    if "OPENAI_BASE_URL" in t.environ:  # litellm reads it before OPENAI_API_BASE
        env["OPENAI_BASE_URL"] = env["OPENAI_API_BASE"]
    return Plan(env if t.keep_compaction else {**env, "AIDER_MAX_CHAT_HISTORY_TOKENS": str(OUT_OF_REACH)})


def _system_settings(t: Target, variable: str, machine_file: str, settings: Mapping[str, Any]) -> dict[str, str]:
    """A system settings file (the layer over the user's own) holding ``settings`` over the machine's."""
    base = _read_json(Path(t.environ.get(variable) or machine_file))
    name = variable.lower().removesuffix("_path") + ".json"
    return {variable: t.files.put(name, orjson.dumps(_deep_merge(base, settings), option=orjson.OPT_INDENT_2))}


def qwen(t: Target) -> Plan:
    settings: dict[str, Any] = {"security": {"auth": {"selectedType": "openai"}}}
    if not t.keep_compaction:
        settings["context"] = {"autoCompactThreshold": 1.0}
    return Plan({"OPENAI_BASE_URL": t.session_root + "/v1",
                 **_system_settings(t, "QWEN_CODE_SYSTEM_SETTINGS_PATH", "/etc/qwen-code/settings.json", settings)})


def gemini(t: Target) -> Plan:
    settings: dict[str, Any] = {"security": {"auth": {"selectedType": "gemini-api-key"}}}
    if not t.keep_compaction:
        settings["model"] = {"compressionThreshold": 1.0}
    # Gemini CLI splits its headers at a comma before the next "Name:"; the session comes last, so it wins.
    headers = ", ".join(h for h in (t.environ.get("GEMINI_CLI_CUSTOM_HEADERS", "").strip(),
                                    f"{HEADER_SESSION}: {t.session}") if h)
    return Plan({"GOOGLE_GEMINI_BASE_URL": t.root, "GEMINI_CLI_CUSTOM_HEADERS": headers,
                 **_system_settings(t, "GEMINI_CLI_SYSTEM_SETTINGS_PATH", "/etc/gemini-cli/settings.json", settings)})


AGENTS: dict[str, Recipe] = {r.name: r for r in (
    Recipe("claude", "claude", claude, _claude_endpoints),
    Recipe("codex", "codex", codex, _codex_endpoints),
    Recipe("opencode", "opencode", opencode, _opencode_endpoints),
    Recipe("pi", "pi", pi, _pi_endpoints, PI_COMMANDS),
    Recipe("aider", "aider", aider, lambda e: _named(e, upstream=("OPENAI_BASE_URL", "OPENAI_API_BASE"))),
    Recipe("qwen", "qwen", qwen, lambda e: _named(e, upstream="OPENAI_BASE_URL")),
    Recipe("gemini", "gemini", gemini, lambda e: _named(e, gemini_upstream="GOOGLE_GEMINI_BASE_URL")),
)}


#: The proxy's own settings as variables: among them its secrets (upstream keys, admin token, signing secret,
#: client keys, a store URL's password).
PROXY_VARIABLES = frozenset({"CTXPROXY_" + f.name.upper() for f in fields(Settings)} | {"CTXPROXY_WORKERS"})


def agent_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The user's environment without the proxy's own settings, which an agent must not see (it may run ``env``
    for its model) and has no use for: the proxy has read them already. Other ``CTXPROXY_*`` names are the user's."""
    return {name: value for name, value in environ.items() if name not in PROXY_VARIABLES}


def agent_plan(name: str, target: Target) -> Plan:
    return AGENTS[name].plan(target)
