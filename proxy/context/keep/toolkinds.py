"""What a tool call is, by its name and arguments: a shell call (and its command line), a read of a file (whole or
in part), a write; the one place every reader of calls asks.

The artifact trail, the working set, the literals, the masker (its kept error
lines and its instruction files) and the pins each read calls; were each to
tell a shell call or a whole read its own way, a call would be a command to
one and a file to another (Anthropic's text editor says ``view`` or
``str_replace`` in a ``command`` argument: that is no command line). A leaf
module (it asks only the text parsers ``artifactparse``, ``shellwrites`` and
``codexcode``), so that the masker, which the trail imports, can ask it.
"""

from __future__ import annotations

from typing import Any

from proxy.context.keep.artifactparse import command_text, parsed_arguments, patch_in_command
from proxy.context.keep.codexcode import cell_calls, cell_source
from proxy.context.keep.shellwrites import effect

#: Argument names that hold the file a tool reads or writes (Claude Code, Gemini CLI, opencode, Qwen Code, ...).
PATH_KEYS = ("file_path", "filePath", "path", "notebook_path", "filename", "target_file", "absolute_path",
             "source", "source_path", "old_path", "file")
#: Words in a tool's name that say it writes, and the action each states (the first found wins).
WRITE_VERBS = (("delete", "deleted"), ("remove", "deleted"), ("move", "moved"), ("rename", "moved"),
               ("create", "created"), ("write", "written"), ("str_replace", "edited"), ("edit", "edited"),
               ("replace", "edited"), ("insert", "edited"), ("update", "edited"), ("append", "edited"))
SHELL_WORDS = ("shell", "bash", "exec", "command", "terminal")
#: Anthropic's text editor tool says what it does in its ``command`` argument (None: reads only).
EDITOR_COMMANDS: dict[str, str | None] = {"create": "created", "str_replace": "edited", "insert": "edited",
                                          "undo_edit": "edited", "view": None}
#: Readers whose output is the file's text itself (not numbered).
RAW_READERS = frozenset({"read_file", "view_file", "read_text_file", "readfile"})
#: Arguments that say where a read starts: from the first line (0 or 1, as 0- or 1-based tools count) it is whole.
START_KEYS = ("offset", "start_line", "line", "startLine")
#: Arguments that bound a read: any of them makes it partial.
BOUND_KEYS = ("limit", "end_line", "lines", "view_range", "range")


def editor_command(args: dict[str, Any]) -> str | None:
    """The text editor's command word (``view``, ``str_replace``, ...) where ``args`` are its, else None."""
    editor = args.get("command")
    return editor if isinstance(editor, str) and editor in EDITOR_COMMANDS and path_of(args) is not None else None


def path_of(args: dict[str, Any]) -> str | None:
    """The file a call names (the first of ``PATH_KEYS`` it gives)."""
    return next((args[key] for key in PATH_KEYS if isinstance(args.get(key), str) and args[key]), None)


def command_of(lowered: str, args: dict[str, Any]) -> str | None:
    """The command line of a shell call: any tool's ``command``/``cmd`` argument (but the text editor's command
    word), a shell-named tool's ``commands``."""
    if editor_command(args) is not None:
        return None
    for key in ("command", "cmd"):
        if key in args:
            return command_text(args[key])
    value = args.get("commands")
    if value is None or not any(word in lowered for word in SHELL_WORDS):
        return None
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return "; ".join(part.strip() for part in value if part.strip()) or None
    return command_text(value)


def shell_command(name: str, arguments: Any) -> str | None:
    """The command line a shell call runs, exactly as given (``bash -lc`` unwrapped); None for any other call and
    for a patch fed to a shell (its files are the trail's)."""
    args = parsed_arguments(arguments)
    command = command_of(name.lower(), args) if isinstance(args, dict) else None
    return command if command is not None and patch_in_command(command) is None else None


def is_shell(name: str, arguments: Any) -> bool:
    """Whether a call runs a shell, so that its output is a program's (a line saying something was not found is
    the program's business, not the call's failure): a call with a command line (a patch fed to a shell too), or a
    Codex code-mode cell that runs one (``proxy.context.keep.codexcode``)."""
    args = parsed_arguments(arguments)
    if not isinstance(args, dict):
        return False
    if (source := cell_source(name, args)) is not None:
        return any(is_shell(inner, inner_args) for inner, inner_args in cell_calls(source) or ())
    return command_of(name.lower(), args) is not None


def runs_commands(lowered: str) -> bool:
    """Whether a tool named ``lowered`` may run commands (a shell, a terminal, a process's stdin), whether or not
    its call shows them."""
    return any(word in lowered for word in (*SHELL_WORDS, "stdin"))


def writes(lowered: str, args: dict[str, Any]) -> bool:
    """Whether a call to a tool named ``lowered`` (no shell) writes the file it names."""
    editor = editor_command(args)
    if editor is not None:
        return EDITOR_COMMANDS[editor] is not None
    return any(word in lowered for word, _ in WRITE_VERBS)


def reads(lowered: str, args: dict[str, Any]) -> bool:
    """Whether a call to a tool named ``lowered`` (no shell) reads the file it names, whole or in part."""
    if writes(lowered, args):
        return False
    return editor_command(args) == "view" or "read" in lowered or lowered == "view" or lowered in RAW_READERS


def partial(args: dict[str, Any]) -> bool:
    """Whether a read's arguments ask for part of the file: a start past the first line, or any bound."""
    return (any(args.get(key) not in (None, 0, 1, "") for key in START_KEYS)
            or any(args.get(key) not in (None, "") for key in BOUND_KEYS))


def whole_read(name: str, arguments: Any) -> str | None:
    """The file a call reads whole (its path as the call gives it), or None: a read tool with a path and no range,
    or a shell command that only reads one file whole (``cat PATH``, PowerShell's ``Get-Content``: the rule of
    ``proxy.context.keep.shellwrites``)."""
    args = parsed_arguments(arguments)
    if not isinstance(args, dict):
        return None
    lowered = name.lower()
    command = shell_command(lowered, args)
    if command is not None:
        done = effect(command)
        return done.read if done.read_lines is None else None  # a bounded read is whole only by its output
    if command_of(lowered, args) is not None or not reads(lowered, args) or partial(args):
        return None
    return path_of(args)
