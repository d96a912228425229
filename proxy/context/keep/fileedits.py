"""A file's text, exactly: from a read tool's output, and after an edit, or None where it cannot be known.

The working set (``proxy.context.keep.workingset``) keeps the current text of the
files an agent has in hand; this module does the text work, each function
exact or refusing:

- ``read_text``: the whole file a read's output shows. Claude Code's ``Read``
  numbers its lines (``     1→…`` or ``cat -n``'s ``     1\\t…``) and numbers
  the empty string after a final newline too, so the text comes back byte for
  byte; a raw reader (Gemini CLI's ``read_file``, a shell ``cat``) shows the
  text itself. A partial read (an offset or a limit, numbering that does not
  start at 1, a truncation notice, a line Claude Code cut) is no file text: it
  is ignored, never kept as a region, because a region cannot take a later
  edit exactly. An empty output says nothing either way (a recorder may have
  dropped it), so it is no text.
- ``replaced``: ``old`` → ``new`` as ``Edit``/``replace``/``str_replace`` do
  it, None when the old text is not there, or is there a number of times the
  tool would have refused.
- ``codex_patch``: the files of Codex's ``*** Begin Patch`` envelope with its
  hunks applied as Codex applies them (each hunk's old lines found in order,
  exactly; the result ends with a newline); None for a file whose hunks do
  not apply exactly (Codex's fuzzy match might have applied them, so the text
  is no longer known).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.context.keep.artifactparse import CODEX_FILE, CODEX_MOVE

#: A numbered line of Claude Code's ``Read`` (or ``cat -n``): the number, then an arrow or a tab.
_NUMBERED = re.compile(r" *(\d+)(?:→|\t)")
#: Claude Code appends reminders to a read's output; they are not the file's.
_REMINDER = re.compile(r"\n*<system-reminder>.*?</system-reminder>\s*\Z", re.DOTALL)
#: What a reader writes when it shows less than the file (Gemini CLI, Codex's output cap, Claude Code's line cut).
TRUNCATION_MARKS = ("IMPORTANT: The file content has been truncated", "[Showing lines", "tokens truncated",
                    "... [truncated]", "Total output lines:", "lines truncated")
#: Claude Code shows at most this many lines per read by default: a read of exactly that many may be a part.
CLAUDE_READ_LINES = 2000
#: Codex's shell output header, before the command's own output.
_CODEX_OUTPUT = re.compile(r"\A(?:Command: .*?\n)?(?:Chunk ID: .*\n)?(?:Wall time: .*\n)?(?:Process exited with code "
                           r"(\d+)\n)?(?:Original token count: .*\n)?Output:\n", re.DOTALL)


def read_text(output: str) -> str | None:
    """The whole file a read tool's ``output`` shows, or None when it shows a part, nothing, or not a file."""
    output = _REMINDER.sub("", output)
    if not output or any(mark in output for mark in TRUNCATION_MARKS):
        return None
    lines = output.split("\n")
    numbered = [_NUMBERED.match(line) for line in lines]
    if numbered[0] is not None and numbered[0].group(1) == "1":
        if not all(match is not None and int(match.group(1)) == n for n, match in enumerate(numbered, 1)):
            return None
        if len(lines) >= CLAUDE_READ_LINES:
            return None
        return "\n".join(line[match.end():] for line, match in zip(lines, numbered, strict=True) if match)
    return output


def shell_output(result: str) -> str | None:
    """A shell command's own output from its result: Codex's header taken off (None if it says the command
    failed); other shells' results are the output itself."""
    header = _CODEX_OUTPUT.match(result)
    if header is None:
        return result
    if header.group(1) not in (None, "0"):
        return None
    return result[header.end():]


def output_is_whole(result: str, output: str) -> bool:
    """Whether ``output`` (a shell result's own output) is what the command printed to its last byte. Codex's (its
    header marks it) is: a file without a final newline is shown without one. Other shells may trim the end
    (Claude Code's ``Bash`` drops trailing newlines), so there only an output that ends with a newline is."""
    return output.endswith("\n") or _CODEX_OUTPUT.match(result) is not None


def replaced(text: str, old: str, new: str, *, count: int | None = 1) -> str | None:
    """``text`` with ``old`` replaced by ``new``: exactly ``count`` occurrences (None: all, at least one).

    An empty ``old`` creates a file: only an empty ``text`` takes it.
    """
    if not old:
        return new if not text else None
    found = text.count(old)
    if found == 0 or (count is not None and found != count):
        return None
    return text.replace(old, new)


@dataclass(frozen=True)
class PatchedFile:
    """One file of a Codex patch: its new text (None: deleted, or not known), where it moved, what it did."""

    path: str
    action: str
    text: str | None
    moved_to: str | None = None
    #: 1-based first and last line of the last hunk applied (a region most recently touched).
    region: tuple[int, int] | None = None




def codex_patch(patch: str, current: dict[str, str]) -> list[PatchedFile]:
    """Each file of a Codex patch with its text after the patch; ``current`` holds the known texts by path.

    An update of a file whose text is not known, or whose hunks do not apply
    exactly, has text None: the file changed and what it holds is unknown.
    """
    out: list[PatchedFile] = []
    blocks: list[tuple[str, str, list[str]]] = []
    for line in patch.split("\n"):
        header = CODEX_FILE.match(line)
        if header is not None:
            blocks.append((header.group(1), header.group(2), []))
        elif line.startswith("*** End Patch"):
            break
        elif blocks:
            blocks[-1][2].append(line)
    for verb, path, body in blocks:
        if verb == "Delete":
            out.append(PatchedFile(path, "deleted", None))
        elif verb == "Add":
            lines = [line[1:] for line in body if line.startswith("+")]
            out.append(PatchedFile(path, "created", "\n".join(lines) + "\n" if lines else "",
                                   region=(1, max(1, len(lines)))))
        else:
            moved = next((m.group(1) for line in body if (m := CODEX_MOVE.match(line))), None)
            hunks = [line for line in body if not CODEX_MOVE.match(line)]
            base = current.get(path)
            applied = _apply_hunks(base, hunks) if base is not None else None
            text, region = applied if applied is not None else (None, None)
            out.append(PatchedFile(path, "edited", text, moved, region))
    return out


#: One update hunk of a Codex patch: its ``@@`` context line (None: none), its old and new lines, and whether it
#: is anchored at the end of the file (``*** End of File``).
_Hunk = tuple[str | None, list[str], list[str], bool]


def _hunks(body: list[str]) -> list[_Hunk] | None:
    """The hunks of one ``*** Update File`` block, or None where a line is not a context, ``+`` or ``-`` line."""
    chunks: list[_Hunk] = []
    for line in body:
        if line.startswith("@@"):
            chunks.append((line[2:].strip() or None, [], [], False))
        elif line == "*** End of File":
            if chunks:
                chunks[-1] = (*chunks[-1][:3], True)
        else:
            if not chunks:
                chunks.append((None, [], [], False))
            _, old, new, _ = chunks[-1]
            mark, rest = (line[:1], line[1:]) if line else (" ", "")
            if mark not in " +-":
                return None
            if mark != "+":
                old.append(rest)
            if mark != "-":
                new.append(rest)
    return chunks


def _apply_hunks(text: str, body: list[str]) -> tuple[str, tuple[int, int] | None] | None:
    """``text`` with Codex's update hunks applied exactly, and the lines the last one wrote; None if one does
    not apply."""
    chunks = _hunks(body)
    if chunks is None:
        return None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    at = 0
    region: tuple[int, int] | None = None
    for context, old, new, at_end in chunks:
        if context is not None:
            found = _find(lines, [context], at)
            if found is None:
                return None
            at = found + 1
        if not old:
            where = len(lines)
        else:
            found = _find(lines, old, len(lines) - len(old) if at_end else at)
            if found is None or (at_end and found != len(lines) - len(old)):
                return None
            where = found
        lines[where:where + len(old)] = new
        region = (where + 1, where + max(1, len(new)))
        at = where + len(new)
    return "\n".join(lines) + "\n", region


def _find(lines: list[str], wanted: list[str], start: int) -> int | None:
    """The first index ``>= start`` where ``lines`` continue with ``wanted``, exactly."""
    size = len(wanted)
    for index in range(max(0, start), len(lines) - size + 1):
        if lines[index:index + size] == wanted:
            return index
    return None
