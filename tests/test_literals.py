"""Errors and literals kept exactly (issue 33, item 2): what a compaction's view would lose is added back."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from typing import Any

import orjson

from proxy.context.checkpoint import Checkpoint
from proxy.context.compactor import ContextCompactor
from proxy.context.keep.literals import (
    LITERALS_HEADING,
    Exact,
    add_back,
    bounded,
    call_source,
    extract,
    from_json,
    literal_maker,
    live,
    shown_text,
    to_json,
)
from proxy.context.keep.shellwrites import written
from proxy.context.keep.workingset import working_set_maker
from proxy.context.summary.summarizer import SummaryGenerator
from proxy.context.view.projection import ProjectionBuilder, summary_text
from proxy.dialects import CHAT, GEMINI
from proxy.keys import store_key
from proxy.settings import Secret
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import read_log
from tests.test_artifacts import NO_SPACE, OUTSIDE, gemini_failures
from tests.test_compaction_e2e import prose
from tests.test_compactor import COUNT, CREATED_AT, Model, chat, hashes_of
from tests.test_metrics import scrape, value
from tests.test_ui import KEY, TENANT, TOKEN, page, session_path, sign_in

ERROR = "E   ValueError: unexpected token at line 41 of parser.py"
COMMAND = "pytest -q tests/test_parse.py  -k 'not slow'"


def call(n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}]}


def result(n: int, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"c{n}", "content": text}


def run(n: int, command: str, output: str) -> list[dict[str, Any]]:
    return [call(n, "bash", {"command": command}), result(n, output)]


FAILED = f"collected 3 items\n\n{ERROR}\nFAILED tests/test_parse.py::test_tokens\nExit code 1"


def test_an_error_line_is_read_verbatim_with_the_command_that_produced_it() -> None:
    messages = [{"role": "user", "content": "Fix the parser."}, *run(0, COMMAND, FAILED)]
    found, _ = extract(CHAT, messages, 0, len(messages), [10, 11, 12])
    errors = [(e.text, e.source, e.seq) for e in found if e.kind == "error"]
    assert errors == [("Exit code 1", f"$ {COMMAND}", 11), (ERROR, f"$ {COMMAND}", 11),
                      ("FAILED tests/test_parse.py::test_tokens", f"$ {COMMAND}", 11)]
    assert [e.text for e in found if e.kind == "command"] == [COMMAND]  # whole, its double space kept
    # A result stating no status: a compiler's diagnostic, a tool's own word that a thing was not found.
    tsc = "> tsc -b\nsrc/main.tsx(5,8): error TS2882: Cannot find module './styles.css'.\n"
    messages = [*run(0, "npm run build", tsc), call(1, "activate_skill", {"name": "figma"}),
                result(1, 'Skill "figma" not found. Available skills are:')]
    found, _ = extract(CHAT, messages, 0, len(messages))
    assert [(e.text, e.source) for e in found if e.kind == "error"] == [
        ("src/main.tsx(5,8): error TS2882: Cannot find module './styles.css'.", "$ npm run build"),
        ('Skill "figma" not found. Available skills are:', 'activate_skill {"name":"figma"}')]


def test_a_long_call_is_named_by_its_head_length_and_digest() -> None:
    heredoc, other = "cat > a.go <<'EOF'\n" + "x" * 2_000 + "\nEOF", "cat > a.go <<'EOF'\n" + "x" * 2_001 + "\nEOF"
    named = call_source("bash", {}, heredoc)
    assert named.startswith("$ cat > a.go <<'EOF' …(1 line)… EOF… (2,025 characters, ") and len(named) < 250
    assert named != call_source("bash", {}, other) and call_source("bash", {}, "ls") == "$ ls"
    # The head names what the command wrote, its body as its line count: the trail's name for it.
    two = "cat > a.go <<'EOF'\n" + "x\n" * 1_000 + "EOF\ncat > b.go <<'EOF'\n" + "y\n" * 1_000 + "EOF\ngo build ./..."
    assert call_source("bash", {}, two).startswith(
        "$ cat > a.go <<'EOF' …(1000 lines)… EOF cat > b.go <<'EOF' …(1000 lines)… EOF go build ./...… (4,")


def test_an_error_followed_by_a_success_of_the_same_command_is_kept_as_resolved() -> None:
    messages = [{"role": "user", "content": "Fix the parser."}, *run(0, COMMAND, FAILED),
                *run(1, "git status", "clean"), *run(2, COMMAND, "3 passed")]
    found, runs = extract(CHAT, messages, 0, 3)
    kept = live(found, runs)
    assert {e.text: e.kind for e in kept if e.source == f"$ {COMMAND}"} == {
        "Exit code 1": "resolved", ERROR: "resolved", "FAILED tests/test_parse.py::test_tokens": "resolved"}
    text, _ = add_back(kept, "", 10_000, len)
    assert "Errors since resolved (a later run of the same call succeeded):\n- Exit code 1" in text
    assert "Errors (unresolved)" not in text


def test_an_error_superseded_by_a_later_failure_of_the_same_command_gives_way_to_it() -> None:
    newer = "E   KeyError: 'tokens'\nExit code 2"
    messages = [{"role": "user", "content": "Fix it."}, *run(0, COMMAND, FAILED), *run(1, COMMAND, newer)]
    found, runs = extract(CHAT, messages, 0, len(messages))
    errors = [(e.text, e.kind) for e in live(found, runs) if e.source == f"$ {COMMAND}"]
    assert errors == [("Exit code 2", "error"), ("E   KeyError: 'tokens'", "error")]
    # Seen again later, a literal stands once, at its newest occurrence.
    again = live([Exact("path", "src/a.py", "", 3, 3), Exact("path", "src/a.py", "", 9, 9)], [])
    assert again == [Exact("path", "src/a.py", "", 9, 9)]


def test_a_refused_run_neither_resolves_nor_supersedes_an_error_of_the_same_command_and_its_reason_stands() -> None:
    """A call its client refused to run (``proxy.context.keep.refusals``) ran nothing: it is no success that
    resolves the error before it, no command run, and the client's reason is an error of that call."""
    refusal = "exec command rejected: dangerous command detected"
    messages = [{"role": "user", "content": "Fix the parser."}, *run(0, COMMAND, FAILED), *run(1, COMMAND, refusal)]
    found, runs = extract(CHAT, messages, 0, len(messages), list(range(10, 15)))
    kept = live(found, runs)
    assert {e.text: e.kind for e in kept if e.source == f"$ {COMMAND}"} == {
        "Exit code 1": "error", ERROR: "error", "FAILED tests/test_parse.py::test_tokens": "error", refusal: "error"}
    assert [(e.text, e.seq) for e in kept if e.kind == "command"] == [(COMMAND, 11)], "the refused one ran nothing"
    text, _ = add_back(kept, "", 10_000, len)
    assert f"- {refusal}\n  (from $ {COMMAND}, log #13)" in text and "since resolved" not in text
    # A later run that succeeds resolves them all.
    found, runs = extract(CHAT, [*messages, *run(2, COMMAND, "3 passed")], 0, len(messages))
    assert {e.kind for e in live(found, runs) if e.source == f"$ {COMMAND}"} == {"resolved"}


def test_a_gemini_call_answered_with_an_error_keeps_its_error_line_with_the_call() -> None:
    """Gemini CLI's ``{"error": message}``: the message is the error line of the call, whatever its words, and a
    write that failed is no path written."""
    messages = gemini_failures()
    found, runs = extract(GEMINI, messages, 0, len(messages))
    assert [(e.text, e.source) for e in found if e.kind == "error"] == [
        (NO_SPACE, 'write_file {"content":"print(\'bye\')\\n","file_path":"/w/app.py"}'), (OUTSIDE, "$ ls")]
    assert [e.text for e in found if e.kind == "path"] == ["/w/ok.py"]
    assert [ok for _, _, ok in runs] == [False, True, False]


def test_paths_identifiers_numbers_urls_versions_and_constraints_are_read() -> None:
    user = ("Use `parse_tokens` in the gateway. You must never log the API key. Set the retry limit to 2500 and "
            "pin fastapi 0.115.2 as described at https://fastapi.tiangolo.com/release-notes/.\n"
            "- Keep tokenCache bounded.")
    messages = [{"role": "user", "content": user},
                call(0, "Write", {"file_path": "src/gateway.py", "content": "x = 1\n"}), result(0, "written"),
                *run(1, "cat > notes/plan.md <<'EOF'\nif a > b then\nEOF", ""),
                {"role": "assistant", "content": "Upgraded to v3.2 and renamed `TokenStore`."}]
    found, _ = extract(CHAT, messages, 0, len(messages))
    by_kind: dict[str, list[str]] = {}
    for literal in found:
        by_kind.setdefault(literal.kind, []).append(literal.text)
    assert by_kind["path"] == ["src/gateway.py", "notes/plan.md"]
    assert by_kind["url"] == ["https://fastapi.tiangolo.com/release-notes/"]
    assert set(by_kind["version"]) == {"0.115.2", "v3.2"}
    assert {"parse_tokens", "tokenCache", "TokenStore"} <= set(by_kind["identifier"])
    assert by_kind["number"] == ["2500"]
    assert by_kind["constraint"] == ["Use `parse_tokens` in the gateway.", "You must never log the API key.",
                                     "- Keep tokenCache bounded."]
    assert written("@'\nreturn a -> b\n'@ | Set-Content app\\api\\router.py; echo x >> log.txt 2>/dev/null") \
        == ["app\\api\\router.py", "log.txt"]


def test_the_add_back_holds_what_the_view_lacks_within_its_budget_unresolved_errors_and_the_newest_first() -> None:
    literals = [Exact("command", "make build", "", 1, 1), Exact("error", "old failure", "$ a", 2, 2),
                Exact("path", "src/kept.py", "", 3, 3), Exact("resolved", "fixed failure", "$ b", 4, 4),
                Exact("error", "new failure", "$ c", 5, 5), Exact("number", "8080", "", 6, 6)]
    shown = "the summary names src/kept.py"
    count = len  # a character counts as a token: the arithmetic stays visible
    whole, receipt = add_back(literals, shown, 10_000, count)
    assert receipt.to_json() == {"in_range": 6, "kept": 1, "added": 5, "dropped": 0}
    order = [whole.index(text) for text in ("new failure", "old failure", "make build", "fixed failure", "8080")]
    assert order == sorted(order) and "src/kept.py" not in whole
    assert "- new failure\n  (from $ c, log #5)" in whole
    # Room for the heading and the two unresolved errors only: they come first, the rest is dropped for budget.
    fixed = count(LITERALS_HEADING) + 18
    room = fixed + sum(count(f"- {t}\n  (from $ x, log #5)") + 1 for t in ("new failure", "old failure"))
    text, receipt = add_back(literals, shown, room, count)
    assert receipt.to_json() == {"in_range": 6, "kept": 1, "added": 2, "dropped": 3}
    assert "new failure" in text and "old failure" in text and "make build" not in text
    assert add_back(literals, shown, 10, count) == ("", receipt.__class__(6, 1, 0, 5))


def test_a_command_that_writes_a_file_from_a_heredoc_yields_to_the_commands_that_say_what_the_agent_ran() -> None:
    heredoc = "cat > src/app.py <<'EOF'\nprint('hello')\nEOF"
    here_string = "@'\nprint('hello')\n'@ | Set-Content src\\app.py"
    literals = [Exact("command", "make build", "", 1, 1), Exact("command", "npm test", "", 2, 2),
                Exact("command", heredoc, "", 3, 3), Exact("command", here_string, "", 4, 4)]
    count = len
    whole, _ = add_back(literals, "", 10_000, count)
    assert [whole.index(t) for t in ("npm test", "make build", here_string, heredoc)] == sorted(
        whole.index(t) for t in ("npm test", "make build", here_string, heredoc))
    room = count(LITERALS_HEADING) + 18 + sum(count(f"- $ {t}") + 1 for t in ("make build", "npm test"))
    text, receipt = add_back(literals, "", room, count)  # room for two: the older plain command beats the heredocs
    assert "make build" in text and "npm test" in text and "print" not in text
    assert receipt.to_json() == {"in_range": 4, "kept": 0, "added": 2, "dropped": 2}


def test_a_codex_code_mode_cell_gives_the_commands_it_runs_and_the_files_its_patch_writes() -> None:
    patch = orjson.dumps("*** Begin Patch\n*** Add File: src/App.tsx\n+export {}\n*** End Patch").decode()
    cells = [f"const patch = {patch};\ntext(await tools.apply_patch(patch));",
             'const r = await tools.exec_command({cmd:"npm run build && npm test","workdir":"/w"}); text(r.output);',
             "for (const c of ['make']) await tools.exec_command({cmd: c})"]  # code the proxy does not read
    messages = [m for n, source in enumerate(cells)
                for m in (call(n, "exec", {"input": source}), result(n, "Script completed\nOutput:\n"))]
    found, _ = extract(CHAT, messages, 0, len(messages))
    assert [(e.kind, e.text) for e in found if e.kind in ("command", "path")] == [
        ("path", "src/App.tsx"), ("command", "npm run build && npm test")]


def test_an_error_output_is_known_by_its_traceback_and_a_tool_by_its_own_diagnostic() -> None:
    traceback = ("Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\n"
                 "ModuleNotFoundError: No module named 'yt'\nneed install\n")
    messages = [*run(0, "python3 -c 'import yt' 2>&1 || echo need install", traceback),
                call(1, "telegram_send", {"path": "/tmp/a.html"}),
                result(1, "telegram_send: path escapes the workspace root; only files inside the project can be sent"),
                call(2, "browser", {"action": "run", "code": "moreBtn.click()"}), result(2, "moreBtn is not defined"),
                call(3, "telegram_send", {"path": "a.html"}), result(3, "sent a.html: 1 file")]
    found, _ = extract(CHAT, messages, 0, len(messages))
    assert [e.text for e in found if e.kind == "error"] == [
        "Traceback (most recent call last):", "ModuleNotFoundError: No module named 'yt'",
        "telegram_send: path escapes the workspace root; only files inside the project can be sent",
        "moreBtn is not defined"]


def test_a_resolved_error_comes_before_a_command_that_writes_a_file_from_a_heredoc() -> None:
    heredoc = "cat > src/app.py <<'EOF'\nprint('hello')\nEOF"
    literals = [Exact("resolved", "Exit code: 124", "$ npm install", 1, 1), Exact("command", heredoc, "", 2, 2),
                Exact("url", "https://example.com/spec", "", 3, 3)]
    count = len
    whole, _ = add_back(literals, "", 10_000, count)
    assert all(text in whole for text in ("Exit code: 124", heredoc, "https://example.com/spec"))
    room = count(LITERALS_HEADING) + 18 + count("- Exit code: 124\n  (from $ npm install, log #1)") + 1
    text, receipt = add_back(literals, "", room, count)
    assert "Exit code: 124" in text and heredoc not in text and receipt.dropped == 2


def test_a_long_command_is_a_literal_and_a_long_heredoc_write_comes_after_every_other_literal() -> None:
    """A heredoc that writes a whole file is the command the agent ran (and the file): a literal of any length, but
    the costliest, so it takes only the room every other literal leaves, where a short one would come before
    them."""
    moves = "\n".join(f"mv public/assets/icons/4-{n}.svg public/assets/icons/icon-{n}.svg" for n in range(30))
    heredoc = "cat > src/big.py <<'EOF'\n" + "x = 1\n" * 300 + "EOF"
    messages = [*run(0, moves, "Exit code: 0"), *run(1, heredoc, "Exit code: 0"),
                {"role": "user", "content": "Port 8080 is free"}]
    assert len(moves) > 1_000 and len(heredoc) > 1_000
    found, _ = extract(CHAT, messages, 0, len(messages))
    assert [e.text for e in found if e.kind == "command"] == [moves, heredoc]
    whole, _ = add_back(found, "", 100_000, len)
    assert "- 8080" in whole and heredoc in whole
    full = next(room for room in range(len(whole) // 2, 2 * len(whole))
                if add_back(found, "", room, len)[1].dropped == 0)
    text, receipt = add_back(found, "", full - 1, len)  # one literal short: the last in line gives way
    assert "- 8080" in text and moves in text and heredoc not in text and receipt.dropped == 1


def test_a_checkpoint_keeps_the_newest_long_heredocs_within_a_bound_of_characters() -> None:
    short = Exact("command", "make", "", 0, 0)
    long = [Exact("command", f"cat > f{n}.py <<'EOF'\n" + "y = 2\n" * 400 + "EOF", "", n, n) for n in range(1, 4)]
    kept = bounded([short, *long], 2 * len(long[0].text))
    assert kept == [short, long[1], long[2]], "the oldest long one goes, the short one stays"
    assert bounded([short, *long], 0) == [short]


def test_the_literals_take_what_the_files_in_hand_leave_of_their_budget() -> None:
    """What the proxy carries exactly from the log fills the two shares whichever has more to carry: the files in
    hand lend the literals the part of their budget their section leaves."""
    commands = [f"pytest tests/test_{n}.py -k case_{n}" for n in range(40)]
    messages = [{"role": "user", "content": "go"}, *(m for n, c in enumerate(commands) for m in run(n, c, "ok"))]
    own = 400
    alone = literal_maker(CHAT, own, len)
    lending = literal_maker(CHAT, own, len, lent=1_200)
    counted = [sum(c in text for c in commands) for _, text, _ in (
        alone((), messages, 0, len(messages), [], "", ""),
        lending((), messages, 0, len(messages), [], "", ""),
        lending((), messages, 0, len(messages), [], "", "f" * 1_200))]
    assert counted[0] < counted[1] and counted[2] == counted[0], counted
    _, text, _ = lending((), messages, 0, len(messages), [], "", "f" * 600)
    assert counted[0] < sum(c in text for c in commands) < counted[1] and len(text) <= own + 600


def test_the_view_text_leaves_tool_outputs_out() -> None:
    messages = [*run(0, "make", "Error: boom")]
    text = shown_text(CHAT, messages)
    assert "make" in text and "Error: boom" not in text


def test_a_checkpoint_keeps_its_literals_and_receipt_and_an_older_entry_reads_without_them() -> None:
    rows = tuple(tuple(row) for row in to_json([Exact("error", "boom", "$ make", 4, 9)]))
    checkpoint = Checkpoint("s", 3, "h", None, 10, 5, "m", 0.0, literals=rows, literals_text="## x",
                            literal_receipt={"in_range": 1, "kept": 0, "added": 1, "dropped": 0})
    again = Checkpoint.from_json(checkpoint.to_json())
    assert again == checkpoint and from_json(list(again.literals)) == [Exact("error", "boom", "$ make", 4, 9)]
    old = orjson.loads(checkpoint.to_json())
    for name in ("literals", "literals_text", "literal_receipt"):
        del old[name]
    read = Checkpoint.from_json(old)
    assert read.literal_receipt == {} and read.literals == () and read.literals_text == ""
    assert read.view_key == Checkpoint("s", 3, "h", None, 10, 5, "m", 0.0).view_key


async def session(proxy: Any, fake: FakeUpstream, name: str, rounds: int) -> list[dict[str, Any]]:
    """An agent's run whose first step fails a test run with an exact error line, then reads files."""
    rng = random.Random(3)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for n in range(rounds):
        messages.append({"role": "user", "content": f"Round {n}: " + prose(rng, 100)})
        name_, args = ("bash", {"command": COMMAND}) if n == 0 else ("read_file", {"path": f"src/m{n}.py"})
        fake.script.append(Reply(tool_calls=call(n, name_, args)["tool_calls"]))
        messages.append(await step(proxy, messages, name))
        output = f"{prose(rng, 200)}\n{FAILED}" if n == 0 else prose(rng, 300)
        messages.append(result(n, output))
        fake.script.append(Reply(content=prose(rng, 50)))
        messages.append(await step(proxy, messages, name))
    return messages


async def step(proxy: Any, messages: list[dict[str, Any]], name: str) -> dict[str, Any]:
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
             for n in ("bash", "read_file")]
    resp = await proxy.post("/v1/chat/completions",
                            data=orjson.dumps({"model": "gpt-4o", "messages": messages, "tools": tools}),
                            headers={"Authorization": f"Bearer {KEY}", "X-Session-Id": name})
    assert resp.status == 200, await resp.text()
    message: dict[str, Any] = (await resp.json())["choices"][0]["message"]
    return message


async def test_a_compacted_error_line_is_added_back_and_each_checkpoint_entry_carries_its_receipt(
        make_proxy, fake: FakeUpstream) -> None:
    proxy = await make_proxy(context_window=4000, min_retain_rounds=2, admin_token=Secret(TOKEN))
    await session(proxy, fake, "s1", 10)
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "s1"))
    # Every checkpoint that summarised carries a receipt (one that only masked outputs carries the last one's).
    receipts = [f.extra["checkpoint"]["literal_receipt"] for f in facts
                if f.kind == "checkpoint" and f.extra["checkpoint"]["summary"]]
    assert receipts and all(r["in_range"] == r["kept"] + r["added"] + r["dropped"] for r in receipts)
    assert receipts[-1]["added"] >= 1
    last = orjson.dumps(fake.requests[-1]["messages"]).decode()
    assert orjson.dumps(ERROR).decode()[1:-1] in last  # verbatim, with the command that produced it
    assert orjson.dumps(f"- {ERROR}\n  (from $ {COMMAND}, log #").decode()[1:-1] in last
    assert "Exit code 1" in last

    # /metrics sums the receipts of the compactions this process made; the inspector shows each one's coverage.
    _, samples = await scrape(proxy)
    for outcome in ("kept", "added"):
        assert value(samples, "ctxproxy_literals_total", outcome=outcome) >= receipts[-1][outcome]
    await sign_in(proxy)
    html = await page(proxy, session_path("s1"))
    last_receipt = receipts[-1]
    line = (f"literals: {last_receipt['in_range']:,} in range, {last_receipt['kept']:,} kept by the summary and tail, "
            f"{last_receipt['added']:,} added, {last_receipt['dropped']:,} dropped")
    assert line in html
    assert len(re.findall(r"literals: \d+ in range", html)) >= len(receipts)


def literal_compactor() -> ContextCompactor:
    return ContextCompactor(SummaryGenerator(Model()), COUNT, clock=lambda: CREATED_AT,  # type: ignore[arg-type]
                            projection=ProjectionBuilder(CHAT), min_retain_rounds=4,
                            literals_of=literal_maker(CHAT, 10_000, len))


async def test_successive_compactions_carry_the_literals_and_one_after_an_older_checkpoint_reads_all() -> None:
    messages = [*chat(1), *run(0, COMMAND, FAILED), *chat(16)[1:]]
    hashes = hashes_of(messages)
    first = await literal_compactor().compact(messages[:21], hashes[:21], None, budget=10_000, model="m")
    assert first.checkpoint is not None and ERROR in first.checkpoint.literals_text
    second = await literal_compactor().compact(messages, hashes, first.checkpoint, budget=10_000, model="m")
    assert second.checkpoint is not None and second.checkpoint.retain_start_idx > first.checkpoint.retain_start_idx
    assert ERROR in second.checkpoint.literals_text  # carried in the rows, checked against the new summary
    assert second.checkpoint.literal_receipt["in_range"] >= first.checkpoint.literal_receipt["in_range"]
    # A checkpoint made before literals were read carries none: the next compaction reads the whole range.
    older = replace(first.checkpoint, literals=(), literals_text="", literal_receipt={})
    third = await literal_compactor().compact(messages, hashes, older, budget=10_000, model="m")
    assert third.checkpoint is not None and ERROR in third.checkpoint.literals_text
    assert summary_text(third.checkpoint).endswith(third.checkpoint.literals_text)


def test_a_long_heredoc_whose_file_a_later_one_wrote_again_comes_after_those_still_standing() -> None:
    """A heredoc whose every file a later heredoc wrote whole again carries no file's text any more, only history:
    it yields to older ones whose text may still be their file's."""
    def heredoc(path: str, line: str) -> str:
        return f"cat > {path} <<'EOF'\n" + f"{line}\n" * 200 + "EOF"

    writes = [heredoc("b.py", "b = 1"), heredoc("a.py", "a = 1"), heredoc("a.py", "a = 2")]
    literals = [Exact("command", text, "", n, n) for n, text in enumerate(writes)]
    whole, _ = add_back(literals, "", 100_000, len)
    full = next(room for room in range(len(whole) // 2, 2 * len(whole))
                if add_back(literals, "", room, len)[1].dropped == 0)
    text, _ = add_back(literals, "", full - 1, len)
    assert writes[2] in text and writes[0] in text and writes[1] not in text


async def test_a_heredoc_the_files_in_hand_carry_as_its_command_is_not_added_back_again() -> None:
    """The files in hand carry an unchanged heredoc write as its command: the literals see it in the view and do not
    carry it a second time, and what the files' section leaves of its budget goes to the literals."""
    write = "cat > src/app.py <<'EOF'\n" + "print('hello')\n" * 20 + "EOF"
    messages = [*chat(1), *run(0, write, "Exit code: 0"), *chat(16)[1:]]
    hashes = hashes_of(messages)
    compactor = ContextCompactor(SummaryGenerator(Model()), COUNT, clock=lambda: CREATED_AT,  # type: ignore[arg-type]
                                 projection=ProjectionBuilder(CHAT), min_retain_rounds=4,
                                 working_set_of=working_set_maker(CHAT, 10_000, len),
                                 literals_of=literal_maker(CHAT, 10_000, len, lent=10_000))
    made = await compactor.compact(messages, hashes, None, budget=10_000, model="m")
    assert made.checkpoint is not None and write in made.checkpoint.files
    assert summary_text(made.checkpoint).count(write) == 1 and write not in made.checkpoint.literals_text
