"""What a tool call is: one answer for the trail, the working set, the literals, the masker and the pins."""

from __future__ import annotations

from proxy.context.keep.toolkinds import is_shell, shell_command, whole_read

CELL = 'const r = await tools.exec_command({cmd: "npm test"});\ntext(r.output);'
PATCH = "*** Begin Patch\n*** Add File: a.py\n+x\n*** End Patch\n"


def test_the_text_editors_command_word_is_no_command_line() -> None:
    view = {"command": "view", "path": "/r/app.py"}
    assert shell_command("str_replace_based_edit_tool", view) is None
    assert not is_shell("str_replace_based_edit_tool", view), "the masker read it as a shell call"
    assert whole_read("str_replace_based_edit_tool", view) == "/r/app.py"
    assert whole_read("str_replace_based_edit_tool", {**view, "view_range": [1, 20]}) is None
    assert shell_command("bash", {"command": "view"}) == "view", "a shell's command may be any word"


def test_a_read_from_the_first_line_is_whole_and_a_bounded_one_is_not() -> None:
    assert whole_read("Read", {"file_path": "AGENTS.md", "offset": 1}) == "AGENTS.md", "the pins' rule said partial"
    assert whole_read("read_file", {"absolute_path": "/w/GEMINI.md", "offset": 0}) == "/w/GEMINI.md"
    assert whole_read("Read", {"file_path": "a.py", "limit": 1}) is None, "the working set's rule said whole"
    assert whole_read("Read", {"file_path": "a.py", "offset": 3}) is None
    assert whole_read("write_file", {"file_path": "a.py", "content": "x"}) is None


def test_a_shell_read_is_whole_by_the_shell_rule() -> None:
    assert whole_read("Bash", {"command": "LC_ALL=C cat AGENTS.md"}) == "AGENTS.md", "the pins' rule said no"
    assert whole_read("shell_command", {"command": "Get-Content -Raw AGENTS.md"}) == "AGENTS.md"
    assert whole_read("Bash", {"command": "cat a.md > b.md"}) is None
    assert whole_read("Bash", {"command": "cat -n a.md"}) is None
    assert whole_read("Bash", {"command": "cat a.md | head"}) is None


def test_a_shell_read_whose_errors_alone_are_redirected_is_whole() -> None:
    """Its output is still the file: the errors went elsewhere. Merged into the output (``2>&1``), or the output
    itself redirected, it is not."""
    for command in ("cat a.md 2>/dev/null", "cat -- a.md 2> /dev/null", "cat a.md 2>>/dev/null"):
        assert whole_read("Bash", {"command": command}) == "a.md", command
    for command in ("Get-Content a.md -ErrorAction SilentlyContinue", "Get-Content -Raw a.md -EA Ignore 2>$null"):
        assert whole_read("shell_command", {"command": command}) == "a.md", command
    for command in ("cat a.md 2>&1", "cat a.md 2 >/dev/null", "cat a.md &>/dev/null", "cat a.md 1>/dev/null",
                    "cat a.md 2>err.log", "cat file2>/dev/null", "Get-Content a.md -TotalCount 3"):
        assert whole_read("Bash", {"command": command}) is None, command


def test_a_shell_call_is_one_to_the_masker_and_the_literals_alike() -> None:
    assert is_shell("shell", {"command": ["apply_patch", PATCH]}), "the literals said no: a patch fed to a shell"
    assert shell_command("shell", {"command": ["apply_patch", PATCH]}) is None, "its files are the trail's"
    assert is_shell("exec", {"input": CELL}), "the masker said no: a code-mode cell that runs a command"
    assert not is_shell("exec", {"input": f"await tools.apply_patch({PATCH!r});"})
    assert is_shell("run_terminal", {"commands": ["ls", "pwd"]}), "the masker said no: a shell's list of commands"
    assert not is_shell("Read", {"file_path": "a.py"})
