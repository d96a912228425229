"""``ctxproxy sessions …`` and ``ctxproxy check``, against a real store of each kind.

The CLI runs its own event loop (``asyncio.run``), so these tests are
synchronous and write their fixed logs with ``asyncio.run`` too. Facts carry
fixed timestamps, so the output is asserted exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from proxy.cli import main
from proxy.context.compactor import prefix_hash
from proxy.context.view.projection import SUMMARY_END, SUMMARY_HEADER
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.settings import Settings
from proxy.store import NewFact, SessionKey, open_store
from tests.redisproc import free_port

TENANT = "0123456789abcdef"
OTHER = "fedcba9876543210"
T0 = 1_700_000_000.0
ENV = {"CTXPROXY_CONTEXT_WINDOW": "16000", "CTXPROXY_COMPRESSION_THRESHOLD": None, "CTXPROXY_ESTIMATOR": None,
       "CTXPROXY_SUMMARY_PLACEMENT": None, "CTXPROXY_SUMMARY_MODEL": None, "CTXPROXY_STORE": None}

SYSTEM: dict[str, Any] = {"role": "system", "content": "You are a coding agent."}
USER: dict[str, Any] = {"role": "user", "content": "Fix the failing test."}
CALL: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "run_shell", "arguments": '{"cmd": "pytest -x"}'}}]}
RESULT: dict[str, Any] = {"role": "tool", "tool_call_id": "call_1", "content": "F" * 40 + "." * 560}
PARTIAL: dict[str, Any] = {"role": "assistant", "content": "The test passes n"}
FINAL: dict[str, Any] = {"role": "assistant", "content": "All green."}
SUMMARY = "## 1. Goals\nFix the failing test."
LINEAGE: list[dict[str, Any]] = [SYSTEM, USER, CALL, RESULT, FINAL]


def checkpoint() -> dict[str, Any]:
    hashes = [message_hash(m) for m in LINEAGE]
    return {"v": 1, "summary": SUMMARY, "retain_start_idx": 4, "prefix_hash": prefix_hash(hashes, 4),
            "round_start_idx": 1, "tokens_before": 12345, "tokens_after": 3210, "model": "m", "created_at": T0}


def as_read(payload: dict[str, Any]) -> dict[str, Any]:
    """A version 1 checkpoint as the proxy reads it and shows it again: in the current format, masking nothing."""
    return {**payload, "v": 3, "masked_until": 0, "user_words": [], "summarised_until": -1, "elision": "",
            "artifacts": [], "trail": ""}


def message(index: int, msg: dict[str, Any], source: str = "client", **extra: Any) -> NewFact:
    return NewFact(kind="message", index=index, source=source, message=msg,  # type: ignore[arg-type]
                   hash=message_hash(msg), extra=extra)


def small_log() -> list[NewFact]:
    return [
        message(0, SYSTEM), message(1, USER), message(2, CALL, "upstream", usage={"prompt_tokens": 30}),
        message(3, RESULT), message(4, PARTIAL, "upstream", partial=True),
        NewFact(kind="rewind", index=4, source="client"),
        message(4, FINAL, "upstream"),
        NewFact(kind="summary", index=4, source="proxy",
                message={"role": "user", "content": f"{SUMMARY_HEADER}\n\n{SUMMARY}"}),
        NewFact(kind="checkpoint", index=4, source="proxy", extra={"checkpoint": checkpoint()}),
    ]


def write(url: str, key: SessionKey, facts: Sequence[NewFact], ts: float = T0) -> None:
    async def append() -> None:
        store = await open_store(url)
        try:
            for seq, fact in enumerate(facts):  # one append each, one second apart
                await store.append(key, seq, [fact], ts + seq)
        finally:
            await store.aclose()

    asyncio.run(append())


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=ENV, catch_exceptions=False)


def tokens(msg: dict[str, Any]) -> int:
    return TokenCounter().message_tokens(CHAT, msg)


SUMMARY_MESSAGE = {"role": "user", "content": f"{SUMMARY_HEADER}\n\n{SUMMARY}"}
TRANSCRIPT = f"""\
# Session run-1 (tenant 0123456789abcdef)

### #0 system · client · {tokens(SYSTEM)} tokens · 2023-11-14T22:13:20Z
You are a coding agent.

### #1 user · client · {tokens(USER)} tokens · 2023-11-14T22:13:21Z
Fix the failing test.

### #2 assistant · upstream · {tokens(CALL)} tokens · 2023-11-14T22:13:22Z
→ run_shell({{"cmd": "pytest -x"}})

### #3 tool (call_1) · client · {tokens(RESULT)} tokens · 2023-11-14T22:13:23Z
{"F" * 40 + "." * 460}… [100 more characters]

### #4 assistant · upstream · {tokens(PARTIAL)} tokens · 2023-11-14T22:13:24Z · partial reply
The test passes n

── rewind to message 4 ──

### #4 assistant · upstream · {tokens(FINAL)} tokens · 2023-11-14T22:13:26Z
All green.

### summary · proxy · {tokens(SUMMARY_MESSAGE)} tokens · 2023-11-14T22:13:27Z
{SUMMARY_HEADER}

## 1. Goals
Fix the failing test.

── checkpoint: messages 1–3 summarised (12,345 → 3,210 tokens) ──
"""  # noqa: RUF001


@pytest.fixture
def logged(store_url: str) -> str:
    write(store_url, SessionKey(TENANT, "run-1"), small_log())
    return store_url


def test_log_prints_a_transcript(logged: str) -> None:
    result = run("sessions", "log", "run-1", "--store", logged)
    assert result.exit_code == 0, result.output
    assert result.output == TRANSCRIPT


def test_log_json_prints_one_entry_per_line(logged: str) -> None:
    result = run("sessions", "log", "run-1", "--tenant", TENANT, "--json", "--store", logged)
    assert result.exit_code == 0, result.output
    entries = [orjson.loads(line) for line in result.output.splitlines()]
    assert [e["seq"] for e in entries] == list(range(9))
    assert [e["kind"] for e in entries] == ["message"] * 5 + ["rewind", "message", "summary", "checkpoint"]
    assert entries[4]["partial"] is True and entries[2]["usage"] == {"prompt_tokens": 30}
    assert entries[8]["checkpoint"] == checkpoint()
    assert set(entries[0]) == {"id", "seq", "kind", "index", "source", "message", "ts", "hash"}
    assert entries[6]["ts"] == T0 + 6


def test_log_of_a_long_session_streams_every_entry(store_url: str) -> None:
    facts = [message(i, {"role": "user", "content": f"m{i}"}) for i in range(1_234)]

    async def append() -> None:
        store = await open_store(store_url)
        try:
            for start in range(0, len(facts), 500):
                await store.append(SessionKey(TENANT, "long"), start, facts[start:start + 500], T0)
        finally:
            await store.aclose()

    asyncio.run(append())
    result = run("sessions", "log", "long", "--json", "--store", store_url)
    assert [orjson.loads(line)["seq"] for line in result.output.splitlines()] == list(range(1_234))
    text = run("sessions", "log", "long", "--store", store_url).output
    assert text.count("\n### #") == 1_234 and "### #1233 user" in text


def test_view_prints_what_the_next_request_would_send(logged: str) -> None:
    result = run("sessions", "view", "run-1", "--json", "--store", logged)
    assert result.exit_code == 0, result.output
    view = orjson.loads(result.output)
    led = {"role": "user", "content": f"{SUMMARY_MESSAGE['content']}{SUMMARY_END}{USER['content']}"}
    assert view == {"messages": [SYSTEM, led, FINAL], "estimate": view["estimate"], "checkpoint": as_read(checkpoint()),
                    "usage": {"replies": 1, "prompt_tokens": 30, "cached_tokens": 0, "client_tokens": 30,
                              "model_tokens": 30, "saved_tokens": 0, "cost_saved": None, "gross_saved_tokens": 0,
                              "gross_cost_saved": None, "summary_calls": 0, "summary_tokens": 0,
                              "summary_cost": None, "cache_write_tokens": 0, "ttl_write_tokens": 0, "peak_tokens": 30,
                              "rewrite_factor": None, "caused_write_tokens": 0, "caused_write_cost": None,
                              "prefix_changes": {"compaction": 0, "masking": 0, "client": 0, "ttl": 0}}}
    text = run("sessions", "view", "run-1", "--store", logged).output
    assert text == f"""\
# View of session run-1 (tenant 0123456789abcdef)

{view["estimate"]} tokens estimated of a 16,000-token window (compaction above 12,800); \
checkpoint: messages before #4 summarised (12,345 → 3,210 tokens).

### [0] system · {tokens(SYSTEM)} tokens
You are a coding agent.

### [1] user · {tokens(led)} tokens
{SUMMARY_HEADER}

## 1. Goals
Fix the failing test.

[ctxproxy] End of the summary. The user's message:

Fix the failing test.

### [2] assistant · {tokens(FINAL)} tokens
All green.
"""


def test_sessions_list_table_and_json(logged: str) -> None:
    write(logged, SessionKey(OTHER, "run-2"), [message(0, USER)], ts=T0 + 100)
    result = run("sessions", "list", "--store", logged)
    assert result.exit_code == 0, result.output
    assert result.output == """\
| tenant           | session | messages | checkpoints | updated_at           |
| ---------------- | ------- | -------: | ----------: | -------------------- |
| fedcba9876543210 | run-2   |        1 |           0 | 2023-11-14T22:15:00Z |
| 0123456789abcdef | run-1   |        6 |           1 | 2023-11-14T22:13:28Z |
"""
    rows = orjson.loads(run("sessions", "list", "--json", "--store", logged).output)
    assert rows == [
        {"tenant": OTHER, "session": "run-2", "messages": 1, "checkpoints": 0, "updated_at": T0 + 100},
        {"tenant": TENANT, "session": "run-1", "messages": 6, "checkpoints": 1, "updated_at": T0 + 8},
    ]


def test_an_empty_store_lists_no_sessions(store_url: str) -> None:
    assert run("sessions", "list", "--store", store_url).output == "No sessions.\n"


def test_a_session_under_several_tenants_needs_tenant(logged: str) -> None:
    write(logged, SessionKey(OTHER, "run-1"), [message(0, USER)])
    result = run("sessions", "log", "run-1", "--store", logged)
    assert result.exit_code == 1
    assert f"several tenants, pick one with --tenant: {TENANT}, {OTHER}" in result.output
    result = run("sessions", "view", "run-1", "--tenant", OTHER, "--json", "--store", logged)
    assert result.exit_code == 0 and orjson.loads(result.output)["messages"] == [USER]


@pytest.mark.parametrize("command", ["log", "view"])
def test_an_unknown_session_is_an_error(logged: str, command: str) -> None:
    result = run("sessions", command, "nobody", "--store", logged)
    assert result.exit_code == 1 and "no session 'nobody'" in result.output
    result = run("sessions", command, "run-1", "--tenant", OTHER, "--store", logged)
    assert result.exit_code == 1 and f"no session 'run-1' under tenant '{OTHER}'" in result.output


def test_store_comes_from_the_environment(logged: str) -> None:
    result = CliRunner().invoke(main, ["sessions", "list", "--json"], env={**ENV, "CTXPROXY_STORE": logged})
    assert [row["session"] for row in orjson.loads(result.output)] == ["run-1"]


def no_upstreams() -> list[str]:
    """Upstream flags naming a closed port: ``check`` probes each upstream, and these tests are about the store."""
    closed = f"http://127.0.0.1:{free_port()}"
    return ["--upstream", closed + "/v1", "--anthropic-upstream", closed, "--gemini-upstream", closed]


def test_check_pings_the_store(store_url: str) -> None:
    result = run("check", "--store", store_url, *no_upstreams())
    assert result.stdout == f"store {store_url}: ok\n"


def test_check_fails_when_the_store_does_not_answer() -> None:
    result = run("check", "--store", f"redis://:hunter2@127.0.0.1:{free_port()}/0", *no_upstreams())
    assert result.exit_code == 1
    assert "failed" in result.output and "hunter2" not in result.output and ":***@" in result.output


def test_check_refuses_an_unknown_scheme() -> None:
    result = run("check", "--store", "mysql://nope")
    assert result.exit_code == 2 and "--store 'mysql://nope' is not a store URL" in result.output  # as serve says it


@pytest.mark.parametrize(("flag", "field", "raw", "value"), [
    ("--client-timeout", "client_timeout", "2.5", 2.5), ("--max-event-bytes", "max_event_bytes", "4096", 4096)])
def test_transport_limits_are_flags_and_environment_variables(flag: str, field: str, raw: str, value: Any) -> None:
    env = "CTXPROXY_" + field.upper()
    help_text = CliRunner().invoke(main, ["serve", "--help"]).output
    assert flag in help_text and env in help_text
    assert getattr(Settings.from_env({env: raw}), field) == value
    assert getattr(Settings.from_env({env: "1"}, **{field: value}), field) == value, "the flag wins"


TITLE_SYSTEM: dict[str, Any] = {"role": "system", "content": "You write titles."}
TITLE_USER: dict[str, Any] = {"role": "user", "content": "Title for: Fix the failing test."}
TITLE: dict[str, Any] = {"role": "assistant", "content": "Failing test fix"}
NEXT: dict[str, Any] = {"role": "user", "content": "Now run the linter."}


def tree_log() -> list[NewFact]:
    """The main run, a title call branching from the start, and the main run again (CONTRACT: a tree of lineages)."""
    return [
        *small_log()[:4], message(4, FINAL, "upstream"), *small_log()[7:],  # seqs 0-6: main run and its checkpoint
        NewFact(kind="rewind", index=0, source="client", extra={"from_seq": None}),
        message(0, TITLE_SYSTEM), message(1, TITLE_USER), message(2, TITLE, "upstream"),  # seqs 7-10
        NewFact(kind="rewind", index=5, source="client", extra={"from_seq": 4}),
        message(5, NEXT),  # seqs 11-12
    ]


def test_a_returning_lineage_keeps_its_checkpoint_in_the_view_and_the_transcript(store_url: str) -> None:
    write(store_url, SessionKey(TENANT, "tree"), tree_log())
    view = orjson.loads(run("sessions", "view", "tree", "--json", "--store", store_url).output)
    led = {"role": "user", "content": f"{SUMMARY_MESSAGE['content']}{SUMMARY_END}{USER['content']}"}
    assert view["messages"] == [SYSTEM, led, FINAL, NEXT]
    assert view["checkpoint"] == as_read(checkpoint())
    text = run("sessions", "log", "tree", "--store", store_url).output
    assert "── rewind to message 0, from the start ──" in text
    assert "── rewind to message 5, after entry 4 ──" in text
    assert "── checkpoint: messages 1–3 summarised (12,345 → 3,210 tokens) ──" in text  # noqa: RUF001
    entries = [orjson.loads(line) for line in run("sessions", "log", "tree", "--json", "--store",
                                                   store_url).output.splitlines()]
    assert [(e["seq"], e["index"], e["from_seq"]) for e in entries if e["kind"] == "rewind"] == [(7, 0, None),
                                                                                                 (11, 5, 4)]


@pytest.mark.parametrize(("flag", "field", "raw", "value"), [
    ("--keep-tool-outputs", "keep_tool_outputs", "3", 3), ("--keep-user-words", "keep_user_words", "500", 500),
    ("--recall-tool", "recall_tool", "true", True), ("--cache-ttl", "cache_ttl", "3600", 3600.0)])
def test_the_tier_settings_are_flags_and_environment_variables(flag: str, field: str, raw: str, value: Any) -> None:
    env = "CTXPROXY_" + field.upper()
    help_text = CliRunner().invoke(main, ["serve", "--help"]).output
    assert flag in help_text and env in help_text
    assert getattr(Settings.from_env({env: raw}), field) == value
    assert getattr(Settings.from_env({env: "0" if field != "keep_tool_outputs" else "9"}, **{field: value}),
                   field) == value, "the flag wins"


def test_tier_settings_are_validated() -> None:
    assert (Settings().keep_tool_outputs, Settings().keep_user_words, Settings().recall_tool) == (10, None, False)
    with pytest.raises(ValueError, match="keep_tool_outputs must be at least 1"):
        Settings(keep_tool_outputs=0)
    with pytest.raises(ValueError, match="CTXPROXY_RECALL_TOOL must be true or false"):
        Settings.from_env({"CTXPROXY_RECALL_TOOL": "maybe"})
    assert Settings.from_env({"CTXPROXY_RECALL_TOOL": "off"}).recall_tool is False
    result = CliRunner().invoke(main, ["serve", "--keep-tool-outputs", "0"])
    assert result.exit_code == 2 and "--keep-tool-outputs" in result.output
