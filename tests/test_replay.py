"""``ctxproxy replay``: a recorded session in each format an agent writes, or a session in the store, through the
engine offline; its report, the same every run.

Every session here is synthetic, written by the test in the shape of the real
format (the fields ``proxy.replay.sources`` reads): a run of tool steps that
write files and run commands (one failing), long enough to compact in a small
window.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from proxy.cli import main
from proxy.context.view.tokens import TokenCounter
from proxy.dialects.chat import message_hash
from proxy.replay.cost import prices_for
from proxy.replay.lab import steps
from proxy.replay.sources import read_file
from proxy.store import NewFact, SessionKey, open_store
from tests.fakeupstream import FakeUpstream

ENV = {name: None for name in ("CTXPROXY_CONTEXT_WINDOW", "CTXPROXY_COMPRESSION_THRESHOLD", "CTXPROXY_ESTIMATOR",
                               "CTXPROXY_SUMMARY_PLACEMENT", "CTXPROXY_SUMMARY_MODEL", "CTXPROXY_STORE",
                               "CTXPROXY_PRECOMPACT_THRESHOLD", "CTXPROXY_KEEP_TOOL_OUTPUTS")}
STEPS = 16
WINDOW = "2500"
CONSTRAINT = "You must never touch the vendor directory."
ERROR = "E   AssertionError: expected 4 got 5"
ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus" / "sessions"


def filler(step: int, words: int = 180) -> str:
    return " ".join(f"line{step}-{n}" for n in range(words))


def source_of(step: int) -> str:
    return f"def answer_{step}():\n    return {step}\n"


def script() -> list[tuple[str, dict[str, Any], str]]:
    """(tool, arguments, output) per step: odd steps write a file, even steps run a command (step 4 fails)."""
    out = []
    for step in range(1, STEPS + 1):
        if step % 2:
            out.append(("write", {"file_path": f"src/mod_{step}.py", "content": source_of(step)},
                        f"File created successfully at src/mod_{step}.py\n{filler(step)}"))
        else:
            failed = step == 4
            out.append(("shell", {"command": f"pytest tests/test_{step}.py -q"},
                        f"Exit code {1 if failed else 0}\n{ERROR if failed else 'passed'}\n{filler(step)}"))
    return out


TASK = f"Port the parser, one module at a time. {CONSTRAINT}"


def chat_messages() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": TASK}]
    for step, (tool, arguments, output) in enumerate(script(), 1):
        name = "Write" if tool == "write" else "Bash"
        messages += [{"role": "assistant", "content": f"Step {step}.", "tool_calls": [
                          {"id": f"call_{step}", "type": "function",
                           "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}]},
                     {"role": "tool", "tool_call_id": f"call_{step}", "content": output}]
    return [*messages, {"role": "assistant", "content": "Done."}]


def claude_code_lines() -> list[dict[str, Any]]:
    """Claude Code's session JSONL: one line per content block of a reply, under one message id."""
    lines: list[dict[str, Any]] = [{"type": "summary", "summary": "Porting", "leafUuid": "u0"}]
    parent: str | None = None

    def add(kind: str, message: dict[str, Any], **extra: Any) -> None:
        nonlocal parent
        uuid = f"u{len(lines)}"
        lines.append({"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s", "message": message,
                      **extra})
        parent = uuid

    add("user", {"role": "user", "content": TASK})
    for step, (tool, arguments, output) in enumerate(script(), 1):
        reply = {"role": "assistant", "id": f"msg_{step}", "model": "claude-sonnet-4-5-20250929"}
        add("assistant", {**reply, "content": [{"type": "thinking", "thinking": "hm", "signature": "x"}]})
        add("assistant", {**reply, "content": [{"type": "text", "text": f"Step {step}."}]})
        add("assistant", {**reply, "content": [{"type": "tool_use", "id": f"toolu_{step}",
                                                "name": "Write" if tool == "write" else "Bash",
                                                "input": arguments}]})
        add("user", {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{step}",
                                                  "content": output}]})
    lines.append({"type": "assistant", "uuid": "side", "parentUuid": None, "isSidechain": True,
                  "message": {"role": "assistant", "id": "msg_side", "content": [{"type": "text", "text": "sub"}]}})
    add("assistant", {"role": "assistant", "id": "msg_end", "model": "claude-sonnet-4-5-20250929",
                      "content": [{"type": "text", "text": "Done."}]})
    return lines


def codex_lines() -> list[dict[str, Any]]:
    """Codex's rollout JSONL: ``{timestamp, type, payload}`` lines; Responses items under ``response_item``."""
    ts = "2025-12-01T00:00:00.000Z"
    lines: list[dict[str, Any]] = [
        {"timestamp": ts, "type": "session_meta", "payload": {"id": "s", "cwd": "/w", "cli_version": "0.65.0"}},
        {"timestamp": ts, "type": "turn_context", "payload": {"model": "gpt-5", "cwd": "/w"}},
        {"timestamp": ts, "type": "response_item", "payload": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]}}]
    for step, (tool, arguments, output) in enumerate(script(), 1):
        if tool == "write":
            patch = f"*** Begin Patch\n*** Add File: {arguments['file_path']}\n+" + "+".join(
                source_of(step).splitlines(keepends=True)) + "*** End Patch\n"
            call = {"type": "function_call", "name": "apply_patch", "call_id": f"call_{step}",
                    "arguments": orjson.dumps({"input": patch}).decode()}
        else:
            call = {"type": "function_call", "name": "shell", "call_id": f"call_{step}",
                    "arguments": orjson.dumps({"command": ["bash", "-lc", arguments["command"]]}).decode()}
        lines += [{"timestamp": ts, "type": "response_item", "payload": {"type": "reasoning", "summary": [],
                                                                         "encrypted_content": "gAAA"}},
                  {"timestamp": ts, "type": "response_item", "payload": {
                      "type": "message", "role": "assistant", "content": [{"type": "output_text",
                                                                           "text": f"Step {step}."}]}},
                  {"timestamp": ts, "type": "response_item", "payload": call},
                  {"timestamp": ts, "type": "event_msg", "payload": {"type": "token_count"}},
                  {"timestamp": ts, "type": "response_item", "payload": {
                      "type": "function_call_output", "call_id": f"call_{step}", "output": output}}]
    lines.append({"timestamp": ts, "type": "response_item", "payload": {
        "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}})
    return lines


def gemini_history() -> list[dict[str, Any]]:
    """A Gemini CLI saved chat: the ``contents`` list (``role`` user/model, ``parts``)."""
    history: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": TASK}]}]
    for step, (tool, arguments, output) in enumerate(script(), 1):
        name = "write_file" if tool == "write" else "run_shell_command"
        history += [{"role": "model", "parts": [{"thought": True, "text": "thinking"}, {"text": f"Step {step}."},
                                                {"functionCall": {"name": name, "args": arguments}}]},
                    {"role": "user", "parts": [{"functionResponse": {"name": name,
                                                                     "response": {"output": output}}}]}]
    return [*history, {"role": "model", "parts": [{"text": "Done."}]}]


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["replay", *args], env=ENV, catch_exceptions=False)


def replayed(path: Path, *args: str) -> dict[str, Any]:
    result = run(str(path), "--context-window", WINDOW, "--json", *args)
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = orjson.loads(result.output)
    return report


FORMATS = {
    "chat": ("session.json", lambda: orjson.dumps(chat_messages())),
    "claude-code": ("session.jsonl", lambda: jsonl(claude_code_lines())),
    "codex": ("rollout.jsonl", lambda: jsonl(codex_lines())),
    "gemini-cli": ("checkpoint-tag.json", lambda: orjson.dumps(gemini_history())),
}
#: The dialect each format is replayed in, its item count (reasoning, thinking and sidechains left out; Claude
#: Code's reply blocks joined into one message) and model.
EXPECTED = {"chat": ("chat", 2 + 2 * STEPS + 1, ""),
            "claude-code": ("messages", 1 + 2 * STEPS + 1, "claude-sonnet-4-5-20250929"),
            "codex": ("responses", 1 + 3 * STEPS + 1, "gpt-5"),
            "gemini-cli": ("gemini", 1 + 2 * STEPS + 1, "")}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_replays_step_by_step_in_its_own_dialect(tmp_path: Path, fmt: str) -> None:
    name, content = FORMATS[fmt]
    path = tmp_path / name
    path.write_bytes(content())
    report = replayed(path)
    dialect, items, model = EXPECTED[fmt]
    assert (report["dialect"], report["items"], report["model"]) == (dialect, items, model)
    assert report["steps"] == STEPS + 1  # each reply a step, the closing answer too
    assert report["probes"] == "derived"
    assert report["compactions"], "a 2,500-token window compacts a ~6,000-token session"
    assert report["tokens"]["last_view"] < report["tokens"]["last_request"]
    assert report["over_window"] == 0
    view = report["retention"]["view"]
    # Derived from the calls: 8 written paths, 8 commands, the failing command's error line, the user's constraint.
    assert (view["paths"]["of"], view["commands"]["of"], view["errors"]["of"], view["constraints"]["of"]) \
        == (8, 8, 1, 1)
    # The exact text of the last three files written whole (Codex's patch adds lines: no call states the text).
    assert view["working_set"]["of"] == (0 if fmt == "codex" else 3)


def test_a_corpus_file_brings_its_own_probes(tmp_path: Path) -> None:
    probes = {"files_written": ["src/mod_1.py", "src/mod_15.py", "src/never.py"],
              "commands": ["pytest tests/test_2.py -q"],
              "errors": [{"step": 4, "line": ERROR}], "user_constraints": [CONSTRAINT],
              "final_files": {"src/mod_13.py": source_of(13), "src/mod_15.py": source_of(15),
                              "src/mod_3.py": source_of(3), "src/mod_1.py": source_of(1)}}
    path = tmp_path / "corpus.json"
    path.write_bytes(orjson.dumps({"id": "x", "model": "claude-sonnet-4-5-20250929", "messages": chat_messages(),
                                   "probes": probes}))
    report = replayed(path)
    assert report["probes"] == "source"
    assert report["model"] == "claude-sonnet-4-5-20250929"
    view, cut = report["retention"]["view"], report["retention"]["truncation"]
    # A probe the session never states is not counted; the working set is the last three files written.
    assert view["paths"]["of"] == 2
    assert (view["errors"]["of"], view["constraints"]["of"], view["working_set"]["of"]) == (1, 1, 3)
    assert view["constraints"]["kept"] == 1  # the proxy carries the user's words; truncation drops the task
    assert cut["constraints"]["kept"] == 0
    assert set(report) >= {"compactions", "compaction_attempts", "cost", "prefix_changes", "tokens", "window"}
    for compaction in report["compactions"]:
        assert compaction["tokens_after"] < compaction["tokens_before"]
        if compaction["step"] > report["steps"]:  # made while the last reply was awaited: no view shows it
            assert compaction["retention"] is None
            continue
        assert set(compaction["retention"]) == {"paths", "commands", "errors", "constraints", "working_set"}
    assert report["cost"]["view"] < report["cost"]["as_sent"]  # priced from the model map
    assert 0 < report["prefix_changes"] < report["steps"]
    # What the last view lost is named, kind by kind: the counted probes it does not hold, a file by its path.
    for kind, counted in view.items():
        assert len(report["missed"][kind]) == counted["of"] - counted["kept"]
    assert set(report["missed"]["working_set"]) <= set(probes["final_files"])
    assert "src/never.py" not in report["missed"]["paths"]  # never stated: not counted, so not lost either


def test_the_text_report_names_what_the_last_view_lost(tmp_path: Path) -> None:
    path = tmp_path / "corpus.json"
    unkept = "src/mod_2.py"  # written early, its text changed by no later call: the proxy carries it, or loses it
    path.write_bytes(orjson.dumps({"messages": chat_messages(), "probes": {
        "files_written": [unkept], "final_files": {unkept: source_of(2) + "# not the text it ends with\n"}}}))
    result = run(str(path), "--context-window", WINDOW)
    assert result.exit_code == 0, result.output
    lost = result.output.split("## What the last view lost\n", 1)[1].splitlines()
    assert lost[:2] == ["working set (last 3 files, exact): 1", f"- {unkept}"]


@pytest.mark.parametrize("given", [False, True], ids=["derived", "source"])
def test_a_file_the_last_reply_writes_is_not_counted_in_the_last_views_files(tmp_path: Path, given: bool) -> None:
    """The last request has not seen what its reply writes, so no view of it can hold that text: the last three
    files are those written before it, as for every other probe."""
    last = "src/last.py"
    write = {"name": "Write", "arguments": orjson.dumps({"file_path": last, "content": "x = 1\n"}).decode()}
    messages = [*chat_messages()[:-1],
                {"role": "assistant", "content": "Last.",
                 "tool_calls": [{"id": "call_last", "type": "function", "function": write}]},
                {"role": "tool", "tool_call_id": "call_last", "content": "File created successfully"}]
    finals = {f"src/mod_{n}.py": source_of(n) for n in (11, 13, 15)} | {last: "x = 1\n"}
    path = tmp_path / "session.json"
    path.write_bytes(orjson.dumps({"messages": messages, "probes": {"final_files": finals}} if given else messages))
    report = replayed(path)
    assert report["retention"]["view"]["working_set"]["of"] == 3
    assert last not in report["missed"]["working_set"]


def test_two_runs_give_the_same_report_byte_for_byte(tmp_path: Path) -> None:
    """Two processes with different hash seeds (so no set or dict order can differ unnoticed), text and JSON."""
    path, timed = tmp_path / "session.jsonl", tmp_path / "timed.jsonl"
    path.write_bytes(jsonl(claude_code_lines()))
    timed.write_bytes(jsonl(timed_lines("codex", 600.0)))  # its clock the recording's, with an idle gap
    sources = [path, timed, *sorted(CORPUS.glob("claude-authrace-*.json"))[:1]]  # the shared corpus, where it is
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for source in sources:
        for flags in (["--json"], []):
            first, second = (subprocess.run([sys.executable, "-m", "proxy", "replay", str(source), "--context-window",
                                             WINDOW, *flags], capture_output=True, check=True, cwd=ROOT,
                                            env={**env, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2"))
            assert first and first == second


async def test_summaries_from_the_upstream(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeUpstream()
    server = await aiohttp_server(fake.app())
    path = tmp_path / "session.json"
    path.write_bytes(orjson.dumps(chat_messages()))
    args = [str(path), "--context-window", WINDOW, "--json", "--summariser", "upstream", "--upstream",
            str(server.make_url("/v1")), "--upstream-key", "sk-replay", "--model", "gpt-4o",
            "--keep-tool-outputs", "1000", "--keep-tool-output-share", "1"]  # masking off: summaries do the work
    result = await asyncio.to_thread(run, *args)  # the CLI runs its own loop; this one serves the fake
    assert result.exit_code == 0, result.output
    report = orjson.loads(result.output)
    assert report["summariser"] == "upstream"
    assert fake.summary_requests and not fake.requests  # the upstream wrote summaries; no step went to it
    assert all(headers["Authorization"] == "Bearer sk-replay" for _, headers in fake.summary_calls)
    assert any(c["tier"] == "summary" and c["outcome"] == "ok" for c in report["compactions"])


def test_the_text_report_names_every_figure(tmp_path: Path) -> None:
    path = tmp_path / "session.json"
    path.write_bytes(orjson.dumps(chat_messages()))
    result = run(str(path), "--context-window", WINDOW, "--model", "claude-sonnet-4-5-20250929")
    assert result.exit_code == 0, result.output
    for words in ("summariser none (built-in, keeps nothing)", "## Compactions", "prefix changes:", "cost: $",
                  "written paths", "commands", "error lines", "user constraints", "working set", "truncation"):
        assert words in result.output


def test_the_users_store_is_never_written(tmp_path: Path) -> None:
    path = tmp_path / "session.json"
    path.write_bytes(orjson.dumps(chat_messages()))
    store = tmp_path / "state" / "facts.db"
    replayed(path, "--store", f"sqlite:///{store}")
    assert not store.exists()


def test_a_session_in_the_store_replays_as_its_recording_does(tmp_path: Path, store_url: str) -> None:
    messages = chat_messages()
    key = SessionKey("0123456789abcdef", "run-1")

    async def log() -> int:
        store = await open_store(store_url)
        try:
            for seq, message in enumerate(messages):  # the replies as the proxy logs them: upstream, with a model
                upstream = message["role"] == "assistant"
                extra = {"dialect": "chat", "model": "claude-sonnet-4-5-20250929"} if upstream else {"dialect": "chat"}
                fact = NewFact(kind="message", index=seq, source="upstream" if upstream else "client",
                               message=message, hash=message_hash(message), extra=extra)
                await store.append(key, seq, [fact], 1_700_000_000.0 + seq)
            return len(await store.read(key, after=-1, limit=10_000))
        finally:
            await store.aclose()

    async def entries() -> int:
        store = await open_store(store_url)
        try:
            return len(await store.read(key, after=-1, limit=10_000))
        finally:
            await store.aclose()

    logged = asyncio.run(log())
    result = run("run-1", "--store", store_url, "--tenant", key.tenant, "--context-window", WINDOW, "--json")
    assert result.exit_code == 0, result.output
    path = tmp_path / "session.json"
    path.write_bytes(orjson.dumps(messages))
    assert orjson.loads(result.output) == replayed(path, "--model", "claude-sonnet-4-5-20250929")
    assert asyncio.run(entries()) == logged  # read, never written
    missing = run("run-2", "--store", store_url, "--tenant", key.tenant)
    assert missing.exit_code != 0 and "no session" in missing.output


def test_a_file_of_no_known_format_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    path.write_bytes(b'{"hello": "world"}')
    result = run(str(path))
    assert result.exit_code == 2
    assert "not a recorded session" in result.output


#: A burst of tool steps 10 s apart, ~540-token outputs, in a 16k window: a masking batch is there to make long before
#: the trigger (12,800), and the cache's moment decides when it lands (``proxy.context.view.worth``).
BURST_STEPS, GAP_STEP, TIMED_WINDOW = 30, 15, "16000"
CLAUDE = "claude-sonnet-4-5-20250929"


def stamp(seconds: float) -> str:
    return (datetime(2026, 3, 1, tzinfo=UTC) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def timed_lines(fmt: str, gap: float) -> list[dict[str, Any]]:
    """A Claude Code session or a Codex rollout of ``BURST_STEPS`` command steps, each line timed; the output of
    step ``GAP_STEP - 1`` comes ``gap`` seconds late (a long command, a user away), so step ``GAP_STEP``'s request
    follows an idle gap."""
    lines: list[dict[str, Any]] = []
    now = 0.0

    def add(line: dict[str, Any]) -> None:
        if fmt == "claude-code":
            line = {**line, "uuid": f"u{len(lines)}", "parentUuid": f"u{len(lines) - 1}" if lines else None}
        lines.append({**line, "timestamp": stamp(now)})

    if fmt == "codex":
        add({"type": "turn_context", "payload": {"model": "gpt-5", "cwd": "/w"}})
        add({"type": "response_item", "payload": {"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": TASK}]}})
    else:
        add({"type": "user", "message": {"role": "user", "content": TASK}})
    for step in range(1, BURST_STEPS + 1):
        now += 4.0
        command, output = f"make test_{step}", filler(step, 130)
        if fmt == "codex":
            add({"type": "response_item", "payload": {"type": "function_call", "name": "shell",
                                                      "call_id": f"call_{step}",
                                                      "arguments": orjson.dumps({"command": command}).decode()}})
        else:
            add({"type": "assistant", "message": {
                "role": "assistant", "id": f"msg_{step}", "model": CLAUDE,
                "content": [{"type": "tool_use", "id": f"toolu_{step}", "name": "Bash",
                             "input": {"command": command}}]}})
        now += 6.0 + (gap if step == GAP_STEP - 1 else 0.0)
        if fmt == "codex":
            add({"type": "response_item", "payload": {"type": "function_call_output", "call_id": f"call_{step}",
                                                      "output": output}})
        else:
            add({"type": "user", "message": {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{step}", "content": output}]}})
    now += 4.0
    if fmt == "codex":
        add({"type": "response_item", "payload": {"type": "message", "role": "assistant",
                                                  "content": [{"type": "output_text", "text": "Done."}]}})
    else:
        add({"type": "assistant", "message": {"role": "assistant", "id": "msg_end", "model": CLAUDE,
                                              "content": [{"type": "text", "text": "Done."}]}})
    return lines


@pytest.mark.parametrize("fmt", ["claude-code", "codex"])
def test_the_recorded_times_drive_the_clock_and_a_reduction_lands_at_the_idle_gap(tmp_path: Path, fmt: str) -> None:
    """Without the gap the batch waits until near the trigger (the cache warm all along: at it, for Claude's write
    premium); ten minutes idle before step 15, past the 5-minute cache life, it lands at step 15: the provider
    writes that prompt whole anyway."""
    reports = {}
    for gap in (0.0, 600.0):
        path = tmp_path / f"{gap:.0f}.jsonl"
        path.write_bytes(jsonl(timed_lines(fmt, gap)))
        result = run(str(path), "--context-window", TIMED_WINDOW, "--json")
        assert result.exit_code == 0, result.output
        reports[gap] = orjson.loads(result.output)
    burst, idle = reports[0.0], reports[600.0]
    assert (burst["clock"], burst["cache_lapses"], idle["clock"], idle["cache_lapses"]) == ("recorded", 0,
                                                                                            "recorded", 1)
    assert idle["compactions"][0]["step"] == GAP_STEP and idle["compactions"][0]["tier"] == "mask"
    assert burst["compactions"][0]["step"] > GAP_STEP, "mid-burst it waited (near the trigger, or at it)"
    assert burst["compactions"][0]["tokens_before"] > idle["compactions"][0]["tokens_before"]


@pytest.mark.parametrize("fmt", ["claude-code", "codex"])
def test_a_request_after_a_gap_past_the_cache_ttl_is_priced_as_a_cold_write(tmp_path: Path, fmt: str) -> None:
    """In a window nothing compacts, the gap changes the cost by exactly the prefix read otherwise: the previous
    request's items, at the input price instead of the cached one, through the proxy and as sent alike; a 1-hour
    cache (``--cache-ttl 3600``) spans the same gap."""
    costs = {}
    for gap, ttl in ((0.0, "300"), (600.0, "300"), (600.0, "3600")):
        path = tmp_path / f"{gap:.0f}.jsonl"
        path.write_bytes(jsonl(timed_lines(fmt, gap)))
        report = replayed(path, "--context-window", "200000", "--cache-ttl", ttl)
        assert not report["compactions"] and report["cache_lapses"] == (gap > float(ttl))
        costs[gap, ttl] = report["cost"]
    recording = read_file(tmp_path / "600.jsonl")
    prices = prices_for(recording.model)
    assert prices is not None and prices.cached < prices.input
    request = steps(recording.dialect, recording.items)[GAP_STEP - 2][0]  # the request before the gap
    counter = TokenCounter()
    read = sum(counter.message_tokens(recording.dialect, item) for item in recording.items[:request])
    for side in ("view", "as_sent"):
        extra = costs[600.0, "300"][side] - costs[0.0, "300"][side]
        assert extra == pytest.approx(read * (prices.input - prices.cached), abs=2e-6)
        assert costs[600.0, "3600"][side] == costs[0.0, "300"][side]


def test_a_format_without_times_keeps_the_clock_fixed(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint-tag.json"
    path.write_bytes(orjson.dumps(gemini_history()))
    report = replayed(path)
    assert (report["clock"], report["cache_lapses"]) == ("fixed", 0)
