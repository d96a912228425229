"""``ctxproxy run claude`` and ``ctxproxy run codex`` end to end: the pinned real agents, the fake upstreams.

``ctxproxy run`` is a child process (``python -m proxy run …``, this worktree's
package), as a user starts it; the agents are found on PATH
(tests/clients/node_modules/.bin) and get nothing but what the launcher sets
and a private HOME. Each run takes 25 tool steps in a window they do not fit,
so the proxy must compact, and ends with the launcher's one line, whose
figures are checked against the fake's own count of what it was sent (the
usage it reported), litellm's price for the model, the session's log
(``ctxproxy sessions show``), and, where the proxy is one the test serves
(``--proxy``: Codex, and Claude Code once of its two runs), its ``/metrics``.
Gemini CLI, Qwen Code and pi run at the user's own gateway; pi, told a small
window, also shows that the extension ``run`` loads cancels only the
compactions pi starts by itself.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import create_app
from proxy.launch.agents import PI_EXTENSION
from proxy.savings import SavingsCache, UsageTotals
from proxy.settings import Settings
from proxy.store import open_store
from tests.agents import (
    BIN,
    CODEX_MODEL,
    GEMINI_MODEL,
    PI_MODEL,
    QWEN_MODEL,
    TIMEOUT,
    base_env,
    codex_config,
    gemini_settings,
    qwen_settings,
)
from tests.fakechat import FakeChat
from tests.fakegemini import FakeGemini
from tests.fakemessages import FakeMessages
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script, final_text

ROOT = Path(__file__).resolve().parent.parent
STEPS = 25
PROMPT = "Run the scripted shell steps one at a time, then say that you are done."
CLAUDE_MODEL = "claude-opus-5-5"  # Claude Code's default
#: The window of the pi run: the proxy is told it, and so is pi (the user's models.json).
PI_WINDOW = 4_000
EXIT_LINE = re.compile(
    r"ctxproxy: session (?P<session>\S+): (?P<requests>[\d,]+) requests(?: \((?P<failed>[\d,]+) failed: "
    r"(?P<cause>.+?)\))?, (?P<kinds>.+?), (?P<client>[\d,]+) tokens sent by the client, (?P<model>[\d,]+) seen by "
    r"the model \((?P<cached>[\d,]+) cached\), (?P<saved>-?[\d,]+) saved(?:, about \$(?P<dollars>-?[\d,.]+))?"
    r"(?: \(net: (?P<gross>[\d,]+) taken out of requests, (?P<costs>[\d,]+) spent on [\d,]+ summary calls?\))?"
    r"(?:; cache writes caused: (?P<writes>[\d,]+) tokens(?:, \$[\d,.]+)?)?(?:; prefix changes: [^;]+)?"
    r"(?:; re-write factor [\d.]+)?(?:; the proxy cost more than it saved)?"
    r"(?:; log (?P<log>\S+))?; inspector(?:: (?P<command>ctxproxy serve .+?), then)? (?P<inspector>\S+)")
KIND = re.compile(r"(?P<n>[\d,]+) (?P<kind>summar(?:y|ies)|masking batch(?:es)?|model-free checkpoints?)")
KINDS = {"summar": "summaries", "maskin": "masking", "model-": "model_free"}


def closing_figures(line: str) -> dict[str, Any]:
    """The closing line's figures (numbers without their commas), its compactions by kind and in all."""
    found = EXIT_LINE.fullmatch(line)
    assert found is not None, line
    text = {"session", "inspector", "cause", "kinds", "log", "command"}
    figures: dict[str, Any] = {k: (v.replace(",", "") if k not in text else v) if v is not None else None
                               for k, v in found.groupdict().items()}
    kinds = {name: 0 for name in KINDS.values()}
    if figures["kinds"] != "no compaction":
        for part in figures["kinds"].split(", "):
            kind = KIND.fullmatch(part)
            assert kind is not None, line
            kinds[KINDS[kind["kind"][:6]]] = int(kind["n"].replace(",", ""))
    figures.update(kinds, compactions=str(sum(kinds.values())))
    return figures


@dataclass
class Launched:
    returncode: int | None
    stdout: str
    stderr: str

    def figures(self) -> dict[str, Any]:
        lines = self.stderr.strip().splitlines()
        assert lines, "no exit line"
        return closing_figures(lines[-1])


async def ctxproxy_run(args: list[str], env: dict[str, str], cwd: Path) -> Launched:
    """``python -m proxy run ARGS`` with this worktree's package, stdin closed, bounded by the agents' timeout."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "run", *args, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**env, "PYTHONPATH": str(ROOT), "PATH": f"{BIN}:{env['PATH']}"})
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 3 * TIMEOUT)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        return Launched(None, out.decode(errors="replace"), err.decode(errors="replace"))
    return Launched(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


async def session_totals(store_url: str, session: str) -> tuple[UsageTotals, int]:
    """What ``ctxproxy sessions show`` folds from the log, and the checkpoints the session has."""
    store = await open_store(store_url)
    try:
        infos = [i async for i in store.sessions()]
        assert [i.session for i in infos] == [session]
        return await SavingsCache().of(store, infos[0]), infos[0].checkpoints
    finally:
        await store.aclose()


def litellm_price(model: str) -> float:
    """litellm's own answer, from its bundled map (offline)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    return float(litellm.model_cost[model]["input_cost_per_token"])


def check_figures(figures: dict[str, Any], totals: UsageTotals, checkpoints: int, turns: list[Any],
                  model: str) -> None:
    """The exit line is the log's fold; the model saw what the fake counted; the dollars are litellm's price."""
    assert int(figures["requests"]) == totals.replies == STEPS + 1
    assert int(figures["compactions"]) == checkpoints >= 1, "the proxy compacted"
    assert (int(figures["client"]), int(figures["model"]), int(figures["cached"]), int(figures["saved"])) == (
        totals.client_tokens, totals.model_tokens, totals.cached_tokens, totals.saved_tokens)
    assert totals.model_tokens == sum(t.tokens for t in turns), "usage as the upstream reported it"
    assert totals.gross_saved_tokens > 0 and totals.client_tokens == totals.model_tokens + totals.gross_saved_tokens
    assert totals.saved_tokens == totals.gross_saved_tokens - totals.summary_tokens - totals.caused_write_tokens
    assert int((figures["writes"] or "0").replace(",", "")) == totals.caused_write_tokens
    assert totals.gross_cost_saved == pytest.approx(totals.gross_saved_tokens * litellm_price(model))
    assert figures["dollars"] == f"{totals.cost_saved:,.2f}".replace(",", "")


async def metric_values(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as client, client.get(url + "/metrics") as resp:
        text = await resp.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def check_metrics(proxy_url: str, route: str, figures: dict[str, Any], totals: UsageTotals) -> None:
    """The proxy served this one run: its counters are the exit line's figures."""
    metrics = await metric_values(proxy_url)
    assert metrics[("ctxproxy_tokens_saved_total", ())] == int(figures["saved"])
    assert metrics[("ctxproxy_cost_saved_dollars_total", ())] == pytest.approx(totals.cost_saved)
    assert metrics[("ctxproxy_requests_total", (("route", route), ("status", "200")))] == int(figures["requests"])
    assert metrics[("ctxproxy_upstream_prompt_tokens_total", ())] == int(figures["model"])
    assert metrics[("ctxproxy_upstream_cached_tokens_total", ())] == int(figures["cached"])
    made = sum(v for (name, labels), v in metrics.items() if name == "ctxproxy_compactions_total"
               and dict(labels)["outcome"] in ("ok", "fallback"))
    assert made == int(figures["compactions"])


async def serve_proxy(aiohttp_server: Any, root: str, store: str, window: int) -> str:
    """A proxy the test serves (for ``--proxy``) in front of the fake at ``root``: its root URL."""
    proxy: TestServer = await aiohttp_server(create_app(Settings(upstream=root + "/v1", anthropic_upstream=root,
                                                                 store=store, context_window=window)))
    return str(proxy.make_url("")).rstrip("/")


async def serve_fake(aiohttp_server: Any, fake: FakeMessages | FakeResponses | FakeGemini | FakeChat) -> str:
    """The fake upstream served on loopback: its root URL."""
    upstream: TestServer = await aiohttp_server(fake.app())
    return str(upstream.make_url("")).rstrip("/")


@pytest.mark.parametrize("proxy", ["embedded", "running"])
async def test_ctxproxy_run_claude_finishes_in_a_window_the_run_does_not_fit_and_says_what_it_saved(
        aiohttp_server: Any, tmp_path: Path, proxy: str) -> None:
    fake = FakeMessages(Script(steps=STEPS), window=7_000)
    root, store = await serve_fake(aiohttp_server, fake), f"sqlite:///{tmp_path}/facts.db"
    proxy_url = await serve_proxy(aiohttp_server, root, store, 7_000) if proxy == "running" else None
    where = ["--proxy", proxy_url] if proxy_url is not None else [
        "--anthropic-upstream", root, "--upstream", root + "/v1", "--context-window", "7000"]
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {**base_env(home), "ANTHROPIC_API_KEY": "sk-ant-ctxproxy-test",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}

    run = await ctxproxy_run(
        [*where, "--store", store, "--session", "claude-run", "claude", "--", "-p", "--tools", "Bash",
         "--allowedTools", "Bash", "--max-turns", str(STEPS + 5), "--output-format", "json", PROMPT], env, work)

    assert run.returncode == 0, run.stderr
    result = orjson.loads(run.stdout.strip().splitlines()[-1])
    assert (result["is_error"], result["result"], result["num_turns"]) == (False, final_text(STEPS), STEPS + 1)
    assert all(t.path == "/v1/messages" for t in fake.turns())
    figures = run.figures()
    assert figures["session"] == "claude-run"
    assert figures["inspector"].startswith(f"{proxy_url or 'http://127.0.0.1:8787'}/ui/sessions/")
    assert figures["inspector"].endswith("/claude-run")
    totals, checkpoints = await session_totals(store, "claude-run")
    check_figures(figures, totals, checkpoints, fake.turns(), CLAUDE_MODEL)
    if proxy_url is not None:
        await check_metrics(proxy_url, "messages", figures, totals)
    assert not (home / ".claude" / "settings.json").exists(), "nothing written into the agent's own config"


async def test_ctxproxy_run_codex_through_a_running_proxy_figures_match_its_metrics(
        aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeResponses(Script(steps=STEPS), window=12_000)
    root, store = await serve_fake(aiohttp_server, fake), f"sqlite:///{tmp_path}/facts.db"
    proxy_url = await serve_proxy(aiohttp_server, root, store, 12_000)
    home, work, codex_home, tmp = tmp_path / "home", tmp_path / "work", tmp_path / "codex-user", tmp_path / "tmp"
    for path in (home, work, codex_home, tmp):
        path.mkdir()
    # The user's own Codex setup: a provider straight at the upstream (over websockets where it can: the proxy
    # cannot), and a login that must stay theirs.
    user_config = codex_config(root + "/v1").replace('wire_api = "responses"\n',
                                                     'wire_api = "responses"\nsupports_websockets = true\n')
    (codex_home / "config.toml").write_text(user_config)
    (codex_home / "auth.json").write_text('{"OPENAI_API_KEY": null}')
    # The temporary directory is not above the Codex home, as a user's is not (Codex warns when it is).
    env = {**base_env(home), "CODEX_HOME": str(codex_home), "CTXPROXY_TEST_KEY": "sk-ctxproxy-test",
           "TMPDIR": str(tmp)}

    run = await ctxproxy_run(["--proxy", proxy_url, "--store", store, "codex", "--", "exec", "--skip-git-repo-check",
                              "-C", str(work), "--json", PROMPT], env, work)

    assert run.returncode == 0, run.stderr
    assert "WebSocket" not in run.stderr, "Codex was told the provider has none: no ERROR line for the 426"
    assert "helper binaries" not in run.stderr
    events = [orjson.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    answers = [e["item"]["text"] for e in events
               if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"]
    assert answers[-1:] == [final_text(STEPS)]
    assert {t.path for t in fake.turns()} == {"/v1/responses"}
    assert (codex_home / "config.toml").read_text() == user_config, "the user's config is untouched"
    assert list((codex_home / "sessions").rglob("*.jsonl")), "Codex recorded the run where `codex resume` looks"
    figures = run.figures()
    session = figures["session"]
    assert session.startswith("codex-")
    assert figures["inspector"].startswith(proxy_url + "/ui/sessions/")
    totals, checkpoints = await session_totals(store, session)
    check_figures(figures, totals, checkpoints, fake.turns(), CODEX_MODEL)

    await check_metrics(proxy_url, "responses", figures, totals)


async def test_ctxproxy_run_gemini_keeps_the_users_gateway_and_headers_and_its_settings_layer_applies(
        aiohttp_server: Any, tmp_path: Path) -> None:
    # The user's own setup: Gemini CLI sent to their gateway (the fake) with a header of its own, and a login
    # choice (Google OAuth) that the recipe's system settings layer, a memory file, must override.
    gateway = FakeGemini(Script(steps=2))
    root, store = await serve_fake(aiohttp_server, gateway), f"sqlite:///{tmp_path}/facts.db"
    home, work, tmp = tmp_path / "home", tmp_path / "work", tmp_path / "tmp"
    for path in (home / ".gemini", work, tmp):
        path.mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_bytes(orjson.dumps(
        {**gemini_settings(0.5), "security": {"auth": {"selectedType": "oauth-personal"}}}))
    env = {**base_env(home), "GOOGLE_GEMINI_BASE_URL": root, "GEMINI_API_KEY": "gemini-gateway-key",
           "GEMINI_CLI_CUSTOM_HEADERS": "X-Gateway-Team: blue", "TMPDIR": str(tmp)}

    run = await ctxproxy_run(["--store", store, "--session", "gemini-run", "gemini", "--", "-p", PROMPT, "--yolo",
                              "--skip-trust", "-m", GEMINI_MODEL, "--output-format", "json"], env, work)

    assert run.returncode == 0, run.stderr
    assert orjson.loads(run.stdout)["response"] == final_text(2)
    turns = gateway.turns()
    assert len(turns) == 3, "every request reached the user's gateway"
    assert all(t.headers.get("x-goog-api-key") == "gemini-gateway-key" for t in turns)
    assert all(t.headers.get("X-Gateway-Team") == "blue" for t in turns), "the user's header was kept"
    figures = run.figures()
    assert (figures["session"], figures["requests"]) == ("gemini-run", "3")
    assert list(tmp.iterdir()) == [], "the settings layer was no file"


async def test_ctxproxy_run_qwen_keeps_the_users_gateway_and_its_settings_layer_applies(
        aiohttp_server: Any, tmp_path: Path) -> None:
    # The user's Qwen Code: at their gateway (the fake) with their key, and a login choice (Qwen OAuth) that the
    # recipe's system settings layer, a memory file, must override.
    gateway = FakeChat(Script(steps=2))
    root, store = await serve_fake(aiohttp_server, gateway), f"sqlite:///{tmp_path}/facts.db"
    home, work = tmp_path / "home", tmp_path / "work"
    for path in (home / ".qwen", work):
        path.mkdir(parents=True)
    (home / ".qwen" / "settings.json").write_bytes(orjson.dumps(
        {**qwen_settings(), "security": {"auth": {"selectedType": "qwen-oauth"}}}))
    env = {**base_env(home), "OPENAI_BASE_URL": root + "/v1", "OPENAI_API_KEY": "sk-qwen-gateway-key",
           "OPENAI_MODEL": QWEN_MODEL, "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}

    run = await ctxproxy_run(["--store", store, "--session", "qwen-run", "qwen", "--", "-p", PROMPT, "--yolo",
                              "--output-format", "json"], env, work)

    assert run.returncode == 0, run.stderr
    turns = gateway.turns()
    assert len(turns) == 3, "every request reached the user's gateway"
    assert all(t.headers.get("Authorization") == "Bearer sk-qwen-gateway-key" for t in turns)
    assert run.figures()["requests"] == "3"


def pi_home(home: Path, gateway: str, window: int) -> dict[str, bytes]:
    """The user's own pi setup: the openai provider at their gateway (``gateway``, with ``/v1``), gpt-5.5 believed to
    have ``window`` tokens, and a reserve that puts pi's own compaction threshold at 1,000 tokens, under every
    request of a run: pi wants to compact after every run. Returns the files as written, to compare afterwards."""
    files = {"models.json": orjson.dumps({"providers": {"openai": {
                 "baseUrl": gateway, "modelOverrides": {PI_MODEL: {"contextWindow": window}}}}}),
             "settings.json": orjson.dumps({"compaction": {"reserveTokens": window - 1_000}})}
    (home / ".pi" / "agent").mkdir(parents=True)
    for name, content in files.items():
        (home / ".pi" / "agent" / name).write_bytes(content)
    return files


def pi_events(stdout: str) -> list[dict[str, Any]]:
    """pi's JSON lines (``--mode json`` and ``--mode rpc``)."""
    return [orjson.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def pi_home_is_the_users(home: Path, files: dict[str, bytes], session: str) -> None:
    """The user's pi files are as they wrote them and nothing pi keeps names the extension, its variables or the
    proxy's URL (the test's directory names hold "ctxproxy": the markers are narrower)."""
    agent_dir = home / ".pi" / "agent"
    assert {name: (agent_dir / name).read_bytes() for name in files} == files
    for path in home.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not any(m in text for m in (PI_EXTENSION.name, "CTXPROXY_PI", f"/s/{session}")), path


async def test_ctxproxy_run_pi_keeps_the_users_gateway_and_leaves_compacting_to_the_proxy(
        aiohttp_server: Any, tmp_path: Path) -> None:
    # 25 steps in a window of 4,000 tokens, which the run does not fit (its last request would be about 6,300): pi
    # is told that window too, with its own threshold under the first request, so it tries to compact by itself
    # after the run; the extension must cancel that, and the proxy compacts instead.
    gateway = FakeResponses(Script(steps=STEPS))
    root, store = await serve_fake(aiohttp_server, gateway), f"sqlite:///{tmp_path}/facts.db"
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    files = pi_home(home, root + "/v1", PI_WINDOW)
    env = {**base_env(home), "OPENAI_API_KEY": "sk-pi-gateway-key", "PI_OFFLINE": "1"}

    run = await ctxproxy_run(["--store", store, "--session", "pi-run", "--context-window", str(PI_WINDOW), "pi",
                              "--", "-p", "--mode", "json", "--provider", "openai", "--model", PI_MODEL, PROMPT],
                             env, work)

    assert run.returncode == 0, run.stderr
    events = pi_events(run.stdout)
    answers = [e["message"] for e in events if e.get("type") == "message_end" and e["message"]["role"] == "assistant"]
    assert [c.get("text") for c in answers[-1]["content"] if c["type"] == "text"] == [final_text(STEPS)]
    tried = [e for e in events if e.get("type") in ("compaction_start", "compaction_end")]
    assert [e["type"] for e in tried] == ["compaction_start", "compaction_end"], "pi tried to compact once"
    assert (tried[0]["reason"], tried[1]["aborted"]) == ("threshold", True), "and the extension cancelled it"
    turns = gateway.turns()
    assert len(turns) == STEPS + 1 and all(t.body.get("tools") for t in turns), "only pi's turns, no summary of pi's"
    assert all(t.headers.get("Authorization") == "Bearer sk-pi-gateway-key" for t in turns), "the user's key"
    figures = run.figures()
    totals, checkpoints = await session_totals(store, "pi-run")
    assert figures["session"] == "pi-run" and int(figures["requests"]) == totals.replies == STEPS + 1, \
        "every request went through the proxy"
    assert int(figures["compactions"]) == checkpoints >= 1, "the proxy compacted"
    pi_home_is_the_users(home, files, "pi-run")
    [log] = (home / ".pi" / "agent" / "sessions").rglob("*.jsonl")
    assert '"type":"compaction"' not in log.read_text(), "pi's own session holds no compaction of its own"


async def test_ctxproxy_run_pi_cancels_only_pis_own_compactions_and_a_compaction_asked_for_goes_ahead(
        aiohttp_server: Any, tmp_path: Path) -> None:
    # pi in RPC mode, as an editor drives it: two prompts, each followed by pi's own compaction at its threshold
    # (cancelled, as is the check before the second prompt), then the compact command (a /compact), which pi runs.
    gateway = FakeResponses(Script(steps=2))
    root = await serve_fake(aiohttp_server, gateway)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    files = pi_home(home, root + "/v1", 100_000)
    env = {**base_env(home), "OPENAI_API_KEY": "sk-pi-gateway-key", "PI_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "PATH": f"{BIN}:{base_env(home)['PATH']}"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "run", "--store", f"sqlite:///{tmp_path}/facts.db", "--session", "pi-rpc",
        "pi", "--", "--mode", "rpc", "--provider", "openai", "--model", PI_MODEL, cwd=work, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    seen: list[dict[str, Any]] = []

    async def send_until(command: dict[str, Any], done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(orjson.dumps(command) + b"\n")
        await proc.stdin.drain()
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)
            assert line, "pi ended early"
            seen.append(orjson.loads(line))
            if done(seen[-1]):
                return seen[-1]

    try:
        for prompt in (PROMPT, "Once more."):
            await send_until({"type": "prompt", "message": prompt}, lambda e: e.get("type") == "agent_end")
        answer = await send_until({"type": "compact"}, lambda e: e.get("command") == "compact")
        proc.stdin.close()
        _, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    assert proc.returncode == 0, err.decode(errors="replace")
    ends = [(e["reason"], e["aborted"]) for e in seen if e.get("type") == "compaction_end"]
    assert ends == [("threshold", True)] * 3 + [("manual", False)]
    assert answer["success"] is True, answer
    summaries = [r for r in gateway.requests if r.kind == "turn" and not r.body.get("tools")]
    assert len(summaries) == 1, "pi's own summary call, through the proxy, only for the compaction asked for"
    assert all(r.headers.get("Authorization") == "Bearer sk-pi-gateway-key" for r in gateway.requests)
    pi_home_is_the_users(home, files, "pi-rpc")
