"""The lines of a call's result that say what went wrong: what must survive when the result itself does not.

Two readers need them, verbatim: the literals a compaction adds back
(``proxy.context.keep.literals``), and the placeholder that masks an old output
(``proxy.context.view.masking``), which would otherwise take a failure out of the
view along with the noise around it. A leaf module (it asks only the output
parser and the clients' refusals), so that the masker, which the artifact trail
imports, can ask it.
"""

from __future__ import annotations

from proxy.context.keep.artifactparse import ERROR_MARKS, NOTHING_LINE, SCAN_CHARS, status_line
from proxy.context.keep.refusals import declined, reason, refused

#: A line longer than this is no literal (a heredoc, a pasted file): the log holds it.
MAX_LINE_CHARS = 1_000
#: Error lines read from one call's result.
ERROR_LINES_PER_CALL = 3
#: Marks beside ``ERROR_MARKS`` for a result that states no status: a compiler's diagnostic (``a.ts(5,8): error
#: TS2882``), an uncaught exception's traceback (its header opens what its last line names), and, from a tool
#: that is no shell (its output is the tool's own word), a thing not found, a failure, or a name an evaluator
#: does not know (JavaScript's ``x is not defined``).
DIAGNOSTIC_MARKS = (": error ", "Traceback (most recent call last)")
TOOL_MARKS = ("not found", "Not found", "failed", "Failed", "is not defined")
#: Tools whose output is what they read: a line there that looks like an error is the file's, not the call's.
READ_WORDS = ("read", "view", "cat", "grep", "search", "glob", "find", "list", "fetch")


def error_lines(text: str, *, failed: bool, shell: bool = True, tool: str = "") -> list[str]:
    """The lines of a call's result that say what went wrong, verbatim (stripped): for a call that failed, the
    status line and the lines carrying any error mark; for one that states no status, only the strongest marks
    (``Error:``, ``fatal:``, …), a compiler's diagnostics and a traceback, and from a tool that is no shell, a
    thing not found or failed, and a line opening with the ``tool``'s own name (``telegram_send: path escapes
    the workspace root``: a program's diagnostic, as ``ls: cannot access …`` is). A failed call whose result
    marks no line gives its first (a tool's own message: Gemini CLI's ``No space left on device: PATH``, Claude
    Code's ``File has not been read yet``). Lines longer than ``MAX_LINE_CHARS`` are not literals, nor a field its
    client prints empty (Gemini CLI's ``Error: (none)``)."""
    marks = [mark for tier in (ERROR_MARKS if failed else ERROR_MARKS[:1]) for mark in tier]
    marks += [*DIAGNOSTIC_MARKS, *(() if shell else TOOL_MARKS)]
    own = f"{tool}: " if tool and not shell else None
    out = [status] if failed and (status := status_line(text)) else []
    for line in text[:SCAN_CHARS].splitlines():
        line = line.strip()
        if len(out) >= ERROR_LINES_PER_CALL:
            break
        flagged = any(m in line for m in marks) or (own is not None and line.startswith(own))
        if line and len(line) <= MAX_LINE_CHARS and line not in out and flagged and not NOTHING_LINE.search(line):
            out.append(line)
    if failed and not out:
        first = next((line.strip() for line in text[:SCAN_CHARS].splitlines() if line.strip()), "")
        out = [first] if len(first) <= MAX_LINE_CHARS and first else []
    return out


def failed_call(text: str, is_error: bool) -> bool:
    """Whether a call's result says it did not succeed: flagged so by its API, a non-zero exit status, or its
    client's answer that it declined or refused the call (``proxy.context.keep.refusals``)."""
    return is_error or bool(status_line(text)) or declined(text)


def call_errors(name: str, text: str, *, is_error: bool, shell: bool) -> list[str]:
    """``error_lines`` of the result ``text`` of a call to ``name`` (a shell call where ``shell``): none from a
    tool that reads, unless the call itself failed; for a call its client refused to run, the client's reason."""
    if refused(text):
        line = reason(text)
        return [line] if len(line) <= MAX_LINE_CHARS else []
    failed = failed_call(text, is_error)
    reads = not shell and any(word in name.lower() for word in READ_WORDS)
    return [] if reads and not failed else error_lines(text, failed=failed, shell=shell, tool=name)

