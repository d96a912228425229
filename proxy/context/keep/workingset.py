"""The working set: the exact current text of the files the agent has in hand, carried past each compaction.

After a compaction the agent has lost the reads and writes that showed it the
files it was working on, and re-reads them or edits from memory (Claude Code
re-attaches recently read files after its own compaction; when the proxy
compacts, nothing did). The log holds every read, write and edit, so the proxy
knows each file's current text exactly, and knows when it stops knowing:

- a **whole read** sets the text (Claude Code's ``Read``, Gemini CLI's
  ``read_file``, opencode's and Anthropic's editor's reads, a plain shell ``cat
  PATH``, or Codex's ``sed -n '1,Np' PATH`` whose output stopped short of N
  lines; a raw reader's output is the file): ``proxy.context.keep.toolkinds`` says which
  calls read a file whole, ``proxy.context.keep.fileedits.read_text`` which outputs
  show one; aider's files message, every file in its chat whole in a user message,
  is a read of each, ``proxy.context.keep.aiderfiles``). A partial read (offset, limit) neither
  sets nor drops the text: a region could not take a later edit exactly;
- a **write** sets it (``Write``, ``write_file``, opencode's ``write``, Codex's
  ``*** Add File``, a shell heredoc ``cat > PATH <<'EOF'``);
- an **edit** is applied to the known text (``Edit``, ``MultiEdit``, Gemini
  CLI's ``replace``, opencode's ``edit``, ``str_replace``/``insert``, Codex's
  ``apply_patch`` hunks), exactly or not at all: an old text not found (or
  found a number of times the tool would have refused) drops the file;
- a **failed call** (its result says so, its API flags it so:
  ``ItemModel.result_failed``, or its client says it declined it once it may
  have started) drops what it names, a **refused call** (its
  client's answer says it never ran: ``proxy.context.keep.refusals``) changes
  nothing, a deletion
  removes the file, and a **shell command** drops what it may have changed by
  the conservative rule of ``proxy.context.keep.shellwrites`` (anything it does not
  recognise drops every file). A tool that may run commands but whose command
  cannot be read drops every file too; Codex's code mode (``exec`` running a
  JavaScript cell) is read as the tool calls its cell makes
  (``proxy.context.keep.codexcode``), and a cell that does anything else is such a
  tool.

Calls are read through ``ItemModel.calls``/``call_of`` and their results
through ``proxy.context.keep.artifacts`` (the trail's own recognisers), their kind
through ``proxy.context.keep.toolkinds``, so no wire
format is known here. Paths are compared as written, normalised; a path that is
the other's tail at a ``/`` (``src/a.py``, ``/repo/src/a.py``) is taken for the
same file, and where two tracked files could be meant, both are dropped.

The files are tracked from the conversation's start, but not again at each
compaction: the engine keeps each session's last ``Track`` (the state at the
last point where no call waited for its result), and the next compaction reads
on from there when its messages are the same log entries up to it, so its work
grows with what is new, not with the whole conversation.

At each summary, and at each masking that takes a read's output out of the
view (``refreshed``), the compactor asks ``working_set_maker`` for the files
whose whole text the verbatim tail no longer shows (the read or write was
compacted away or masked): the files the agent wrote or edited first, then
those it only read, each newest touch first; at most ``MAX_FILES`` and
``WORKING_SET_SHARE`` of the window (or the cap the summary's room put on
them, ``proxy.context.keep.room``, which a masking keeps), filled in that order with each file whole
where it fits what is left, then the files that did not fit as the region most
recently touched, with line numbers, in what remains. A file a shell heredoc wrote whole,
unchanged since, is shown as that command verbatim: the file's text once, and
the command the agent ran, which the literals then need not carry beside it. Each is labelled with its
path and the log entry it is current as of: the rendering is fixed in the
checkpoint (the summary item stays byte-identical until the next compaction
changes it), and an entry after it that changed the file is in the verbatim
tail, for the model to see.
"""

from __future__ import annotations

import posixpath
import re
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from proxy.context.checkpoint import Checkpoint
from proxy.context.items import ItemModel
from proxy.context.keep.aiderfiles import aider_files, edited
from proxy.context.keep.artifactparse import parsed_arguments, patch_files, patch_in_command
from proxy.context.keep.artifacts import DESTINATION_KEYS, Result, calls_in, failed, patch_of, results_of
from proxy.context.keep.codexcode import cell_calls, cell_source
from proxy.context.keep.fileedits import codex_patch, output_is_whole, read_text, replaced, shell_output
from proxy.context.keep.refusals import refused
from proxy.context.keep.shellwrites import effect
from proxy.context.keep.toolkinds import (
    RAW_READERS,
    WRITE_VERBS,
    command_of,
    editor_command,
    partial,
    path_of,
    reads,
    runs_commands,
    writes,
)
from proxy.types import Message

WORKING_SET_HEADING = "## Files in hand (from ctxproxy's log: exact current text, not model-written)"
WORKING_SET_NOTE = ("Each file below is shown as it stood at the log entry named; a message after that entry in "
                    "this conversation may have changed it since.")
#: What a file's heading adds when its text does not end with a newline (the line before the closing fence ends
#: with one that is not the file's), in the words of ``diff``.
NO_FINAL_NEWLINE = "no newline at end of file"
#: At most this many files, and this share of the window, in a summary item.
MAX_FILES = 5
WORKING_SET_SHARE = 0.15
#: Arguments that say a tool acts on a remote repository, not the disk.
REMOTE_KEYS = ("owner", "repo", "repository", "repo_name")
CONTENT_KEYS = ("content", "file_text", "contents", "text")
EDIT_KEYS = (("old_string", "new_string"), ("oldString", "newString"), ("old_str", "new_str"))
#: Control characters that interrupt, suspend or end a running process (sent to it, they run nothing).
INTERRUPTS = "\x03\x04\x1a\x1c"
#: A heredoc's command is carried in place of the text it wrote when it holds at most this much beside the text
#: (``cat > PATH <<'EOF'``, a ``mkdir -p``): a longer script is more than the file.
COMMAND_EXTRA_CHARS = 300
#: How a Codex code-mode cell's result starts when the cell ran to its end.
CELL_DONE = "Script completed"
#: Conversations whose last track the engine keeps (``Tracks``).
MAX_TRACKS = 256
_ERROR_START = re.compile(r"\s*(?:<tool_use_error>|error\b|failed\b|file not found|no such file)", re.IGNORECASE)


@dataclass(frozen=True)
class FileText:
    """What the proxy knows of one file: its exact ``text`` as of conversation item ``index`` (log ``seq``).

    ``basis`` is the item whose content shows the whole text (a read's
    result, or a write's call when ``in_call``): while it is verbatim in the
    view, the model sees the file and it need not be repeated. ``region``:
    the 1-based first and last line most recently touched. ``written``: the
    agent wrote or edited it in this session (its own work, ranked before
    files it only read). ``command``: the shell command that wrote the whole
    text from a heredoc, while the text is unchanged since (``""`` otherwise).
    """

    path: str
    text: str
    index: int
    seq: int
    basis: int
    in_call: bool
    region: tuple[int, int]
    written: bool = False
    command: str = ""


class _Files:
    """The tracked texts by normalised path, in order of last touch (newest last)."""

    def __init__(self) -> None:
        self.by_path: dict[str, FileText] = {}

    def matches(self, path: str) -> list[str]:
        """Tracked paths that may name the same file as ``path``: itself, or one the other's tail at a ``/``."""
        key = _normal(path)
        if key in self.by_path:
            return [key]
        return [known for known in self.by_path if same_file(known, key)]

    def get(self, path: str) -> FileText | None:
        found = self.matches(path)
        return self.by_path[found[0]] if len(found) == 1 else None

    def drop(self, path: str) -> None:
        for known in self.matches(path):
            del self.by_path[known]

    def drop_under(self, path: str) -> None:
        """Drop ``path`` and, where it is a directory, every tracked file under it."""
        self.drop(path)
        key = _normal(path).lstrip("./") if path not in (".", "./") else ""
        for known in list(self.by_path):
            if not key or known.startswith(key + "/") or f"/{key}/" in known:
                del self.by_path[known]

    def set(self, path: str, state: FileText) -> None:
        self.drop(path)
        self.by_path[_normal(path)] = replace(state, path=path)


def same_file(known: str, key: str) -> bool:
    """Whether two normalised paths may name one file: one is the other's tail at a ``/`` (``src/a.py``,
    ``/repo/src/a.py``), or they are the same."""
    return known == key or known.endswith("/" + key.lstrip("./")) or key.endswith("/" + known.lstrip("./"))


def _normal(path: str) -> str:
    return posixpath.normpath(path.removesuffix(":raw")) if path else path


@dataclass(frozen=True)
class Track:
    """The files known after the calls of ``messages[:end]``, a point where every call made before it was answered
    before it, for the log entries ``seqs`` of those messages: where the next tracking of the same conversation
    resumes (``track``), so that each compaction reads what is new since, not the whole conversation again."""

    end: int
    seqs: tuple[int, ...]
    files: tuple[FileText, ...]

    def resumes(self, messages: Sequence[Message], seqs: Sequence[int]) -> bool:
        """Whether ``messages`` (with ``seqs``) continue the conversation this track read: the same log entries
        (a seq names one entry of one session's log, so the same seqs are the same messages), every one logged."""
        return self.end <= min(len(messages), len(seqs)) and tuple(seqs[:self.end]) == self.seqs


def track(dialect: ItemModel, messages: Sequence[Message], end: int, seqs: Sequence[int] = ()) -> list[FileText]:
    """The files whose text is known exactly after ``messages[:end]``, oldest touch first."""
    return tracked(dialect, messages, end, seqs)[0]


def tracked(dialect: ItemModel, messages: Sequence[Message], end: int, seqs: Sequence[int] = (),
            since: Track | None = None) -> tuple[list[FileText], Track | None]:
    """``track``, from ``since`` on where it ``resumes`` this conversation, and the last point to resume from next
    time (None where the messages are not all logged). A call is applied in call order once its result came before
    ``end``; before a point where no call waits, every earlier call is applied and none later is, so the state
    there is the same whatever comes after."""
    files = _Files()
    begin = 0
    if since is not None and since.end <= end and since.resumes(messages, seqs):
        begin = since.end
        files.by_path = {_normal(state.path): state for state in since.files}
    calls = calls_in(dialect, messages, begin, end)
    results = results_of(dialect, messages, begin, calls)
    quiet = (begin, tuple(files.by_path.values()))
    waits = begin  # every call so far answered before this index
    shown = _files_messages(dialect, messages, begin, end)
    for call, (name, arguments) in [*calls.items(), ((end, ""), ("", None))]:
        index, result = call[0], results.get(call)
        while shown and shown[0][0] < index:
            at, held = shown.pop(0)
            if waits <= at and quiet[0] < at:
                quiet = (at, tuple(files.by_path.values()))
            _shown(files, held, at, seqs[at] if at < len(seqs) else -1)
        if index == end:
            break
        if waits <= index and quiet[0] < index:
            quiet = (index, tuple(files.by_path.values()))
        if result is None or result.index >= end:
            waits = len(messages) + 1
            continue  # not answered yet: whatever it does comes after the state tracked here
        waits = max(waits, result.index + 1)
        seq = seqs[result.index] if result.index < len(seqs) else -1
        _apply(files, name, arguments, result, index, seq)
    if waits <= end:
        quiet = (end, tuple(files.by_path.values()))
    logged = min(len(seqs), end) >= quiet[0] and all(seq >= 0 for seq in seqs[:quiet[0]])
    return list(files.by_path.values()), Track(quiet[0], tuple(seqs[:quiet[0]]), quiet[1]) if logged else None


def _files_messages(dialect: ItemModel, messages: Sequence[Message], begin: int,
                    end: int) -> list[tuple[int, list[tuple[str, str]]]]:
    """The client's messages in ``messages[begin:end]`` that show files whole (aider's files message,
    ``proxy.context.keep.aiderfiles``), each with its index and the (path, text) of each file, those the
    assistant edited last listed last (the files message's own order says nothing)."""
    shown = {index: held for index in range(max(begin, 0), min(end, len(messages)))
             if (text := dialect.user_text(messages[index])) and (held := aider_files(text)) is not None}
    found = []
    last_edit: dict[str, int] = {}
    for index in range(max(begin, 0), max(shown, default=-1) + 1):
        if index in shown:
            found.append((index, sorted(shown[index], key=lambda pair: last_edit.get(pair[0], -1))))
        elif dialect.role(messages[index]) == "assistant":
            last_edit.update(dict.fromkeys(edited(dialect.text(messages[index])[0]), index))
    return found


def _shown(files: _Files, held: list[tuple[str, str]], at: int, seq: int) -> None:
    """A message showing each of ``held`` whole, as a read of each at ``at`` (in order: the last is newest)."""
    for path, text in held:
        files.set(path, replace(_reread(files.get(path), path, text, at, seq), in_call=True))


def _apply(files: _Files, name: str, arguments: Any, result: Result, index: int, seq: int) -> None:
    """One call's effect on the tracked files."""
    args = parsed_arguments(arguments)
    lowered = name.lower()
    if (isinstance(args, dict) and any(key in args for key in REMOTE_KEYS)) or refused(result.text):
        return  # a remote repository's file, or a call its client refused to run: nothing here changed
    if (source := cell_source(lowered, args)) is not None:
        _cell(files, source, result, index, seq)
        return
    at = result.index
    patch = patch_of(args) if "patch" in lowered else None
    command = command_of(lowered, args) if patch is None and isinstance(args, dict) else None
    if command is not None:
        patch = patch_in_command(command)
    if patch is not None:
        _patch(files, patch, result, at, seq)
    elif command is not None:
        _shell(files, command, result, at, seq)
    elif isinstance(args, dict) and (path := path_of(args)) is not None:
        _file_call(files, lowered, args, path, result, index, at, seq)
    elif runs_commands(lowered) and not _only_polls(args):
        files.by_path.clear()  # it may run anything, and does not say what


def _cell(files: _Files, source: str, result: Result, index: int, seq: int) -> None:
    """Codex's code mode: each tool call of the cell applied in turn (``proxy.context.keep.codexcode``); a cell that
    does anything else drops every file. The cell's result holds all its calls' outputs, so each call is applied as
    one that printed nothing (no read is taken from it), and as failed unless the cell completed: a failed or
    still running cell's calls drop what they name."""
    calls = cell_calls(source)
    if calls is None:
        files.by_path.clear()
        return
    done = result.text.startswith(CELL_DONE) and not result.is_error
    inner = Result("" if done else "error: the cell did not complete", not done, result.index)
    for name, arguments in calls:
        _apply(files, name, arguments, inner, index, seq)


def _only_polls(args: Any) -> bool:
    """Whether a call to a running process sends it no command: Codex's ``write_stdin`` with empty ``chars`` only
    reads what the process wrote since, and Ctrl-C, Ctrl-D, Ctrl-Z or Ctrl-\\ alone interrupt or end it."""
    return isinstance(args, dict) and "session_id" in args and not any(
        isinstance(args.get(key), str) and args[key].strip(INTERRUPTS)
        for key in ("chars", "input", "text", "command", "cmd"))


def _is_error(result: Result) -> bool:
    # A call its client declined is a failure already (``artifactparse.outcome``, which ``failed`` reads).
    return result.is_error or failed(result) or _ERROR_START.match(result.text) is not None


def _file_call(files: _Files, lowered: str, args: dict[str, Any], path: str, result: Result, index: int, at: int,
               seq: int) -> None:
    """A tool that names one file: a read, a write, an edit, a deletion or a move."""
    editor = editor_command(args)
    if not writes(lowered, args):
        if reads(lowered, args):
            _read(files, lowered, args, path, result, at, seq)
        return
    if _is_error(result):
        files.drop(path)
        return
    action = next(action for word, action in WRITE_VERBS if word in lowered) if editor is None else "edited"
    content = next((args[key] for key in CONTENT_KEYS if isinstance(args.get(key), str)), None)
    known = files.get(path)
    if action == "deleted":
        files.drop(path)
    elif action == "moved":
        target = next((args[key] for key in DESTINATION_KEYS if isinstance(args.get(key), str) and args[key]), None)
        files.drop(path)
        if target and known is not None:
            files.set(target, replace(known, index=at, seq=seq, command=""))
        elif target:
            files.drop(target)
    elif content is not None and editor in (None, "create"):
        lines = content.count("\n") + 1
        files.set(path, FileText(path, content, at, seq, index, True, (1, lines), written=True))
    elif (edited := _edited(known, args)) is not None:
        text, region = edited
        files.set(path, FileText(path, text, at, seq, known.basis if known else index,
                                 known.in_call if known else True, region, written=True))
    else:
        files.drop(path)


def _edited(known: FileText | None, args: dict[str, Any]) -> tuple[str, tuple[int, int]] | None:
    """The text after an edit call's replacements, and the lines the last one wrote; None if not exactly known."""
    edits = args.get("edits")
    steps = edits if isinstance(edits, list) else [args]
    if known is None and not (len(steps) == 1 and isinstance(steps[0], dict) and (_pair(steps[0]) or "x")[0] == ""):
        return None  # an edit of a file not in hand; an empty old text on one creates it
    text = known.text if known is not None else ""
    region = (1, 1)
    for step in steps:
        if not isinstance(step, dict):
            return None
        if "insert_line" in step and isinstance(step.get("new_str"), str):
            insert = step["insert_line"]
            lines = text.split("\n")
            if not isinstance(insert, int) or not 0 <= insert <= len(lines):
                return None
            new = step["new_str"].split("\n")
            text = "\n".join(lines[:insert] + new + lines[insert:])
            region = (insert + 1, insert + len(new))
            continue
        pair = _pair(step)
        if pair is None:
            return None
        old, new_text = pair
        every = step.get("replace_all") is True or step.get("replaceAll") is True
        expected = step.get("expected_replacements")
        count = None if every else expected if isinstance(expected, int) and expected > 0 else 1
        at = text.find(old) if old else 0
        result = replaced(text, old, new_text, count=count)
        if result is None:
            return None
        first = text.count("\n", 0, at) + 1
        region = (first, first + new_text.count("\n"))
        text = result
    return text, region


def _pair(step: dict[str, Any]) -> tuple[str, str] | None:
    for old_key, new_key in EDIT_KEYS:
        if isinstance(step.get(old_key), str) and isinstance(step.get(new_key), str):
            return step[old_key], step[new_key]
    return None


def _read(files: _Files, lowered: str, args: dict[str, Any], path: str, result: Result, at: int, seq: int) -> None:
    """A read of ``path``: a whole read's output sets the text, a failed read drops it, a partial one is ignored."""
    if _is_error(result):
        files.drop(path)
        return
    if partial(args):
        return
    text = read_text(result.text)
    if text is None or (text == result.text and lowered not in RAW_READERS and not path.endswith(":raw")):
        return  # not numbered, and not a reader whose output is the file itself
    files.set(path.removesuffix(":raw"), _reread(files.get(path.removesuffix(":raw")), path, text, at, seq))


def _patch(files: _Files, patch: str, result: Result, at: int, seq: int) -> None:
    """Codex's patch applied to the known texts; a unified diff (``git apply``) or a failed patch drops its files."""
    if "*** Begin Patch" not in patch or _is_error(result):
        for path, action in patch_files(patch):
            files.drop(path)
            if action.startswith("moved"):
                files.drop(action.split(" ", 2)[-1])
        return
    known = {path: state for path in _patch_paths(patch) if (state := files.get(path)) is not None}
    for patched in codex_patch(patch, {path: state.text for path, state in known.items()}):
        files.drop(patched.path)
        target = patched.moved_to or patched.path
        if patched.moved_to is not None:
            files.drop(target)
        if patched.text is not None:
            # An added file's text is in the patch; an updated one's where it was shown whole (the hunks are not it).
            before = known.get(patched.path) if patched.action == "edited" else None
            files.set(target, FileText(target, patched.text, at, seq, before.basis if before else at,
                                       before.in_call if before else True, patched.region or (1, 1), written=True))


def _patch_paths(patch: str) -> list[str]:
    return [path for path, _ in patch_files(patch)]


def _shell(files: _Files, command: str, result: Result, at: int, seq: int) -> None:
    """A shell command's effect: exact heredoc writes, a whole ``cat`` (or a bounded read that stopped short of its
    bound), and drops by ``shellwrites``' rule."""
    done = effect(command)
    if done.anything:
        files.by_path.clear()
        return
    output = shell_output(result.text)
    failed_run = _is_error(result) or output is None
    for path, text in done.writes:
        if text is None or failed_run:
            files.drop(path)
        else:
            alone = len(done.writes) == 1 and len(command) <= len(text) + COMMAND_EXTRA_CHARS
            files.set(path, FileText(path, text, at, seq, at, True, (1, text.count("\n") + 1), written=True,
                                     command=command if alone else ""))
    for path in done.changed:
        files.drop_under(path)
    for word in done.mentioned:
        files.drop(word)
    if (done.read is not None and done.verbatim and not failed_run and output is not None
            and output_is_whole(result.text, output)
            and (done.read_lines is None or _text_lines(output) < done.read_lines)):
        text = read_text(output)
        if text == output:  # ``cat`` prints the file itself: a numbered output is some other program's
            files.set(done.read, _reread(files.get(done.read), done.read, text, at, seq))


def _text_lines(text: str) -> int:
    """How many lines ``text`` holds (the last one counted whether or not a newline ends it; none in ``""``)."""
    return text.count("\n") + (not text.endswith("\n") and text != "")


def _reread(known: FileText | None, path: str, text: str, at: int, seq: int) -> FileText:
    """The state after a whole read of ``path`` showing ``text``: a file the agent wrote stays its own, and one
    the read shows unchanged stays carried as the command that wrote it."""
    command = known.command if known is not None and known.text == text else ""
    return FileText(path, text, at, seq, at, False, (1, text.count("\n") + 1),
                    written=known is not None and known.written, command=command)


# -- the section in the summary item --------------------------------------------------------------------------------

class WorkingSetMaker(Protocol):
    """The working set for a checkpoint: from the conversation, the split, where masking ends and the log's seqs,
    the rows the checkpoint records (``[path, seq, index, first line, last line]``) and the rendering; ``cap``:
    tokens the section may take at most, below its budget (``proxy.context.keep.room``)."""

    def __call__(self, messages: Sequence[Message], start: int, masked_until: int, seqs: Sequence[int], /,
                 cap: int | None = None) -> tuple[tuple[object, ...], str]: ...


def lost(files: Sequence[FileText], start: int, masked_until: int) -> list[FileText]:
    """The files whose whole text the view no longer shows past a split at ``start`` (outputs masked up to
    ``masked_until``), newest touch first."""
    return [state for state in reversed(files)
            if not (state.basis >= start and (state.in_call or state.basis >= masked_until))]


def _where(state: FileText) -> str:
    return f"log entry {state.seq}" if state.seq >= 0 else f"message {state.index}"


def _fence(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _whole(state: FileText) -> str:
    """The file between fences, byte for byte: the closing fence needs a line of its own, so a text without a
    final newline gets one there and the heading says it is not the file's (Claude Code's ``Read`` of such a file
    numbers no empty last line; an ``Edit`` whose old text ends at the file's end must not be given one). A file a
    heredoc wrote, unchanged since, is its command verbatim: the text once, and the command the agent ran with it
    (the literals need not carry that command beside it, ``proxy.context.keep.literals``)."""
    if state.command:
        fence = _fence(state.command)
        return (f"### {state.path} (current as of {_where(state)}: the text this command wrote, unchanged since)\n"
                f"{fence}\n{state.command}\n{fence}")
    fence = _fence(state.text)
    if state.text.endswith("\n") or not state.text:
        return f"### {state.path} (current as of {_where(state)})\n{fence}\n{state.text}{fence}"
    return f"### {state.path} (current as of {_where(state)}; {NO_FINAL_NEWLINE})\n{fence}\n{state.text}\n{fence}"


def _part(state: FileText, first: int, last: int) -> str:
    lines = state.text.split("\n")
    if lines and lines[-1] == "" and len(lines) > 1:
        lines.pop()
    body = "\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(first, last + 1))
    fence = _fence(body)
    return (f"### {state.path}, lines {first}-{last} of {len(lines)} with line numbers (the part most recently "
            f"touched; current as of {_where(state)})\n{fence}\n{body}\n{fence}")


def _lines(state: FileText) -> int:
    return max(1, _text_lines(state.text))


def _region(state: FileText, share: int, count: Callable[[str], int]) -> tuple[str, tuple[int, int]] | None:
    """The largest region around the lines last touched that fits ``share`` tokens, with line numbers."""
    total = _lines(state)
    first, last = (max(1, min(state.region[0], total)), max(1, min(state.region[1], total)))

    def around(size: int) -> tuple[int, int]:
        middle = (first + last) // 2
        low = max(1, min(middle - size // 2, total - size + 1))
        return low, min(total, low + size - 1)

    low, high, best = 1, total, None
    while low <= high:
        size = (low + high) // 2
        region = around(size)
        if count(text := _part(state, *region)) <= share:
            best, low = (text, region), size + 1
        else:
            high = size - 1
    return best


def ranked(files: Sequence[FileText]) -> list[FileText]:
    """``files`` (newest touch first) with the ones the agent wrote or edited before those it only read: its own
    work is what it cannot get back by reading the disk again."""
    return sorted(files, key=lambda state: not state.written)


def render(files: Sequence[FileText], budget: int, count: Callable[[str], int]) -> tuple[list[list[Any]], str]:
    """The section for the first ``MAX_FILES`` of ``files`` within ``budget`` tokens: each file whole where it fits
    what the files before it left (in order), then the ones that did not fit as their region most recently
    touched, in what is left; the rows say what each shows. Filled greedily rather than in equal shares: a file
    of twice its share is still shown whole when the others are small."""
    chosen = list(files[:MAX_FILES])
    if not chosen:
        return [], ""
    head = f"{WORKING_SET_HEADING}\n{WORKING_SET_NOTE}"
    left = budget - count(head)
    shown: dict[int, tuple[str, tuple[int, int]]] = {}
    for n, state in enumerate(chosen):
        whole = _whole(state)
        if (cost := count(whole)) <= left:
            shown[n] = whole, (1, _lines(state))
            left -= cost
    for n, state in enumerate(chosen):
        if n not in shown and left > 0 and (part := _region(state, left, count)) is not None:
            shown[n] = part
            left -= count(part[0])
    rows = [[chosen[n].path, chosen[n].seq, chosen[n].index, *shown[n][1]] for n in sorted(shown)]
    parts = [shown[n][0] for n in sorted(shown)]
    return rows, "\n\n".join([head, *parts]) if parts else ""


class Tracks:
    """The last ``Track`` of each conversation (its session's and API's key), for the newest ``MAX_TRACKS``: the
    engine keeps one, and each compaction's maker resumes there."""

    def __init__(self, size: int = 0) -> None:
        self.size = size or MAX_TRACKS
        self._by_key: OrderedDict[Hashable, Track] = OrderedDict()

    def get(self, key: Hashable) -> Track | None:
        found = self._by_key.get(key)
        if found is not None:
            self._by_key.move_to_end(key)
        return found

    def put(self, key: Hashable, track: Track | None) -> None:
        self._by_key.pop(key, None)
        if track is not None:
            self._by_key[key] = track
            while len(self._by_key) > self.size:
                self._by_key.popitem(last=False)


def working_set_maker(dialect: ItemModel, budget: int, count: Callable[[str], int], tracks: Tracks | None = None,
                      key: Hashable = None) -> WorkingSetMaker:
    """The compactor's ``working_set_of`` for one API, with ``budget`` tokens for the section. The conversation is
    tracked once for the messages a compaction holds, though it asks twice (its masking, then its summary), and
    from where ``tracks`` holds the last tracking of ``key`` (None: no key, no carrying) up to."""
    held: list[tuple[Sequence[Message], Sequence[int], list[FileText]]] = []

    def make(messages: Sequence[Message], start: int, masked_until: int, seqs: Sequence[int], /,
             cap: int | None = None) -> tuple[tuple[object, ...], str]:
        if not held or held[0][0] is not messages or held[0][1] is not seqs:
            if tracks is not None and key is not None:
                files, last = tracked(dialect, messages, len(messages), seqs, tracks.get(key))
                tracks.put(key, last)
            else:
                files = track(dialect, messages, len(messages), seqs)
            held[:] = [(messages, seqs, files)]
        most = budget if cap is None else min(budget, cap)
        rows, text = render(ranked(lost(held[0][2], start, masked_until)), max(0, most), count)
        return tuple(tuple(row) for row in rows), text

    return make


def refreshed(checkpoint: Checkpoint, make: WorkingSetMaker | None, messages: Sequence[Message],
              seqs: Sequence[int]) -> Checkpoint:
    """``checkpoint`` (one that masks further) carrying the files in hand its split and masking take out of the
    view, as of the newest item: a masked read is a file text that left the view as much as a summarised one. The
    same checkpoint when the section would not change, so that a masking that takes no file's text out of the view
    leaves the summary item byte-identical (and the prompt cache before the masked region whole). Within the cap
    its summary put on the files (``Checkpoint.files_cap``, ``proxy.context.keep.room``): a masking frees the
    room that cap keeps below the trigger, it does not spend it."""
    if make is None:
        return checkpoint
    rows, text = make(messages, checkpoint.retain_start_idx, checkpoint.masked_until, seqs,
                      cap=checkpoint.files_cap or None)
    return checkpoint if text == checkpoint.files else replace(checkpoint, working_set=rows, files=text)
