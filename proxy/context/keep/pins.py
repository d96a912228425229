"""Pins: the agent's instruction files and the text the user marked, verbatim in every view.

Instructions erode first when a context is compacted: a summary paraphrases
``AGENTS.md`` into a line, or drops it. Where an agent keeps them in its system
prompt (Gemini CLI's ``GEMINI.md``) the view never compacts them; but Claude
Code sends ``CLAUDE.md`` in a ``<system-reminder>`` of the first user message,
Codex sends ``AGENTS.md`` as a user message of its own, and any agent may read
one with a tool mid-run. So the proxy itself, not the summary model, carries
them: when a message holding one leaves the verbatim tail, its text goes into
the summary item under its own heading, labelled with the file's path and the
log entry it comes from, and stays there through every later compaction.

What is pinned (``found``):

- Claude Code's instruction block: ``Contents of <path> (…):`` followed by the
  file's text, inside a ``<system-reminder>`` that opens with Claude Code's
  "Codebase and user instructions are shown below" (or naming an instruction
  file);
- Codex's ``# AGENTS.md instructions for <dir>`` message (the text between
  ``<INSTRUCTIONS>`` and ``</INSTRUCTIONS>``), and the older
  ``<user_instructions>`` block;
- the output of a tool call that reads an instruction file whole
  (``proxy.context.keep.instructionfiles``), or any document the user's own words
  quote (``quoted``: a spec or playbook they pasted from and the agent read);
- text the user marks in a message of their own: everything between ``<pin>``
  and ``</pin>``.

A newer version of a file supersedes the older (a re-read, the next session's
block): one pin per file, the newest. The pins have a budget (``SHARE`` of the
window, in tokens), filled newest first: a pin that does not fit whole is cut
head and tail around a marker naming its log entry when the room left is worth
it (``MIN_CLIPPED`` tokens), and left out otherwise, with a line naming the log
entry that holds it. They live in the checkpoint
(``Checkpoint.pins``): each compaction adds what newly left the tail to what the
last one carried.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from proxy.context.checkpoint import Pin
from proxy.context.items import ItemModel
from proxy.context.keep.instructionfiles import is_instruction_file, read_path
from proxy.context.keep.toolkinds import whole_read
from proxy.context.view.clipping import Measure, cut_text
from proxy.context.view.masking import Masker, answer_text
from proxy.types import Message

#: Share of the window the pins may take.
SHARE = 0.10
#: The source of text the user pinned with the marker.
USER = "(pinned by the user)"
HEADING = "## Pinned instructions, verbatim (carried by ctxproxy: instruction files and text the user pinned)"
#: A document the agent read whole is pinned as the user's when their words quote this many of its characters, in
#: paragraphs of at least ``QUOTED_PARAGRAPH`` characters (``quoted``).
QUOTED_CHARS = 300
QUOTED_PARAGRAPH = 40
#: Tokens a pin's label and separators cost beside its text.
PIN_OVERHEAD = 16
#: Fewest tokens a pin too large for the room left is cut to; with less room it is left out.
MIN_CLIPPED = 200
#: Tokens kept free for the marker of a cut pin.
CLIP_ROOM = 40
LEFT_OUT = "[Pins left out for the pin budget, whole in the fact log: {names}]"
#: What the user's words carry in place of a pinned text.
ELSEWHERE = "[{source}: verbatim under the pinned instructions]"

_MARKED = re.compile(r"<pin>(.*?)</pin>", re.DOTALL)
_CLAUDE_HEADER = re.compile(r"^Contents of (?P<path>[^\n]+?)(?: \([^\n()]*\))?:\n\n", re.MULTILINE)
_CLAUDE_PREAMBLE = "Codebase and user instructions are shown below."
_REMINDER_END = "\n</system-reminder>"
_CODEX = re.compile(r"^# AGENTS\.md instructions for (?P<dir>[^\n]+)\n\n<INSTRUCTIONS>\n(?P<text>.*?)\n</INSTRUCTIONS>",
                    re.DOTALL | re.MULTILINE)
_CODEX_OLD = re.compile(r"<user_instructions>\n?(?P<text>.*?)\n?</user_instructions>", re.DOTALL)


def found(dialect: ItemModel, messages: Sequence[Message], index: int) -> list[tuple[str, str]]:
    """(source, text) of what ``messages[index]`` holds to pin: a file's path, or ``USER``."""
    item = messages[index]
    text = dialect.user_text(item)
    out = [(source, text[begin:end]) for source, begin, end in _spans(text)] if text else []
    for answer in dialect.answers(item):
        name, arguments = Masker.call(dialect, messages, index, answer.call_id)
        read = read_path(name, arguments)
        whole = whole_read(name, arguments) if read is None else None
        output, failed = answer_text(dialect, item, answer) if read is not None or whole is not None else ("", False)
        if failed:
            continue  # a read that failed or was cancelled holds no file's text
        if read is not None and output:
            out.append((read, output))
        elif whole is not None and output and quoted(output, [dialect.user_text(m) for m in messages[:index]]):
            out.append((whole, output))
    return out


def quoted(document: str, words: Sequence[str | None]) -> bool:
    """Whether the user's ``words`` quote ``document``: paragraphs of it (blocks between blank lines, each
    ``QUOTED_PARAGRAPH`` characters or more) found verbatim there, ``QUOTED_CHARS`` characters in all. A file
    the user pasted from is the spec they handed over, as binding as an instruction file: the agent that read it
    whole keeps it, where otherwise only the parts the user pasted would survive a summary."""
    said = "\n".join(text for text in words if text)
    if len(said) < QUOTED_CHARS:
        return False
    blocks = {block.strip() for block in re.split(r"\n\s*\n", document.replace("\r\n", "\n"))}
    return sum(len(block) for block in blocks if len(block) >= QUOTED_PARAGRAPH and block in said) >= QUOTED_CHARS


def unpinned(text: str) -> str:
    """``text`` (a user message's words) with each pinned span replaced by a line naming its pin: the user's words
    (``proxy.context.keep.userwords``) need not carry a second copy of an instruction file."""
    out: list[str] = []
    done = 0
    for source, begin, end in sorted(_spans(text), key=lambda span: span[1]):
        if begin >= done:
            out += [text[done:begin], ELSEWHERE.format(source=source)]
            done = end
    return "".join([*out, text[done:]])


def _spans(text: str) -> Iterator[tuple[str, int, int]]:
    """(source, start, end) of each text to pin in a user message's words."""
    headers = list(_CLAUDE_HEADER.finditer(text))
    for n, match in enumerate(headers):
        path = match["path"]
        opened = text.rfind("<system-reminder>", 0, match.start())
        if opened < 0 or not (_CLAUDE_PREAMBLE in text[opened:match.start()] or is_instruction_file(path)):
            continue
        ends = [text.find(_REMINDER_END, match.end())]
        if n + 1 < len(headers):
            ends.append(headers[n + 1].start() - 2)
        end = min((e for e in ends if e >= match.end()), default=len(text))
        yield path, match.end(), end
    for match in _CODEX.finditer(text):
        yield f"{match['dir'].rstrip('/')}/AGENTS.md", match.start("text"), match.end("text")
    if not _CODEX.search(text):
        for match in _CODEX_OLD.finditer(text):
            yield "AGENTS.md", match.start("text"), match.end("text")
    for match in _MARKED.finditer(text):
        inner = match[1]
        if inner.strip():
            begin = match.start(1) + len(inner) - len(inner.lstrip())
            yield USER, begin, begin + len(inner.strip())


def same(pin: Pin, source: str, text: str) -> bool:
    """Whether ``pin`` is an older version of (``source``, ``text``): the same file (one path a suffix of the other:
    ``AGENTS.md`` read relative to the directory Codex named), or the same text the user pinned again."""
    if source == USER or pin[0] == USER:
        return pin[0] == source and pin[3] == text
    a, b = (p.replace("\\", "/").removeprefix("./") for p in (pin[0], source))
    return a == b or a.endswith("/" + b) or b.endswith("/" + a)


def carry(dialect: ItemModel, messages: Sequence[Message], previous: Sequence[Pin], *, start: int, end: int,
          opener: int | None, previous_opener: int | None, seqs: Sequence[int], measure: Measure,
          budget: int) -> tuple[Pin, ...]:
    """What the next checkpoint pins: ``previous`` with what ``messages[start:end]`` (the range newly leaving the
    tail, without the round ``opener`` the view re-inserts, with the last checkpoint's opener once it no longer
    is) holds to pin, newer versions superseding older ones; within ``budget`` tokens."""
    indices = [i for i in range(start, min(end, len(messages))) if i != opener]
    if previous_opener is not None and previous_opener != opener and previous_opener < start:
        indices.insert(0, previous_opener)
    pins = list(previous)
    for index in sorted(indices):
        seq = seqs[index] if index < len(seqs) else -1
        for source, text in found(dialect, messages, index):
            if any(same(p, source, text) and p[1] > seq >= 0 for p in pins):
                continue  # a re-inserted opener older than the version pinned already
            pins = [p for p in pins if not same(p, source, text)]
            pins.append((source, seq, measure.text_tokens(text), text))
    return fit(pins, budget, measure)


def fit(pins: Sequence[Pin], budget: int, measure: Measure) -> tuple[Pin, ...]:
    """``pins`` within ``budget``, newest first: whole while they fit; the first that does not, cut head and tail
    to the room left if that is ``MIN_CLIPPED`` tokens or more; the rest left out (their text emptied: the
    rendering names where the log holds them)."""
    room = budget
    kept: list[Pin] = []
    for pin in reversed(pins):
        source, seq, tokens, text = pin
        cap = room - PIN_OVERHEAD
        if text and tokens <= cap:
            kept.append(pin)
        elif text and cap >= MIN_CLIPPED:
            clipped = cut_text(text, tokens, cap - CLIP_ROOM, measure, _where(pin))
            kept.append((source, seq, measure.text_tokens(clipped), clipped))
        else:
            kept.append((source, seq, tokens, ""))
            continue
        room -= kept[-1][2] + PIN_OVERHEAD
    return tuple(reversed(kept))


def _where(pin: Pin) -> str:
    return f"log entry {pin[1]}" if pin[1] >= 0 else "not logged yet"


def render(pins: Sequence[Pin]) -> str:
    """The pins' section of the summary item ("" when nothing is pinned)."""
    if not pins:
        return ""
    parts = [HEADING, *(f"[{p[0]}, as of {_where(p)}]\n{p[3]}" for p in pins if p[3])]
    left_out = [f"{p[0]} ({_where(p)}, {p[2]:,} tokens)" for p in pins if not p[3]]
    if left_out:
        parts.append(LEFT_OUT.format(names="; ".join(left_out)))
    return "\n\n".join(parts)
