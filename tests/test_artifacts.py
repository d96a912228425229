"""The artifact trail: files and commands read from each client's tool calls, de-duplicated, rendered, stored."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.context.keep.artifactparse import NAME_CHARS, clip, command_text, outcome, patch_files
from proxy.context.keep.artifacts import ARTIFACTS_HEADING, Artifact, collect, from_json, merge, render, to_json
from proxy.context.keep.literals import extract
from proxy.context.view.tokens import TokenCounter
from proxy.dialects import CHAT, GEMINI, MESSAGES, RESPONSES

COUNTER = TokenCounter()


def trail(artifacts: list[Artifact]) -> list[tuple[str, str, str]]:
    return [(a.kind, a.name, a.action) for a in artifacts]


# Claude Code (Anthropic Messages): tool_use blocks in the assistant turn, tool_result blocks in the next user turn.
def claude_call(*uses: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "plan", "signature": "sig"},
        *({"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in uses)]}


def claude_results(*results: tuple[str, Any, bool]) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": i, "content": c, **({"is_error": True} if e else {})}
        for i, c, e in results]}


CLAUDE: list[dict[str, Any]] = [
    {"role": "user", "content": "fix the parser"},
    claude_call(("t1", "Read", {"file_path": "/repo/parse.py"}),
                ("t2", "Write", {"file_path": "/repo/new.py", "content": "x = 1\n"}),
                ("t3", "Edit", {"file_path": "/repo/parse.py", "old_string": "a", "new_string": "b"}),
                ("t4", "Edit", {"file_path": "/repo/other.py", "old_string": "zz", "new_string": "b"})),
    claude_results(("t1", [{"type": "text", "text": "1\ta = 1"}], False),
                   ("t2", "File created successfully at: /repo/new.py", False),
                   ("t3", "The file /repo/parse.py has been updated.", False),
                   ("t4", "<tool_use_error>String to replace not found in file.</tool_use_error>", True)),
    claude_call(("t5", "Bash", {"command": "python -m pytest -q", "description": "Run the tests"}),
                ("t6", "MultiEdit", {"file_path": "/repo/m.py", "edits": []}),
                ("t7", "NotebookEdit", {"notebook_path": "/repo/n.ipynb", "new_source": "", "edit_mode": "delete"}),
                ("t8", "Bash", {"command": "frobnicate --all"})),
    claude_results(("t5", [{"type": "text", "text": "Exit code 1\nTraceback (most recent call last):\n  File \"x\"\n"
                                                    "ValueError: bad token"}], True),
                   ("t6", "Applied 2 edits to /repo/m.py", False),
                   ("t7", "Deleted cell 3", False),
                   ("t8", "/bin/bash: line 1: frobnicate: command not found", True)),
]


def test_claude_code_files_and_commands_with_exit_status_and_errors() -> None:
    assert trail(collect(MESSAGES, CLAUDE, 0, len(CLAUDE), seqs=[10, 11, 12, 13, 14])) == [
        ("file", "/repo/new.py", "written"),
        ("file", "/repo/parse.py", "edited"),  # t4's edit failed: it changed nothing and is not listed
        ("command", "python -m pytest -q", "exit 1: ValueError: bad token"),
        ("file", "/repo/m.py", "edited"),
        ("file", "/repo/n.ipynb", "edited"),
        ("command", "frobnicate --all", "error: /bin/bash: line 1: frobnicate: command not found"),
    ]
    found = collect(MESSAGES, CLAUDE, 0, len(CLAUDE), seqs=[10, 11, 12, 13, 14])
    assert [(a.index, a.seq) for a in found] == [(1, 11), (1, 11), (3, 13), (3, 13), (3, 13), (3, 13)]


def test_a_claude_tool_result_without_content_leaves_the_others_their_own() -> None:
    """A ``tool_result`` block may come without its ``content`` (the Messages API allows it): the results beside it
    no longer paired one to one with their outputs, and a failed command among them read as ending in nothing."""
    results = claude_results(("u2", "exit status 2\nmake: *** [all] Error 2", True))
    messages = [{"role": "user", "content": "build"},
                claude_call(("u1", "Bash", {"command": "touch stamp"}), ("u2", "Bash", {"command": "make"})),
                {**results, "content": [{"type": "tool_result", "tool_use_id": "u1"}, *results["content"]]}]
    assert trail(collect(MESSAGES, messages, 0, len(messages))) == [
        ("command", "touch stamp", ""), ("command", "make", "exit 2")]


def test_the_text_editor_tool_says_in_its_command_whether_it_writes() -> None:
    messages = [claude_call(("e1", "str_replace_based_edit_tool", {"command": "view", "path": "/r/a.py"}),
                            ("e2", "str_replace_based_edit_tool", {"command": "create", "path": "/r/b.py",
                                                                   "file_text": ""}),
                            ("e3", "str_replace_based_edit_tool", {"command": "str_replace", "path": "/r/a.py",
                                                                   "old_str": "a", "new_str": "b"}))]
    assert trail(collect(MESSAGES, messages, 0, 1)) == [("file", "/r/b.py", "created"), ("file", "/r/a.py", "edited")]


# Codex (Responses): function_call / custom_tool_call / local_shell_call items, each answered by its own output item.
PATCH = ("*** Begin Patch\n*** Update File: src/app.py\n*** Move to: src/main.py\n@@\n-a\n+b\n"
         "*** Delete File: old.py\n*** Add File: docs/new.md\n+# New\n*** End Patch")


def fc(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()}


def out(call_id: str, output: str, kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": output}


CODEX: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"},
    fc("c1", "exec_command", {"cmd": "pytest -q", "workdir": "/repo", "yield_time_ms": 1000}),
    out("c1", "Chunk ID: ab12\nWall time: 0.8 seconds\nProcess exited with code 1\nOriginal token count: 40\n"
              "Output:\nFAILED tests/test_x.py::test_y - AssertionError: boom\nexit code 0\n1 failed in 0.1s\n"),
    fc("c2", "shell", {"command": ["bash", "-lc", "ls -la"], "workdir": "/repo"}),
    out("c2", '{"output":"total 0\\n","metadata":{"exit_code":0,"duration_seconds":0.0}}'),
    fc("c3", "shell", {"command": ["bash", "-lc", "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: hello.txt\n"
                                   "+hi\n*** End Patch\nEOF\n"]}),
    out("c3", "Exit code: 0\nWall time: 0 seconds\nOutput:\nSuccess. Updated the following files:\nA hello.txt\n"),
    fc("c4", "apply_patch", {"input": PATCH}),
    out("c4", "Exit code: 0\nWall time: 0 seconds\nOutput:\nSuccess."),
    {"type": "custom_tool_call", "id": "ctc_5", "call_id": "c5", "name": "apply_patch",
     "input": "*** Begin Patch\n*** Update File: src/main.py\n@@\n-b\n+c\n*** End Patch\n"},
    out("c5", "Success. Updated the following files:\nM src/main.py\n", "custom_tool_call_output"),
    {"type": "local_shell_call", "id": "lsh_6", "call_id": "c6", "status": "completed",
     "action": {"type": "exec", "command": ["make", "test"], "timeout_ms": 1000, "working_directory": "/repo",
                "env": {}}},
    out("c6", '{"output":"cc -o x x.c\\nx.c:3: error: expected \';\'\\nmake: *** [test] Error 2\\n",'
              '"metadata":{"exit_code":2,"duration_seconds":0.3}}', "local_shell_call_output"),
    fc("c7", "shell_command", {"command": "git status --short"}),
]


def test_codex_commands_patches_moves_deletes_and_local_shell() -> None:
    assert trail(collect(RESPONSES, CODEX, 0, len(CODEX))) == [
        ("command", "pytest -q", "exit 1: FAILED tests/test_x.py::test_y - AssertionError: boom"),
        ("command", "ls -la", "exit 0"),
        ("file", "hello.txt", "created"),  # apply_patch through the shell is a file, not a command line
        ("file", "src/app.py", "moved to src/main.py"),
        ("file", "old.py", "deleted"),
        ("file", "docs/new.md", "created"),
        ("file", "src/main.py", "edited"),  # moved in, then edited: one line, the last action
        ("command", "make test", "exit 2: x.c:3: error: expected ';'"),
        ("command", "git status --short", ""),  # no result yet
    ]


def test_a_patch_whose_run_failed_changed_nothing() -> None:
    messages = [fc("p1", "shell", {"command": ["bash", "-lc", "apply_patch <<'EOF'\n*** Begin Patch\n"
                                               "*** Update File: a.py\n@@\n-x\n+y\n*** End Patch\nEOF"]}),
                out("p1", "Exit code: 1\nWall time: 0 seconds\nOutput:\nerror: Failed to find expected lines in a.py")]
    assert collect(RESPONSES, messages, 0, 2) == []


# opencode and Gemini CLI (Chat Completions): tool_calls on the assistant message, role "tool" results.
def chat_call(*calls: tuple[str, str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": n, "arguments": a if isinstance(a, str)
                                                   else orjson.dumps(a).decode()}} for i, n, a in calls]}


def chat_result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


GEMINI_FAILED = ("Command: npm test\nDirectory: (root)\nOutput: FAIL src/a.test.ts\nError: expect(received).toBe(2)\n"
                 "Error: (none)\nExit Code: 1\nSignal: (none)\nBackground PIDs: (none)\nProcess Group PGID: 4242")


def test_opencode_and_gemini_cli_tools() -> None:
    messages = [
        {"role": "system", "content": "you are opencode"},
        {"role": "user", "content": "add a test"},
        chat_call(("o1", "write", {"filePath": "/r/a.test.ts", "content": "test()"}),
                  ("o2", "edit", {"filePath": "/r/a.ts", "oldString": "1", "newString": "2"}),
                  ("o3", "bash", {"command": "bun test", "description": "Runs the tests"}),
                  ("o4", "read", {"filePath": "/r/a.ts"}), ("o5", "glob", {"pattern": "*.ts", "path": "/r"})),
        chat_result("o1", "Wrote file successfully."), chat_result("o2", "Edit applied successfully."),
        chat_result("o3", "error: 1 test failed"),  # opencode states no exit status: none is guessed
        chat_result("o4", "1\tx"), chat_result("o5", "/r/a.ts"),
        chat_call(("g1", "write_file", {"file_path": "/r/b.ts", "content": "x"}),
                  ("g2", "replace", {"file_path": "/r/a.ts", "old_string": "2", "new_string": "3"}),
                  ("g3", "run_shell_command", {"command": "npm test", "description": "tests"}),
                  ("g4", "run_shell_command", {"command": "npm run lint"})),
        chat_result("g1", "Successfully created and wrote to new file: /r/b.ts."),
        chat_result("g2", "Successfully modified file: /r/a.ts (1 replacements)."),
        chat_result("g3", GEMINI_FAILED),
        chat_result("g4", "Command: npm run lint\nDirectory: (root)\nOutput: ok\nError: (none)\nExit Code: 0\n"
                          "Signal: (none)\nBackground PIDs: (none)\nProcess Group PGID: 4243"),
    ]
    assert trail(collect(CHAT, messages, 0, len(messages), seqs=list(range(100, 100 + len(messages))))) == [
        ("file", "/r/a.test.ts", "written"),
        ("command", "bun test", ""),
        ("file", "/r/b.ts", "written"),
        ("file", "/r/a.ts", "edited"),
        ("command", "npm test", "exit 1: Error: expect(received).toBe(2)"),
        ("command", "npm run lint", "exit 0"),
    ]



def gemini_shell_output(command: str, code: int, output: str = "") -> str:
    """Gemini CLI's ``run_shell_command`` output for ``command`` printing ``output`` and ending with ``code``."""
    return (f"Command: {command}\nDirectory: (root)\nOutput: ran {command}{output}\nError: (none)\n"
            f"Exit Code: {code}\nSignal: (none)\nBackground PIDs: (none)\nProcess Group PGID: 4242")


def gemini_idless_run(rounds: int, padding: str = "") -> list[dict[str, Any]]:
    """A Gemini conversation whose function calls carry no ``id`` (as the Gemini API returns them): each round a
    model turn writing ``src/f{k}.py`` and running ``make t{k}`` (exit ``k % 3``), answered by position;
    ``padding`` is added to the model's words and the command's output."""
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "Build every module."}]}]
    for k in range(rounds):
        contents.append({"role": "model", "parts": [
            {"text": f"Module {k}.{padding}"},
            {"functionCall": {"name": "write_file", "args": {"file_path": f"src/f{k}.py", "content": f"x = {k}"}}},
            {"functionCall": {"name": "run_shell_command", "args": {"command": f"make t{k}"}}}]})
        contents.append({"role": "user", "parts": [
            {"functionResponse": {"name": "write_file",
                                  "response": {"output": f"Successfully created and wrote to new file: src/f{k}.py."}}},
            {"functionResponse": {"name": "run_shell_command",
                                  "response": {"output": gemini_shell_output(f"make t{k}", k % 3, padding)}}}]})
    return contents


def test_gemini_calls_without_ids_each_keep_their_line_and_their_own_exit_status() -> None:
    """Issue 35: id-less Gemini calls are keyed by name and order within their turn (``run_shell_command#1`` in
    every turn): the trail kept the first call of each name and no other. Each call pairs with the response at its
    position in the next turn."""
    messages = gemini_idless_run(4)
    found = collect(GEMINI, messages, 0, len(messages))
    assert sorted(trail(found)) == sorted(
        [("file", f"src/f{k}.py", "written") for k in range(4)]
        + [("command", f"make t{k}", "exit 0" if k % 3 == 0 else f"exit {k % 3}") for k in range(4)])
    assert [(a.name, a.index) for a in found if a.kind == "command"] == [(f"make t{k}", 1 + 2 * k) for k in range(4)]


NO_SPACE = "No space left on device: /w/app.py (ENOSPC)"
BYE = "print('bye')\n"
OUTSIDE = ('Path not in workspace: Attempted path "/etc" resolves outside the allowed workspace directories: /w or '
           "the project temp directory: /tmp/gemini")


def gemini_failures() -> list[dict[str, Any]]:
    """Gemini CLI answering a ``write_file`` that failed and a ``run_shell_command`` whose directory it refused
    with ``{"error": message}`` (its ``createErrorResponse``), beside a write that succeeded."""
    def fc(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"functionCall": {"id": call_id, "name": name, "args": args}}

    def fr(call_id: str, name: str, response: dict[str, str]) -> dict[str, Any]:
        return {"functionResponse": {"id": call_id, "name": name, "response": response}}

    return [{"role": "user", "parts": [{"text": "Ship it."}]},
            {"role": "model", "parts": [fc("g1", "write_file", {"file_path": "/w/app.py", "content": BYE}),
                                        fc("g2", "write_file", {"file_path": "/w/ok.py", "content": "y\n"}),
                                        fc("g3", "run_shell_command", {"command": "ls", "dir_path": "/etc"})]},
            {"role": "user", "parts": [fr("g1", "write_file", {"error": NO_SPACE}),
                                       fr("g2", "write_file", {"output": "Successfully created and wrote to new file: "
                                                                         "/w/ok.py."}),
                                       fr("g3", "run_shell_command", {"error": OUTSIDE})]}]


def test_a_gemini_function_response_holding_an_error_is_a_failed_call() -> None:
    """A write Gemini CLI answered with an ``error`` wrote nothing; a command it answered so ended in that error."""
    messages = gemini_failures()
    assert trail(collect(GEMINI, messages, 0, len(messages))) == [
        ("file", "/w/ok.py", "written"), ("command", "ls", f"error: {clip(OUTSIDE, 160)}")]


CANCELLED = "[Operation Cancelled] User cancelled tool execution."
STOPPED = "Command was cancelled by user before it could complete. Below is the output before it was cancelled:"


def gemini_turn_with_an_image_read() -> list[dict[str, Any]]:
    """One Gemini CLI turn: an image read answered ``{}`` (no text) with the image beside it, a failed write, a
    build cancelled after it ran (its ``error`` beside its ``output``), and a write that succeeded."""
    def fc(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"functionCall": {"id": call_id, "name": name, "args": args}}

    def fr(call_id: str, name: str, response: dict[str, str]) -> dict[str, Any]:
        return {"functionResponse": {"id": call_id, "name": name, "response": response}}

    return [{"role": "user", "parts": [{"text": "Match the mock-up."}]},
            {"role": "model", "parts": [fc("i1", "read_file", {"file_path": "/w/mock.png"}),
                                        fc("i2", "write_file", {"file_path": "/w/app.py", "content": BYE}),
                                        fc("i3", "run_shell_command", {"command": "npm run build"}),
                                        fc("i4", "write_file", {"file_path": "/w/ok.py", "content": "y\n"})]},
            {"role": "user", "parts": [fr("i1", "read_file", {}),
                                       {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
                                       fr("i2", "write_file", {"error": NO_SPACE}),
                                       fr("i3", "run_shell_command", {"output": f"{STOPPED}\nbuilding 41/90",
                                                                      "error": CANCELLED}),
                                       fr("i4", "write_file", {"output": "Successfully overwrote file: /w/ok.py."})]}]


def test_a_gemini_result_that_states_no_text_leaves_the_others_their_own() -> None:
    """An image read answered ``{}`` beside them: the ids and outputs of the turn no longer paired one to one, so
    every result of it was read as answered with nothing stated, the failed write listed as written and the
    cancelled build as ending in nothing. The build's error line is its cancellation, read before its output."""
    messages = gemini_turn_with_an_image_read()
    assert trail(collect(GEMINI, messages, 0, len(messages))) == [
        ("command", "npm run build", f"error: {CANCELLED}"), ("file", "/w/ok.py", "written")]
    found, _ = extract(GEMINI, messages, 0, len(messages))
    assert [(e.text, e.source) for e in found if e.kind == "error"] == [
        (NO_SPACE, f'write_file {{"content":{orjson.dumps(BYE).decode()},"file_path":"/w/app.py"}}'),
        (CANCELLED, "$ npm run build")]
    alone = [messages[0], {"role": "model", "parts": messages[1]["parts"][2:3]},
             {"role": "user", "parts": messages[2]["parts"][3:4]}]
    assert trail(collect(GEMINI, alone, 0, len(alone))) == [("command", "npm run build", f"error: {CANCELLED}")]


@pytest.mark.parametrize(("text", "expected"), [
    ("Permission to use Bash with command rm -rf build has been denied.",
     "refused: Permission to use Bash with command rm -rf build has been denied."),
    ("exec command rejected: dangerous command detected", "refused: exec command rejected: dangerous command detected"),
    ("[Operation Cancelled] Reason: User denied execution.",
     "refused: [Operation Cancelled] Reason: User denied execution."),
    ("The user doesn't want to proceed with this tool use. The tool use was rejected (eg. if it was a file edit, the "
     "new_string was NOT written to the file). To tell you how to proceed, the user said:\nuse pnpm, not npm\n",
     "refused: use pnpm, not npm"),
    ("exec command rejected by user", "error: exec command rejected by user"),  # perhaps after it ran: a failure
])
def test_a_call_its_client_refused_ended_refused_with_the_clients_reason(text: str, expected: str) -> None:
    assert outcome(text, False) == expected
    assert outcome(text, True) == expected


def test_the_trail_lists_a_refused_command_as_refused_and_no_refused_or_declined_write() -> None:
    messages = [chat_call(("r1", "exec_command", {"cmd": "rm -rf build"}),
                          ("r2", "Write", {"file_path": "/r/a.py", "content": "x"}),
                          ("r3", "apply_patch", {"input": "*** Begin Patch\n*** Update File: b.py\n@@\n-x\n+y\n"
                                                          "*** End Patch"})),
                chat_result("r1", "exec command rejected: rm -rf is not allowed here"),
                chat_result("r2", "Permission to use Write has been denied."),
                chat_result("r3", "patch rejected by user")]
    assert trail(collect(CHAT, messages, 0, len(messages))) == [
        ("command", "rm -rf build", "refused: exec command rejected: rm -rf is not allowed here")]


def test_generic_writing_tools_moves_and_deletes_by_name_and_path_argument() -> None:
    messages = [chat_call(("m1", "move_file", {"source": "a.py", "destination": "b.py"}),
                          ("m2", "delete_file", {"path": "c.py"}),
                          ("m3", "create_directory_entry", {"target_file": "d/e.py"}),
                          ("m4", "create_goal", {"objective": "ship"}),  # a writing name but no path: no file
                          ("m5", "write_stdin", {"session_id": 3, "chars": "y\n"}),
                          ("m6", "run", {"cmd": ["git", "commit", "-m", "a b"]}),
                          ("m7", "terminal", {"commands": ["cd /r", "make"]}))]
    assert trail(collect(CHAT, messages, 0, 1)) == [
        ("file", "a.py", "moved to b.py"), ("file", "b.py", "moved from a.py"), ("file", "c.py", "deleted"),
        ("file", "d/e.py", "created"), ("command", "git commit -m 'a b'", ""), ("command", "cd /r; make", "")]


@pytest.mark.parametrize("arguments", ['{"command": "ls', "null", "[1, 2]", '"ls"', "", "{" * 2000, '{"cmd": 3}',
                                       '{"command": []}', '{"file_path": 7}', '{"input": 5}'])
@pytest.mark.parametrize("name", ["bash", "Write", "apply_patch", "shell"])
def test_arguments_that_do_not_parse_are_skipped_never_raise(name: str, arguments: str) -> None:
    messages = [chat_call(("x", name, arguments)), chat_result("x", "Exit code: 0")]
    found = collect(CHAT, messages, 0, 2)
    assert all(a.kind == "file" for a in found) if name == "apply_patch" else found == []


def test_a_patch_tool_with_text_arguments_reads_them_as_the_patch() -> None:
    messages = [chat_call(("x", "apply_patch", "*** Begin Patch\n*** Add File: z.py\n+1\n*** End Patch"))]
    assert trail(collect(CHAT, messages, 0, 1)) == [("file", "z.py", "created")]


def test_only_calls_in_the_range_count_and_their_results_may_come_after_it() -> None:
    messages = [chat_call(("a", "bash", {"command": "one"})), chat_result("a", "Exit code: 0"),
                chat_call(("b", "bash", {"command": "two"})), chat_result("b", "Exit code: 3\nerror: nope")]
    assert trail(collect(CHAT, messages, 2, 3)) == [("command", "two", "exit 3: error: nope")]
    assert trail(collect(CHAT, messages, 0, 1)) == [("command", "one", "exit 0")]


class Window(list[Any]):
    """A conversation that refuses to be read outside ``[low, high)``: collect must cost O(range)."""

    def __init__(self, items: list[Any], low: int, high: int) -> None:
        super().__init__(items)
        self.low, self.high = low, high

    def __getitem__(self, index: Any) -> Any:
        if not self.low <= index < self.high:
            raise AssertionError(f"read item {index} outside [{self.low}, {self.high})")
        return super().__getitem__(index)


def test_collect_reads_only_the_range_and_up_to_the_last_answer() -> None:
    turn = [chat_call(("c", "bash", {"command": "x"})), chat_result("c", "Exit code: 0")]
    messages = Window([{"role": "user", "content": str(i)} for i in range(50)] + turn
                      + [{"role": "user", "content": str(i)} for i in range(50)], 50, 52)
    assert trail(collect(CHAT, messages, 50, 51)) == [("command", "x", "exit 0")]


def test_repeats_keep_one_line_each_with_the_last_outcome_newest_last() -> None:
    messages = [chat_call(("1", "bash", {"command": "pytest"}), ("2", "write", {"filePath": "a"})),
                chat_result("1", "Exit code: 1"), chat_result("2", "ok"),
                chat_call(("3", "edit", {"filePath": "b"})), chat_result("3", "ok"),
                chat_call(("4", "edit", {"filePath": "a"}), ("5", "bash", {"command": "pytest"})),
                chat_result("4", "ok"), chat_result("5", "Exit code: 0")]
    found = collect(CHAT, messages, 0, len(messages), seqs=[7, 8, 9, 10, 11])
    assert [(a.name, a.action, a.index, a.seq) for a in found] == [
        ("b", "edited", 3, 10), ("a", "edited", 5, -1), ("pytest", "exit 0", 5, -1)]
    later = [Artifact("file", "b", "deleted", 9, 40), Artifact("command", "ls", "", 9, 40)]
    assert [(a.name, a.action) for a in merge(found, later)] == [
        ("a", "edited"), ("pytest", "exit 0"), ("b", "deleted"), ("ls", "")]


@pytest.mark.parametrize(("text", "is_error", "expected"), [
    ("Chunk ID: 1\nWall time: 1s\nProcess exited with code 0\nOutput:\nError: x\n", False, "exit 0"),
    ("Chunk ID: 1\nWall time: 1s\nProcess running with session ID 7\nOutput:\nExit code: 1\n", False, ""),
    ("Exit code: 127\nWall time: 0 seconds\nOutput:\nbash: foo: command not found\n", False,
     "exit 127: bash: foo: command not found"),
    ('{"output": "ls: cannot access x: No such file or directory\\n", "metadata": {"exit_code": 2}}', False,
     "exit 2: ls: cannot access x: No such file or directory"),
    ('{"output": "", "metadata": {"exit_code": 5}}', False, "exit 5"),
    ("Exit code 1\nTraceback (most recent call last):\n  File \"t.py\", line 1\n", True,
     "exit 1: Traceback (most recent call last):"),
    ("some output\nmore\n", True, "error: some output"),
    ("<tool_use_error>File has not been read yet.</tool_use_error>", True, "error: File has not been read yet."),
    ("all good\nerror: words in ordinary output\n", False, ""),
    ("", True, "error"),
    ("<tool_use_error>Error: No such tool available: Foo</tool_use_error>", True,
     "error: Error: No such tool available: Foo"),
    ("Command: false\nDirectory: (root)\nOutput: (empty)\nError: (none)\nExit Code: 1\nSignal: (none)", False,
     "exit 1"),
    ('{"not": "codex"}', False, ""),
    ("Command: x\nOutput: " + "y" * 5000 + "\n" + "line\n" * 20 + "Error: (none)\nExit Code: 3\nSignal: (none)", False,
     "exit 3"),
])
def test_exit_status_is_what_the_result_states(text: str, is_error: bool, expected: str) -> None:
    assert outcome(text, is_error) == expected


def test_unified_diffs_name_their_files() -> None:
    diff = ("diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
            "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+n\n--- a/gone.py\n+++ /dev/null\n"
            "diff --git a/p.py b/q.py\nsimilarity index 90%\nrename from p.py\nrename to q.py\n"
            "--- a/p.py\n+++ b/q.py\n")
    assert patch_files(diff) == [("x.py", "edited"), ("new.py", "created"), ("gone.py", "deleted"),
                                 ("p.py", "moved to q.py"), ("q.py", "moved from p.py")]


@pytest.mark.parametrize(("value", "expected"), [
    (["bash", "-lc", "cd /r && pytest -x"], "cd /r && pytest -x"),
    (["/bin/zsh", "-l", "-c", "ls"], "ls"),
    (["git", "commit", "-m", "a b"], "git commit -m 'a b'"),
    ("bash -lc 'echo hi'", "echo hi"),
    ("echo 'unbalanced", "echo 'unbalanced"),
    ("  ", None), ([], None), ([1, 2], None), ({"a": 1}, None),
])
def test_command_lines_join_argv_and_unwrap_the_shell(value: Any, expected: str | None) -> None:
    assert command_text(value) == expected


def names(*commands: str) -> list[str]:
    """The trail's names of shell calls running ``commands``, as the Codex CLI makes them (``shell_command``)."""
    call = chat_call(*((str(n), "shell_command", {"command": c}) for n, c in enumerate(commands)))
    return [a.name for a in collect(CHAT, [call], 0, 1)]


def lines(count: int, text: str = "x = 1") -> str:
    return "".join(f"{text}  # {n}\n" for n in range(count))


@pytest.mark.parametrize(("command", "expected"), [
    ("cat > app/main.py <<'EOF'\n" + lines(42) + "EOF", "cat > app/main.py <<'EOF' …(42 lines)… EOF"),
    ("cat <<EOF > .env && chmod 600 .env\n" + lines(30, "KEY=value") + "EOF\necho done",
     "cat <<EOF > .env && chmod 600 .env …(30 lines)… EOF echo done"),
    ("tee web/nginx.conf <<-\"END\" >/dev/null\n" + lines(20, "\tlisten 80;") + "\tEND",
     'tee web/nginx.conf <<-"END" >/dev/null …(20 lines)… END'),
    # PowerShell, as the Codex CLI on Windows writes a file: the target comes after the body.
    ("@'\n" + lines(120, 'APP_NAME = "x"') + "'@ | Set-Content app\\core\\config.py",
     "@' …(120 lines)… '@ | Set-Content app\\core\\config.py"),
    # A script writing two files and then testing them: every body gives way, the one-line one too.
    ("mkdir -p pkg && cat > pkg/a.py <<'EOF'\n" + lines(40) + "EOF\ncat > pkg/b.py <<'EOF'\nb = 2\nEOF\n"
     "python -m pytest -q pkg",
     "mkdir -p pkg && cat > pkg/a.py <<'EOF' …(40 lines)… EOF cat > pkg/b.py <<'EOF' …(1 line)… EOF "
     "python -m pytest -q pkg"),
], ids=["cat > path <<EOF", "cat <<EOF > path", "tee path <<-EOF", "here-string | Set-Content", "two heredocs"])
def test_a_long_command_shows_each_heredoc_body_as_its_line_count_so_what_it_does_survives_the_clip(
        command: str, expected: str) -> None:
    assert names(command) == [expected]
    ran = [chat_call(("1", "shell_command", {"command": command})), chat_result("1", "Exit code: 0")]
    found, _ = extract(CHAT, ran, 0, len(ran))
    assert [e.text for e in found if e.kind == "command"] == [command]  # the literals carry it as it ran


def test_only_a_command_the_clip_would_cut_loses_its_bodies_and_only_those_its_delimiter_closes() -> None:
    long_heredoc = "cat > a.py <<'EOF'\n" + lines(40) + "EOF"
    short_heredoc = "cat > .env <<'EOF'\nPORT=8080\nEOF"
    unterminated = "cat > b.py <<'EOF'\n" + lines(40)
    script = "\n".join(f"echo step {n} >> build.log" for n in range(30))
    assert names(long_heredoc, short_heredoc, unterminated, script, f"{long_heredoc}\n{unterminated}") == [
        "cat > a.py <<'EOF' …(40 lines)… EOF",
        "cat > .env <<'EOF' PORT=8080 EOF",  # it fits: shown whole
        clip(unterminated, NAME_CHARS),  # no delimiter closes it: shown as the clip leaves it
        clip(script, NAME_CHARS),  # no heredoc: clipped and folded to one line
        clip("cat > a.py <<'EOF' …(40 lines)… EOF\n" + unterminated, NAME_CHARS),
    ]
    assert len(names(script)[0]) == NAME_CHARS and names(script)[0].endswith("…")


SAMPLE = (Artifact("file", "src/a.py", "edited", 3, 12), Artifact("command", "pytest -x", "exit 1: boom", 4, -1),
          Artifact("file", "b.py", "moved from a.py", 5, 14), Artifact("command", "ls", "", 6, 15))


def test_render_names_each_line_s_log_entry() -> None:
    assert render(SAMPLE, 1000, COUNTER.text_tokens) == "\n".join([
        ARTIFACTS_HEADING, "Files:", "- src/a.py — edited (log #12)", "- b.py — moved from a.py (log #14)",
        "Commands:", "- $ pytest -x — exit 1: boom (message 4)", "- $ ls (log #15)"])
    assert render((), 1000, COUNTER.text_tokens) == ""


def test_render_within_a_budget_drops_the_oldest_and_says_how_many() -> None:
    many = tuple(Artifact("file", f"src/module_{i}.py", "edited", i, 100 + i) for i in range(200))
    full = render(many, 10**6, COUNTER.text_tokens)
    budget = COUNTER.text_tokens(full) // 3
    text = render(many, budget, COUNTER.text_tokens)
    assert COUNTER.text_tokens(text) <= budget
    lines = text.splitlines()
    dropped = int(lines[1].split()[0].lstrip("("))
    assert lines[:3] == [ARTIFACTS_HEADING, f"({dropped} older entries not shown; the log holds them)", "Files:"]
    assert lines[3:] == [f"- src/module_{i}.py — edited (log #{100 + i})" for i in range(dropped, 200)]
    one_more = [ARTIFACTS_HEADING, f"({dropped - 1} older entries not shown; the log holds them)", "Files:",
                f"- src/module_{dropped - 1}.py — edited (log #{99 + dropped})", *lines[3:]]
    assert COUNTER.text_tokens("\n".join(one_more)) > budget  # the fewest dropped that fit
    assert render(many, 3, COUNTER.text_tokens) == ""


def test_json_round_trip_and_malformed_rows() -> None:
    assert from_json(orjson.loads(orjson.dumps(to_json(SAMPLE)))) == SAMPLE
    assert to_json(SAMPLE)[0] == ["file", "src/a.py", "edited", 3, 12]
    malformed: tuple[Any, ...] = ({}, "[]", [["file", "a", "edited", 1]], [["dir", "a", "", 1, 2]],
                                  [["file", 1, "", 1, 2]], [["file", "a", "", "1", 2]], [["file", "a", "", 1, True]],
                                  ["x"])
    for raw in malformed:
        with pytest.raises(ValueError):
            from_json(raw)
