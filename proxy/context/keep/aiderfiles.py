"""aider's files message: the current full text of each file in its chat, which the working set takes as a read.

aider (a Chat client that edits with SEARCH/REPLACE blocks in the assistant's text, no tool calls) sends, in
every request, a user message holding the whole text of the files in its chat, after its history and before the
current user message (``Coder.get_chat_files_messages``, and ``get_read_only_files_content`` for its read-only
files). A compaction that summarises it away leaves the model nothing to quote in its SEARCH blocks, so the
working set reads it as a whole read of each file, at that message's log entry; aider resends it every turn, so
the newest is current.

The wording and framing are aider 0.86.2's (``aider/coders/base_prompts.py``: ``files_content_prefix``, which
every edit format keeps, ``read_only_files_prefix``; ask and architect mode's and context mode's own
``files_content_prefix``, in their ``*_prompts.py``; ``aider/coders/base_coder.py``: ``get_files_content``,
``all_fences``, ``choose_fence``): the prefix, then for each file ``"\\n" + path + "\\n" + open + "\\n" +
content + close + "\\n"``, the content as read from disk (aider adds no newline of its own: a file without a
final one has the close fence at the end of its last line). Every file takes the same fence, the first of
``all_fences`` that starts no line of any file, so a line that is the open fence is a file's header, never its
content; where none is, aider falls back to the first anyway, and a message whose files hold a line starting with
its fence is not read (its files could not be told apart exactly). Only a message that is exactly that (one of
those prefixes, then nothing but such files) counts: no other text is guessed at.

The message lists the files in the order of a Python set, which says nothing of which was edited last; the
assistant's edits do, in each edit format (``aider/coders/editblock_coder.py``: ``HEAD``, the file name on the
line before the block's opening fence; ``wholefile_coder.py``: the name on the line before a listing's fence;
``udiff_coder.py``: ``+++ path``; ``patch_coder.py``: ``*** Update File: path``), and ``edited`` names the files
one answer edits, so that the working set ranks the newest edit first. They only order the files: their texts
are the files message's alone.
"""

from __future__ import annotations

import re

#: ``files_content_prefix`` of the edit formats (``base_prompts.py``: diff, whole, udiff, diff-fenced, patch and the
#: architect's editors), of ask and architect mode (``ask_prompts.py``, ``architect_prompts.py``) and of context mode
#: (``context_prompts.py``, its grammar as aider has it).
FILES_PREFIXES = (
    "I have *added these files to the chat* so you can go ahead and edit them.\n\n"
    "*Trust this message as the true contents of these files!*\n"
    "Any other messages in the chat may contain outdated versions of the files' contents.\n",
    "I have *added these files to the chat* so you see all of their contents.\n"
    "*Trust this message as the true contents of the files!*\n"
    "Other messages in the chat may contain outdated versions of the files' contents.\n",
    "These files have been *added these files to the chat* so we can see all of their contents.\n"
    "*Trust this message as the true contents of the files!*\n"
    "Other messages in the chat may contain outdated versions of the files' contents.\n")
READ_ONLY_PREFIX = "Here are some READ ONLY files, provided for your reference.\nDo not edit these files!\n"
#: aider's ``all_fences``: (open, close).
FENCES = (("```", "```"), ("````", "````"), *((f"<{tag}>", f"</{tag}>")
                                              for tag in ("source", "code", "pre", "codeblock", "sourcecode")))
#: aider's ``HEAD``: the line that opens a SEARCH/REPLACE block.
SEARCH = re.compile(r"^<{5,9} SEARCH>?[ \t]*$", re.MULTILINE)
#: A file a udiff (``+++ path``) or aider's patch format (``*** Update File: path``) edits.
DIFF_TARGET = re.compile(r"^(?:\+\+\+ |\*\*\* (?:Update|Add) File: )(.+?)[ \t]*$", re.MULTILINE)


def edited(text: str) -> set[str]:
    """The paths assistant text ``text`` edits, in any of aider's edit formats: the nearest line above each
    SEARCH/REPLACE block's head that is not a fence, a whole-file listing's name (the line before its opening
    fence, cleaned as ``wholefile_coder.get_edits`` cleans it), a udiff's ``+++`` path, a patch's file. A listing
    that only quotes a file names it too: these only rank the files message's files, never give a text."""
    paths = {found.group(1) for found in DIFF_TARGET.finditer(text)} | _listed(text)
    for head in SEARCH.finditer(text):
        cut = head.start()
        for _ in range(4):  # the three lines above the head, found from it: a long answer is not split per block
            cut = text.rfind("\n", 0, cut) if cut > 0 else -1
        above = text[cut + 1:head.start()].split("\n")[-4:-1]
        path = next((line.strip() for line in reversed(above) if line.strip() and not line.startswith("`")), None)
        if path is not None:
            paths.add(path)
    return paths


def _listed(text: str) -> set[str]:
    """The names on the line before each opening fence of ``text`` (``**app.py**``, ``app.py:`` and ``# app.py``
    as ``app.py``)."""
    lines = text.split("\n")
    names: set[str] = set()
    inside = False
    for at, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if not inside and at:
            name = lines[at - 1].strip().strip("*").rstrip(":").strip("`").lstrip("#").strip()
            if name and len(name) <= 250:
                names.add(name)
        inside = not inside
    return names


def aider_files(text: str) -> list[tuple[str, str]] | None:
    """The (path, exact text) of each file in aider's files message ``text``; None if ``text`` is not one."""
    body = next((text[len(prefix):] for prefix in (*FILES_PREFIXES, READ_ONLY_PREFIX) if text.startswith(prefix)), None)
    if not body:
        return None
    for fence in FENCES:
        files = _files(body, *fence)
        if files is not None:
            return files
    return None


def _header(body: str, at: int, open_fence: str) -> tuple[str, int] | None:
    """The path of the file whose header starts at ``at`` (``"\\n" path "\\n" open "\\n"``), and where its
    content starts."""
    if not body.startswith("\n", at):
        return None
    end = body.find("\n", at + 1)
    if end <= at + 1 or not body.startswith(open_fence + "\n", end + 1):
        return None
    return body[at + 1:end], end + 2 + len(open_fence)


def _files(body: str, open_fence: str, close: str) -> list[tuple[str, str]] | None:
    """The files of ``body`` framed with one fence; None if it is not wholly such files. A file's content ends at
    the first close fence (and newline) followed by the message's end or the next file's header."""
    files: list[tuple[str, str]] = []
    at = 0
    while at < len(body):
        header = _header(body, at, open_fence)
        if header is None:
            return None
        path, start = header
        end = body.find(close + "\n", start)
        while end >= 0:
            after = end + len(close) + 1
            if after == len(body) or _header(body, after, open_fence) is not None:
                break
            end = body.find(close + "\n", end + 1)
        text = body[start:end]
        if end < 0 or any(line.startswith((open_fence, close)) for line in text.split("\n")):
            return None
        files.append((path, text))
        at = end + len(close) + 1
    return files
