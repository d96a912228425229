"""The working set: the exact current text of the files in hand, per agent's tools, and when it is dropped."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import orjson
import pytest

from proxy.context.checkpoint import Checkpoint
from proxy.context.keep.aiderfiles import FILES_PREFIXES
from proxy.context.keep.shellwrites import effect, written
from proxy.context.keep.toolkinds import whole_read
from proxy.context.keep.workingset import (
    MAX_FILES,
    WORKING_SET_HEADING,
    FileText,
    Tracks,
    lost,
    refreshed,
    render,
    track,
    tracked,
    working_set_maker,
)
from proxy.context.view.projection import summary_text
from proxy.dialects.chat import DIALECT as CHAT
from proxy.dialects.gemini import DIALECT as GEMINI

APP = "def main():\n    print('hello')\n\n\nif __name__ == '__main__':\n    main()\n"


class Run:
    """A Chat conversation built call by call: each call answered by its result right after it."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "work on the repo"}]

    def call(self, name: str, arguments: dict[str, Any] | str, result: str) -> Run:
        n = len(self.messages)
        args = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
        self.messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": args}}]})
        self.messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": result})
        return self

    def files(self) -> dict[str, str]:
        return {state.path: state.text for state in track(CHAT, self.messages, len(self.messages))}


def numbered(text: str, arrow: str = "→") -> str:
    """Claude Code's ``Read`` output: every line of ``text.split('\\n')`` numbered, the empty last one too."""
    return "\n".join(f"{n:6}{arrow}{line}" for n, line in enumerate(text.split("\n"), 1))


REMINDER = "\n\n<system-reminder>\nWhenever you read a file, consider whether it is malware.\n</system-reminder>\n"


# -- Claude Code ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arrow", ["→", "\t"])
def test_a_claude_code_read_is_the_file_byte_for_byte(arrow: str) -> None:
    run = Run().call("Read", {"file_path": "/r/app.py"}, numbered(APP, arrow) + REMINDER)
    assert run.files() == {"/r/app.py": APP}


def test_claude_code_edit_multiedit_and_write_apply_to_the_text() -> None:
    run = (Run().call("Read", {"file_path": "/r/app.py"}, numbered(APP))
           .call("Edit", {"file_path": "/r/app.py", "old_string": "'hello'", "new_string": "'bye'"},
                 "The file /r/app.py has been updated.")
           .call("MultiEdit", {"file_path": "/r/app.py", "edits": [
               {"old_string": "def main", "new_string": "def run"},
               {"old_string": "    main()", "new_string": "    run()", "replace_all": True}]}, "Applied 2 edits")
           .call("Write", {"file_path": "/r/new.txt", "content": "one\ntwo"}, "File created successfully"))
    assert run.files() == {"/r/app.py": APP.replace("'hello'", "'bye'").replace("main", "run").replace(
        "'__run__'", "'__main__'"), "/r/new.txt": "one\ntwo"}


def test_a_partial_read_neither_sets_nor_drops_the_text() -> None:
    run = Run().call("Read", {"file_path": "/r/a.py", "offset": 3, "limit": 2}, numbered("x\ny"))
    assert run.files() == {}
    run.call("Write", {"file_path": "/r/a.py", "content": APP}, "ok").call(
        "Read", {"file_path": "/r/a.py", "offset": 2}, "     2→    print('hello')")
    assert run.files() == {"/r/a.py": APP}


def test_a_read_bounded_to_its_first_line_is_no_text() -> None:
    assert Run().call("Read", {"file_path": "/r/app.py", "limit": 1}, numbered("def main():")).files() == {}


def test_the_text_editor_edits_and_creates_the_file_it_names_and_runs_no_command() -> None:
    run = (Run().call("Read", {"file_path": "/r/app.py"}, numbered(APP))
           .call("str_replace_based_edit_tool", {"command": "str_replace", "path": "/r/app.py", "old_str": "'hello'",
                                                 "new_str": "'bye'"}, "The file /r/app.py has been edited.")
           .call("str_replace_based_edit_tool", {"command": "create", "path": "/r/new.py", "file_text": "x = 1\n"},
                 "File created successfully at: /r/new.py"))
    assert run.files() == {"/r/app.py": APP.replace("'hello'", "'bye'"), "/r/new.py": "x = 1\n"}


def test_an_edit_whose_old_text_is_not_there_drops_the_file() -> None:
    run = Run().call("Write", {"file_path": "/r/a.py", "content": APP}, "ok").call(
        "Edit", {"file_path": "/r/a.py", "old_string": "absent", "new_string": "x"}, "updated")
    assert run.files() == {}


def test_an_edit_found_twice_without_replace_all_drops_the_file() -> None:
    run = Run().call("Write", {"file_path": "/r/a.py", "content": "x\nx\n"}, "ok").call(
        "Edit", {"file_path": "/r/a.py", "old_string": "x", "new_string": "y"}, "updated")
    assert run.files() == {}


def test_a_failed_call_drops_what_it_names() -> None:
    run = Run().call("Write", {"file_path": "/r/a.py", "content": APP}, "ok").call(
        "Edit", {"file_path": "/r/a.py", "old_string": "main", "new_string": "x", "replace_all": True},
        "<tool_use_error>File has been modified since read</tool_use_error>")
    assert run.files() == {}


INLINE_WRITE = "python3 -c \"open('/r/a.py', 'w').write('y = 2')\""
#: What each client answers for a command it refused before running it (``proxy.context.keep.refusals``).
NOT_RUN = [
    ("Bash", f"Permission to use Bash with command {INLINE_WRITE} has been denied."),
    ("Bash", "The user doesn't want to proceed with this tool use. The tool use was rejected (eg. if it was a file "
             "edit, the new_string was NOT written to the file). To tell you how to proceed, the user said:\nno"),
    ("Bash", "The user doesn't want to take this action right now. STOP what you are doing and wait for the user "
             "to tell you how to proceed."),
    ("Bash", "Claude requested permissions to use Bash, but you haven't granted it yet."),
    ("shell", "exec command rejected: dangerous command"),
    ("run_shell_command", "[Operation Cancelled] Reason: User denied execution."),
    ("run_shell_command", "[Operation Cancelled] Reason: User did not allow tool call"),
    ("run_shell_command", "Tool execution denied by policy."),
]


@pytest.mark.parametrize(("tool", "answer"), NOT_RUN)
def test_a_command_its_client_refused_to_run_changed_no_file(tool: str, answer: str) -> None:
    run = Run().call("Write", {"file_path": "/r/a.py", "content": APP}, "ok").call(tool, {"command": INLINE_WRITE},
                                                                                  answer)
    assert run.files() == {"/r/a.py": APP}


@pytest.mark.parametrize("answer", [
    # Claude Code's answer for a call the user interrupted while it ran, too.
    "The user doesn't want to proceed with this tool use. The tool use was rejected (eg. if it was a file edit, "
    "the new_string was NOT written to the file). STOP what you are doing and wait for the user to tell you how "
    "to proceed.",
    "exec command rejected by user",  # Codex's after a run in the sandbox, its retry outside declined, too
    "[Operation Cancelled] Reason: Operation cancelled by user",  # Gemini CLI's for executing calls, too
    "[Operation Cancelled] User cancelled tool execution.",
])
def test_a_command_its_client_declined_perhaps_after_it_started_is_a_failure(answer: str) -> None:
    run = Run().call("Write", {"file_path": "/r/a.py", "content": APP}, "ok").call(
        "Bash", {"command": INLINE_WRITE}, answer)
    assert run.files() == {}, "the command may have written it"
    heredoc = Run().call("exec_command", {"cmd": "cat > b.txt <<'EOF'\nb\nEOF"}, answer)
    assert heredoc.files() == {}, "a heredoc declined set the file"


def test_a_codex_patch_the_user_declined_is_not_applied_and_a_refused_write_writes_nothing() -> None:
    run = (Run().call("apply_patch", patch("*** Add File: a.py", "+x = 1"), OK)
           .call("apply_patch", patch("*** Update File: a.py", "@@", "-x = 1", "+x = 2"), "patch rejected by user"))
    assert run.files() == {}, "the declined patch was applied to the text in hand"
    gemini = Run().call("read_file", {"absolute_path": "/w/a.md"}, "# A\n").call(
        "write_file", {"file_path": "/w/a.md", "content": "# B\n"},
        "[Operation Cancelled] Reason: User did not allow tool call")
    assert gemini.files() == {"/w/a.md": "# A\n"}, "the refused write was taken for written"


def test_a_read_that_is_not_numbered_is_no_text_for_claude_codes_read() -> None:
    run = Run().call("Read", {"file_path": "/r/a.py"}, "<tool_use_error>File does not exist.</tool_use_error>")
    assert run.files() == {}


# -- Codex ------------------------------------------------------------------------------------------------------------


def patch(*lines: str) -> dict[str, str]:
    return {"input": "\n".join(["*** Begin Patch", *lines, "*** End Patch"])}


OK = '{"output":"Success. Updated the following files:\\n","metadata":{"exit_code":0,"duration_seconds":0.0}}'


def test_codex_apply_patch_adds_updates_and_deletes() -> None:
    run = (Run().call("apply_patch", patch("*** Add File: src/a.py", "+import os", "+", "+def f():", "+    return 1",
                                           "*** Add File: src/b.py", "+gone"), OK)
           .call("apply_patch", patch("*** Update File: src/a.py", "@@ def f():", "-    return 1", "+    return 2",
                                      "*** Delete File: src/b.py"), OK))
    assert run.files() == {"src/a.py": "import os\n\ndef f():\n    return 2\n"}


def test_codex_patch_by_an_absolute_path_updates_the_file_named_relatively() -> None:
    run = (Run().call("apply_patch", patch("*** Add File: src/a.py", "+x = 1"), OK)
           .call("apply_patch", patch("*** Update File: /home/u/repo/src/a.py", "@@", "-x = 1", "+x = 2"), OK))
    assert run.files() == {"/home/u/repo/src/a.py": "x = 2\n"}


def test_a_codex_move_carries_the_text_to_the_new_path() -> None:
    run = (Run().call("apply_patch", patch("*** Add File: a.py", "+x = 1"), OK)
           .call("apply_patch", patch("*** Update File: a.py", "*** Move to: b.py", "@@", "-x = 1", "+x = 3"), OK))
    assert run.files() == {"b.py": "x = 3\n"}


def test_a_codex_patch_that_failed_or_does_not_apply_drops_its_files() -> None:
    failed = '{"output":"error: Failed to find expected lines","metadata":{"exit_code":1,"duration_seconds":0.0}}'
    run = Run().call("apply_patch", patch("*** Add File: a.py", "+x = 1", "*** Add File: b.py", "+y = 1"), OK)
    run.call("apply_patch", patch("*** Update File: a.py", "@@", "-x = 1", "+x = 2"), failed)
    assert run.files() == {"b.py": "y = 1\n"}
    run.call("apply_patch", patch("*** Update File: b.py", "@@", "-y = 9", "+y = 2"), OK)
    assert run.files() == {}


def test_a_codex_shell_heredoc_writes_and_a_shell_cat_reads() -> None:
    header = "Command: /bin/bash -lc 'cat x'\nChunk ID: 1\nWall time: 0.0 seconds\nProcess exited with code 0\n"
    run = (Run().call("exec_command", {"cmd": "mkdir -p cfg && cat > cfg/a.yml <<'EOF'\nkey: $HOME\nEOF"},
                      header + "Output:\n")
           .call("exec_command", {"cmd": "cat notes.md"}, header + "Output:\n# Notes\n\nsome text\n"))
    assert run.files() == {"cfg/a.yml": "key: $HOME\n", "notes.md": "# Notes\n\nsome text\n"}


def test_a_codex_cat_of_a_file_without_a_final_newline_reads_it_and_a_trimmed_shell_output_does_not() -> None:
    """Codex passes a command's output on to its last byte; Claude Code's ``Bash`` trims trailing newlines, so an
    output of its that does not end with one may be a file that did."""
    header = "Chunk ID: 1\nWall time: 0.0 seconds\nProcess exited with code 0\nOriginal token count: 3\nOutput:\n"
    run = Run().call("exec_command", {"cmd": "cat a.conf"}, header + "port = 1\nhost = x")
    assert run.files() == {"a.conf": "port = 1\nhost = x"}
    assert Run().call("Bash", {"command": "cat a.conf"}, "port = 1\nhost = x").files() == {}


def test_a_shell_cat_whose_errors_go_to_dev_null_reads_the_file_and_one_that_merges_them_does_not() -> None:
    header = "Chunk ID: 1\nWall time: 0.0 seconds\nProcess exited with code 0\nOriginal token count: 3\nOutput:\n"
    run = (Run().call("exec_command", {"cmd": "cat a.conf 2>/dev/null"}, header + "port = 1\n")
           .call("Bash", {"command": "cat -- b.conf 2> /dev/null"}, "host = x\n")
           .call("Bash", {"command": "cat c.conf 2>&1"}, "cat: c.conf: Permission denied\n"))
    assert run.files() == {"a.conf": "port = 1\n", "b.conf": "host = x\n"}


def test_a_bounded_read_that_stops_before_its_bound_is_the_whole_file_and_one_that_reaches_it_is_not() -> None:
    """Codex reads files with ``sed -n '1,200p' PATH``: an output of fewer lines than the bound ended at the file's
    end, so it is the file; one of as many lines may be its first part only, and a range from a later line is a
    part."""
    header = "Chunk ID: 1\nWall time: 0.0 seconds\nProcess exited with code 0\nOriginal token count: 3\nOutput:\n"
    three = "package a\n\nfunc A() {}\n"
    run = (Run().call("exec_command", {"cmd": "sed -n '1,200p' a.go"}, header + three)
           .call("exec_command", {"cmd": "sed -n '1,3p' b.go"}, header + three)
           .call("exec_command", {"cmd": "sed -n '2,200p' c.go"}, header + three)
           .call("exec_command", {"cmd": "head -n 4 d.go"}, header + "package d")
           .call("Bash", {"command": "head -40 e.go"}, three)
           .call("exec_command", {"cmd": "sed -n '1,200p' f.go g.go"}, header + three + three))
    assert run.files() == {"a.go": three, "d.go": "package d", "e.go": three}
    for command in ("sed -n '1,200p' a.go | cat", "sed -n '1,0p' a.go", "head -n 5 -q a.go b.go", "sed -n 1,9p -",
                    "sed -n '1,9{p}' a.go"):
        done = effect(command)
        assert (done.read, done.read_lines) == (None, None), command


def test_a_bounded_read_is_no_whole_read_of_an_instruction_file_to_pin() -> None:
    """``whole_read`` (the pins' reader) cannot see the output, so a bounded read is not one: it may be a part."""
    assert whole_read("exec_command", {"cmd": "sed -n '1,200p' AGENTS.md"}) is None
    assert whole_read("exec_command", {"cmd": "cat AGENTS.md"}) == "AGENTS.md"


# -- Gemini CLI and opencode ------------------------------------------------------------------------------------------


def test_gemini_cli_read_file_write_file_and_replace() -> None:
    run = (Run().call("read_file", {"file_path": "src/a.ts"}, "export const a = 1;\nexport const b = 1;\n")
           .call("replace", {"file_path": "src/a.ts", "old_string": "= 1", "new_string": "= 2",
                             "expected_replacements": 2}, "Successfully modified file")
           .call("write_file", {"file_path": "src/c.ts", "content": "export {};\n"}, "null"))
    assert run.files() == {"src/a.ts": "export const a = 2;\nexport const b = 2;\n", "src/c.ts": "export {};\n"}


# -- aider ------------------------------------------------------------------------------------------------------------

AIDER_PREFIX = ("I have *added these files to the chat* so you can go ahead and edit them.\n\n"
                "*Trust this message as the true contents of these files!*\n"
                "Any other messages in the chat may contain outdated versions of the files' contents.\n")
README = "# Notes\n\n```\nmake test\n```\n"


def aider_files(files: dict[str, str], fence: str = "```") -> list[dict[str, Any]]:
    """aider 0.86.2's files message (``Coder.get_chat_files_messages``): each file as path, fence, text, fence."""
    body = "".join(f"\n{path}\n{fence}\n{text}{fence}\n" for path, text in files.items())
    return [{"role": "user", "content": AIDER_PREFIX + body},
            {"role": "assistant", "content": "Ok, any changes I propose will be to those files."}]


def test_aiders_files_message_is_a_whole_read_of_each_file_and_the_newest_one_is_current() -> None:
    """A text holding ``` takes aider's four-backtick fence; a file without a final newline ends at the fence; the
    files are ranked by the assistant's SEARCH/REPLACE blocks, not by the message's (a set's) order."""
    run = Run()
    run.messages += aider_files({"app.py": APP, "README.md": README}, "````")
    run.messages.append({"role": "user", "content": "add a test target"})
    assert run.files() == {"app.py": APP, "README.md": README}
    edited = README + "```\nmake lint\n```"
    run.messages.append({"role": "assistant", "content": "README.md\n````markdown\n<<<<<<< SEARCH\n=======\n```\n"
                                                         "make lint\n```\n>>>>>>> REPLACE\n````\n"})
    run.messages.append({"role": "user", "content": "I updated the files."})
    run.messages += aider_files({"README.md": edited, "app.py": APP}, "````")
    run.messages.append({"role": "user", "content": "next"})
    assert run.files() == {"app.py": APP, "README.md": edited}
    rows, text = working_set_maker(CHAT, 1000, words)(run.messages, len(run.messages) - 1, 0, [])
    assert [row[0] for row in rows] == ["README.md", "app.py"], "the file the assistant edited last first"
    assert f"\n{edited}\n" in text and APP in text


@pytest.mark.parametrize("prefix", FILES_PREFIXES, ids=["edit formats", "ask and architect", "context"])
def test_aiders_files_message_is_read_in_every_chat_mode(prefix: str) -> None:
    """ask, architect and context mode word the files message otherwise (their own ``files_content_prefix``)."""
    run = Run()
    run.messages += aider_files({"app.py": APP, "README.md": README}, "````")
    run.messages[-2]["content"] = prefix + run.messages[-2]["content"].removeprefix(AIDER_PREFIX)
    assert run.files() == {"app.py": APP, "README.md": README}


@pytest.mark.parametrize("answer", [
    "Here is the new file:\n\n**README.md**\n````\n# Notes\n````\n",  # whole: the name before the listing
    "```diff\n--- README.md\n+++ README.md\n@@ ... @@\n-# Notes\n+# Notes, more\n```\n",  # udiff
    "*** Begin Patch\n*** Update File: README.md\n@@\n-# Notes\n+# Notes, more\n*** End Patch\n",  # patch
], ids=["whole", "udiff", "patch"])
def test_the_file_aider_edited_last_in_any_edit_format_is_ranked_first(answer: str) -> None:
    run = Run()
    run.messages += aider_files({"README.md": README, "app.py": APP}, "````")
    run.messages.append({"role": "user", "content": "shorten the notes"})
    run.messages.append({"role": "assistant", "content": answer})
    run.messages.append({"role": "user", "content": "I updated the files."})
    run.messages += aider_files({"README.md": README, "app.py": APP}, "````")  # a set's order: README.md first
    run.messages.append({"role": "user", "content": "next"})
    rows, _ = working_set_maker(CHAT, 1000, words)(run.messages, len(run.messages) - 1, 0, [])
    assert [row[0] for row in rows] == ["README.md", "app.py"], "the file the answer edited first"


def test_a_message_that_only_quotes_aiders_prefix_shows_no_file() -> None:
    """Nor one whose fence starts a line of a file (aider falls back to ``` where no fence fits)."""
    quoted = Run()
    quoted.messages.append({"role": "user", "content": "Why does it say: " + AIDER_PREFIX + "\napp.py\n```\nx\n```\n"})
    partial = Run()
    partial.messages.append({"role": "user", "content": AIDER_PREFIX.splitlines()[0] + "\n\napp.py\n```\nx\n```\n"})
    trailing = Run()
    trailing.messages += aider_files({"app.py": APP})
    trailing.messages[-2]["content"] += "and more words\n"
    fallback = Run()
    fallback.messages += aider_files({"README.md": README, "app.py": APP})
    assert quoted.files() == partial.files() == trailing.files() == fallback.files() == {}, "aider found no fence"


def test_a_gemini_truncated_read_or_a_wrong_replacement_count_is_no_text() -> None:
    truncated = "IMPORTANT: The file content has been truncated.\nStatus: Showing lines 1-2 of 900 total lines.\n"
    run = Run().call("read_file", {"file_path": "big.ts"}, truncated + "a\nb\n")
    run.call("write_file", {"file_path": "s.ts", "content": "x x"}, "null").call(
        "replace", {"file_path": "s.ts", "old_string": "x", "new_string": "y"}, "Successfully modified file")
    assert run.files() == {}


def test_a_gemini_write_answered_with_an_error_drops_the_file_and_a_refused_one_keeps_it() -> None:
    """Gemini CLI answers a failed call with ``{"error": message}``: a write whose error does not open with "error"
    was taken for written, the file's text then one the disk never held."""
    def attempt(response: dict[str, str]) -> dict[str, str]:
        contents = [
            {"role": "user", "parts": [{"text": "Change the greeting."}]},
            {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"file_path": "/w/app.py"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": APP}}}]},
            {"role": "model", "parts": [{"functionCall": {"name": "write_file", "args": {
                "file_path": "/w/app.py", "content": "x = 2\n"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "write_file", "response": response}}]}]
        return {state.path: state.text for state in track(GEMINI, contents, len(contents))}

    assert attempt({"output": "Successfully overwrote file: /w/app.py."}) == {"/w/app.py": "x = 2\n"}
    assert attempt({"error": "No space left on device: /w/app.py (ENOSPC)"}) == {}, "a failed write was taken"
    assert attempt({"error": "Target is a directory, not a file: /w/app.py (EISDIR)"}) == {}
    assert attempt({"error": "[Operation Cancelled] Reason: User denied execution."}) == {"/w/app.py": APP}


def test_a_gemini_write_beside_a_read_answered_with_no_text_is_its_own_result() -> None:
    """A read of an image Gemini CLI answered ``{}`` (its content held no text) in the same turn as a write: the
    ids and outputs of the turn no longer paired one to one and the write's failure was lost with them, its text
    then taken for the file's; a write cancelled after it ran (``error`` beside ``output``) wrote nothing known."""
    def attempt(response: dict[str, str]) -> dict[str, str]:
        contents = [
            {"role": "user", "parts": [{"text": "Match the mock-up."}]},
            {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"file_path": "/w/app.py"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": APP}}}]},
            {"role": "model", "parts": [
                {"functionCall": {"name": "read_file", "args": {"file_path": "/w/mock.png"}}},
                {"functionCall": {"name": "write_file", "args": {"file_path": "/w/app.py", "content": "x = 2\n"}}}]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "read_file", "response": {}}},
                {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
                {"functionResponse": {"name": "write_file", "response": response}}]}]
        return {state.path: state.text for state in track(GEMINI, contents, len(contents))}

    assert attempt({"output": "Successfully overwrote file: /w/app.py."}) == {"/w/app.py": "x = 2\n"}
    assert attempt({"error": "No space left on device: /w/app.py (ENOSPC)"}) == {}, "a failed write was taken"
    assert attempt({"output": "Successfully overwrote file: /w/app.py.",
                    "error": "[Operation Cancelled] User cancelled tool execution."}) == {}


def test_opencode_write_and_edit_apply_but_its_numbered_read_is_not_taken() -> None:
    run = (Run().call("write", {"filePath": "/p/a.go", "content": "package a\n"}, "Wrote file successfully.")
           .call("edit", {"filePath": "/p/a.go", "oldString": "package a", "newString": "package b"}, "Edit applied")
           .call("read", {"filePath": "/p/z.go"}, "<file>\n00001| package z\n\n(End of file - total 1 lines)\n</file>"))
    assert run.files() == {"/p/a.go": "package b\n"}


# -- shell commands ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "left"), [
    ("sed -i 's/hello/bye/' /r/app.py", {"/r/b.py"}),
    ("mv /r/app.py /r/old.py", {"/r/b.py"}),
    ("mkdir -p /w/r && cp /r/*.py /w/r/", {"/r/app.py", "/r/b.py"}),  # a copy reads its sources, globs too
    ("cp /r/b.py /r/app.py", {"/r/b.py"}),
    ("cp -t /r /tmp/app.py", set()),
    ("cp /tmp/*.py /r/*.py", set()),
    ("rm -rf /r", set()),
    ("git checkout -- .", set()),
    ("python3 -c \"open('x', 'w').write('y')\"", set()),
    ("echo hi > /r/b.py", {"/r/app.py"}),
    ("cd /r && npm install left-pad", {"/r/app.py", "/r/b.py"}),
    ("pytest -q /r/app.py 2>&1 | tail -3", {"/r/app.py", "/r/b.py"}),
    ("redis-cli FLUSHDB && python -m pytest /r/app.py -v", {"/r/app.py", "/r/b.py"}),
    ("npx jest /r/app.py /r/b.py", {"/r/app.py", "/r/b.py"}),
    ("python3 -m mytool /r/app.py", {"/r/b.py"}),
    ("python3 /r/app.py", {"/r/app.py", "/r/b.py"}),
    ("cd /r && rg main && git status && sed -n 1,5p app.py", {"/r/app.py", "/r/b.py"}),
    ("echo 'unterminated", set()),
    ("# start the server\nnode main.js > /r/b.py 2>&1 &", {"/r/app.py"}),  # a comment ends at its line
    ("# clean up first\nrm /r/b.py", {"/r/app.py"}),  # it swallowed the lines after it
    ("ls # the tree\nrm /r/b.py", {"/r/app.py"}),
])
def test_a_shell_command_drops_what_it_may_have_changed(command: str, left: set[str]) -> None:
    run = Run().call("Write", {"file_path": "/r/app.py", "content": APP}, "ok").call(
        "Write", {"file_path": "/r/b.py", "content": "b = 1\n"}, "ok").call("Bash", {"command": command}, "")
    assert set(run.files()) == left


@pytest.mark.parametrize(("command", "files"), [
    ("echo hi>out.txt", ["out.txt"]),  # the literals' reader wanted a space before the ``>``
    ('echo "a > b" && git commit -m "x > y"', []),  # quoted: text; the literals' reader took b and y
    ("cat <<'EOF' > notes.md\n# a > b\nEOF", ["notes.md"]),  # the literals' reader stopped at the heredoc
    ("tee -a a.log b.log < in.txt", ["a.log", "b.log"]),  # the literals' reader took the first only
    ("python3 - <<'EOF'\nif a > b: print(a)\nEOF", []),  # a heredoc's body is text; the working set's took b:
    ("@'\nx = 1 > 0\n'@ | Set-Content -Path app\\api\\router.py", ["app\\api\\router.py"]),
    # A here-string where an expression goes: its body is text too (it gave x, y and b as written).
    ('$page = @"\n<p>x</p>\n<div>y</div>\n"@\nSet-Content index.html $page', ["index.html"]),
    ('Set-Content -Path a.txt -Value @"\nline > b\n"@', ["a.txt"]),
    ("echo 'user@'\necho hi > out.txt", ["out.txt"]),  # a bash line ending in @' that nothing closes
    ("make 2>/dev/null >&2 > $OUT", []),
])
def test_one_reader_says_which_files_a_shell_command_writes(command: str, files: list[str]) -> None:
    done = effect(command)
    assert written(command) == files
    assert [*(path for path, _ in done.writes), *done.changed] == files, "the working set reads them alike"


def test_a_powershell_write_drops_the_file_by_its_windows_path() -> None:
    run = Run().call("write_file", {"file_path": "app\\api\\router.py", "content": "x = 1\n"}, "ok").call(
        "shell_command", {"command": "@'\nx = 2\n'@ | Set-Content app\\api\\router.py"}, "")
    assert run.files() == {}, "the POSIX reader took app\\api\\router.py for appapirouter.py"


def test_a_tool_that_runs_code_it_does_not_show_drops_everything_but_a_poll_does_not() -> None:
    run = Run().call("Write", {"file_path": "/r/a.py", "content": APP}, "ok")
    run.call("write_stdin", {"session_id": 7, "chars": ""}, "still running")
    run.call("write_stdin", {"session_id": 7, "chars": "\u0003"}, "^C")
    assert set(run.files()) == {"/r/a.py"}, "a poll, or Ctrl-C alone, runs nothing"
    run.call("write_stdin", {"session_id": 7, "chars": "y\n"}, "ok")
    assert run.files() == {}
    run.call("Write", {"file_path": "/r/a.py", "content": APP}, "ok")
    run.call("exec", {"input": "for (const c of ['make', 'make install']) await tools.exec_command({cmd: c})"},
             "Script completed\nOutput:\n")
    assert run.files() == {}, "a code-mode cell that is more than a sequence of tool calls"


CELL_DONE = [{"type": "text", "text": "Script completed\nWall time 0.1 seconds\nOutput:\n"},
             {"type": "text", "text": "{}"}]


def cell(*statements: str) -> dict[str, str]:
    return {"input": "\n".join(statements) + "\n"}


def test_a_codex_code_mode_cell_is_read_as_the_tool_calls_it_makes() -> None:
    add = orjson.dumps("*** Begin Patch\n*** Add File: src/a.ts\n+export const a = 1;\n*** End Patch").decode()
    update = orjson.dumps("*** Begin Patch\n*** Update File: src/a.ts\n@@\n-export const a = 1;\n"
                          "+export const a = 2;\n*** End Patch").decode()
    heredoc = orjson.dumps("cat > cfg.yml <<'EOF'\nkey: 1\nEOF").decode()
    run = Run().call("exec", cell(f"const patch = {add};", "text(await tools.apply_patch(patch));"), CELL_DONE)
    run.call("exec", cell(f'const r = await tools.exec_command({{cmd:{heredoc},"workdir":"/w","yield_time_ms":1000}});'
                          " text(r.output); if(r.session_id) text(`SESSION_ID=${r.session_id}`);"), CELL_DONE)
    assert run.files() == {"src/a.ts": "export const a = 1;\n", "cfg.yml": "key: 1\n"}
    run.call("exec", cell(f"text(await tools.apply_patch({update}));"), CELL_DONE)
    assert run.files()["src/a.ts"] == "export const a = 2;\n"
    failed = [{"type": "text", "text": "Script failed\nOutput:\n"},
              {"type": "text", "text": "Script error: apply_patch verification failed"}]
    run.call("exec", cell(f"text(await tools.apply_patch({update}));"), failed)
    assert run.files() == {"cfg.yml": "key: 1\n"}, "a failed cell's patch leaves its file unknown"
    run.call("exec", cell(f"const r = await tools.exec_command({{cmd:{heredoc}}}); text(r.output);"),
             "Script running with cell ID 3\nWall time 10.0 seconds\nOutput:\n")
    assert run.files() == {}, "a cell still running: what its command writes is not known yet"


def test_a_heredoc_that_expands_is_no_exact_text() -> None:
    assert effect("cat > a.sh <<EOF\necho $HOME\nEOF").writes == [("a.sh", None)]
    assert effect("cat > a.sh <<EOF\necho home\nEOF").writes == [("a.sh", "echo home\n")]


# -- the section in the summary item ----------------------------------------------------------------------------------


def state(path: str, text: str, index: int, region: tuple[int, int] = (1, 1)) -> FileText:
    return FileText(path, text, index, 100 + index, index, True, region)


def words(text: str) -> int:
    return len(text.split())


def test_only_files_whose_text_left_the_view_are_carried_newest_first() -> None:
    files = [state("a", "a\n", 1), state("b", "b\n", 5), state("c", "c\n", 9)]
    assert [f.path for f in lost(files, 6, 0)] == ["b", "a"]
    read = FileText("d", "d\n", 7, 107, 7, False, (1, 1))
    assert [f.path for f in lost([*files, read], 6, 8)] == ["d", "b", "a"], "a read whose output is masked is lost"


def test_the_section_labels_each_file_with_its_entry_and_holds_it_exactly() -> None:
    rows, text = render([state("/r/app.py", APP, 4), state("/r/b.md", "```\ncode\n```\n", 2)], 500, words)
    assert rows == [["/r/app.py", 104, 4, 1, 6], ["/r/b.md", 102, 2, 1, 3]]
    assert text.startswith(WORKING_SET_HEADING)
    assert f"### /r/app.py (current as of log entry 104)\n```\n{APP}```" in text
    assert "### /r/b.md (current as of log entry 102)\n````\n```\ncode\n```\n````" in text


def test_a_file_without_a_final_newline_is_labelled_so_and_one_with_it_is_not() -> None:
    """The closing fence needs a line of its own: for a text that does not end with a newline, the heading says the
    newline before the fence is not the file's, so the section still gives the file byte for byte."""
    _, text = render([state("/r/a.conf", "port = 1\nhost = x", 3), state("/r/b.conf", "port = 1\n", 2)], 500, words)
    bare = "### /r/a.conf (current as of log entry 103; no newline at end of file)"
    assert f"{bare}\n```\nport = 1\nhost = x\n```" in text
    assert "### /r/b.conf (current as of log entry 102)\n```\nport = 1\n```" in text


def test_files_are_filled_whole_in_order_and_a_large_one_takes_what_is_left() -> None:
    big = "".join(f"line {n}\n" for n in range(1, 121))  # about 250 words whole: four times an equal share of 340
    small = [state(f"/s{n}", f"{n}\n", n) for n in range(4)]
    rows, text = render([state("/big.txt", big, 50), *small], 340, words)
    assert [row[0] for row in rows] == ["/big.txt", "/s0", "/s1", "/s2", "/s3"]
    assert f"/big.txt (current as of log entry 150)\n```\n{big}```" in text, "whole: the others are small"
    rows, text = render([state("/a.txt", big, 60), state("/b.txt", big, 50)], 340, words)
    assert [row[0] for row in rows] == ["/a.txt", "/b.txt"] and rows[0][3:] == [1, 120] and rows[1][3:] != [1, 120]
    assert words(text) <= 340


def test_files_the_agent_wrote_come_before_files_it_only_read() -> None:
    run = (Run().call("Write", {"file_path": "/r/mine.py", "content": APP}, "ok")
           .call("Read", {"file_path": "/r/lib.py"}, numbered("x = 1\n")))
    run.messages.append({"role": "user", "content": "next"})
    rows, _ = working_set_maker(CHAT, 1000, words)(run.messages, len(run.messages) - 1, 0, [])
    assert [row[0] for row in rows] == ["/r/mine.py", "/r/lib.py"], "newer, but only read"


def test_a_codex_update_is_shown_whole_only_where_its_file_was() -> None:
    run = (Run().call("apply_patch", patch("*** Add File: a.py", "+x = 1"), OK)
           .call("apply_patch", patch("*** Update File: a.py", "@@", "-x = 1", "+x = 2"), OK))
    run.messages.append({"role": "user", "content": "next"})
    make = working_set_maker(CHAT, 1000, words)
    assert make(run.messages, 3, 0, [])[0] == (("a.py", -1, 4, 1, 1),), "the hunks in view are not the file"
    assert make(run.messages, 1, 0, []) == ((), "")


def test_a_masking_that_takes_a_read_out_of_view_carries_the_file_and_one_that_does_not_changes_nothing() -> None:
    run = Run().call("Read", {"file_path": "/r/app.py"}, numbered(APP)).call("Bash", {"command": "ls"}, "app.py\n")
    run.messages.append({"role": "user", "content": "next"})
    make = working_set_maker(CHAT, 1000, words)
    seqs = list(range(10, 10 + len(run.messages)))
    unmasked = Checkpoint("", 1, "h", None, 0, 0, "m", 0.0, masked_until=2)
    assert refreshed(unmasked, make, run.messages, seqs) is unmasked, "the read's output (item 2) is in view"
    masked = refreshed(replace(unmasked, masked_until=3), make, run.messages, seqs)
    assert masked.working_set == (("/r/app.py", 12, 2, 1, 6),) and APP in summary_text(masked)
    assert refreshed(masked, make, run.messages, seqs) is masked, "nothing new left the view"
    assert refreshed(masked, None, run.messages, seqs) is masked


def test_at_most_five_files_and_a_large_one_as_its_region_with_line_numbers() -> None:
    big = "".join(f"line {n} of the big file\n" for n in range(1, 401))
    files = [state("/big.txt", big, 50, (200, 201)), *(state(f"/f{n}", f"{n}\n", n) for n in range(8))]
    rows, text = render(files, 600, words)
    assert len(rows) == MAX_FILES
    path, _, _, first, last = rows[0]
    assert path == "/big.txt" and first < 200 and last > 201 and last - first < 400
    assert "   200\tline 200 of the big file\n   201\tline 201 of the big file" in text
    assert f"/big.txt, lines {first}-{last} of 400 with line numbers" in text
    assert words(text) <= 600


def test_the_maker_carries_the_current_text_into_the_checkpoint_and_the_summary_item() -> None:
    run = Run().call("Read", {"file_path": "/r/app.py"}, numbered(APP)).call(
        "Edit", {"file_path": "/r/app.py", "old_string": "'hello'", "new_string": "'bye'"}, "updated")
    run.messages.append({"role": "user", "content": "next"})
    seqs = list(range(10, 10 + len(run.messages)))
    rows, text = working_set_maker(CHAT, 1000, words)(run.messages, len(run.messages) - 1, 0, seqs)
    assert rows == (("/r/app.py", 14, 4, 1, 6),)
    checkpoint = Checkpoint("sum", 5, "abc", None, 0, 0, "m", 0.0, working_set=rows, files=text)
    assert Checkpoint.from_json(checkpoint.to_json()) == checkpoint
    assert APP.replace("'hello'", "'bye'") in summary_text(checkpoint)
    assert "current as of log entry 14" in summary_text(checkpoint)
    assert working_set_maker(CHAT, 1000, words)(run.messages, 1, 0, seqs) == ((), ""), "the read is still in view"


def long_conversation(steps: int) -> list[dict[str, Any]]:
    """Reads, partial and failed reads, writes, edits that apply and that do not, heredocs, shell drops and calls
    made two at a time, over six files, in a fixed pseudo-random order."""
    pick = random.Random(33)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "work on the repo"}]
    for step in range(steps):
        batch = []
        for n in range(pick.choice((1, 1, 2))):
            path, text = f"/r/f{pick.randrange(6)}.py", f"v = {pick.randrange(4)}\n"
            name, args, out = pick.choice([
                ("Read", {"file_path": path}, numbered(text)),
                ("Read", {"file_path": path, "offset": 2}, "     2→x"),
                ("Read", {"file_path": path}, "<tool_use_error>File does not exist.</tool_use_error>"),
                ("Write", {"file_path": path, "content": text}, "ok"),
                ("Edit", {"file_path": path, "old_string": f"= {pick.randrange(4)}", "new_string": "= 9"}, "ok"),
                ("Bash", {"command": f"cat > {path} <<'EOF'\n{text}EOF"}, ""),
                ("Bash", {"command": f"rm {path}"}, ""),
                ("Bash", {"command": f"cat {path}"}, text),
                ("Bash", {"command": "pytest -q"}, "1 passed"),
            ])
            batch.append((name, args, out, f"c{step}_{n}"))
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": orjson.dumps(args).decode()}}
            for name, args, _, call_id in batch]})
        messages += [{"role": "tool", "tool_call_id": call_id, "content": out} for _, _, out, call_id in batch]
        if pick.random() < 0.2:
            messages.append({"role": "user", "content": "go on"})
    return messages


def test_tracking_on_from_the_last_compaction_equals_tracking_the_whole_conversation() -> None:
    messages = long_conversation(150)
    seqs = list(range(5, 5 + len(messages)))
    since = None
    for end in range(1, len(messages) + 1):  # a cut between a call and its result too
        files, since = tracked(CHAT, messages[:end], end, seqs[:end], since)
        assert files == track(CHAT, messages[:end], end, seqs[:end]), end
        assert since is not None and since.end <= end
    assert since is not None and since.end == len(messages) and len(since.files) > 1


def test_a_track_of_another_conversation_or_of_messages_not_logged_is_not_resumed() -> None:
    messages = long_conversation(40)
    files, since = tracked(CHAT, messages, len(messages), list(range(len(messages))))
    assert since is not None
    other = [{"role": "user", "content": "another repo"}, *messages[1:]]
    other_seqs = [0, *range(1000, 1000 + len(other) - 1)]
    assert not since.resumes(other, other_seqs)
    assert tracked(CHAT, other[:3], 3, other_seqs[:3], since)[0] == track(CHAT, other[:3], 3, other_seqs) != files
    assert tracked(CHAT, messages, len(messages), [-1] * len(messages))[1] is None, "no seq names them"


def test_the_maker_carries_its_track_to_the_next_compaction_of_the_same_session_only() -> None:
    messages = long_conversation(30)
    tracks = Tracks(size=1)
    seqs = list(range(len(messages)))
    first = working_set_maker(CHAT, 1000, words, tracks, "s1")(messages, len(messages), 0, seqs)
    assert (held := tracks.get("s1")) is not None and held.end == len(messages)
    longer = long_conversation(45)
    second = working_set_maker(CHAT, 1000, words, tracks, "s1")(longer, len(longer), 0, list(range(len(longer))))
    assert second == working_set_maker(CHAT, 1000, words)(longer, len(longer), 0, list(range(len(longer))))
    assert first != second
    working_set_maker(CHAT, 1000, words, tracks, "s2")(messages, len(messages), 0, seqs)
    assert tracks.get("s1") is None, "the newest sessions' tracks are kept"


def test_a_file_a_heredoc_wrote_and_nothing_changed_is_carried_as_its_command() -> None:
    """The command holds the file's text once: carried in its place, the file and the command the agent ran are
    both in view at the cost of one. An edit since, or a command writing more than the file, shows the text."""
    header = "Chunk ID: 1\nWall time: 0.0 seconds\nProcess exited with code 0\nOutput:\n"
    write = "mkdir -p cfg && cat > cfg/a.yml <<'EOF'\nkey: 1\nname: app\nEOF"
    both = "cat > b.txt <<'EOF'\nb\nEOF\ncat > c.txt <<'EOF'\nc\nEOF"
    run = (Run().call("exec_command", {"cmd": write}, header).call("exec_command", {"cmd": both}, header)
           .call("exec_command", {"cmd": "cat cfg/a.yml"}, header + "key: 1\nname: app\n"))
    run.messages.append({"role": "user", "content": "next"})
    seqs = list(range(10, 10 + len(run.messages)))
    _, text = working_set_maker(CHAT, 1000, words)(run.messages, len(run.messages) - 1, 0, seqs)
    heading = "### cfg/a.yml (current as of log entry 16: the text this command wrote, unchanged since)"
    assert f"{heading}\n```\n{write}\n```" in text, "a whole read showing the same text keeps the command"
    assert "### b.txt (current as of log entry 14)\n```\nb\n```" in text, "one of two files the command wrote"
    run.messages.pop()
    run.call("Edit", {"file_path": "cfg/a.yml", "old_string": "app", "new_string": "api"}, "updated")
    run.messages.append({"role": "user", "content": "next"})
    _, text = working_set_maker(CHAT, 1000, words)(run.messages, len(run.messages) - 1, 0, seqs)
    assert write not in text and "```\nkey: 1\nname: api\n```" in text
