"""The user's own words, carried verbatim past a summary.

The details users miss most after a compaction are their own instructions, and
a summary model paraphrases them, merges them and, sooner or later, drops one
(Claude Code's summary keeps an "all user messages" section for this reason;
Codex keeps recent user messages verbatim beside its summary). So the proxy
itself, not the summary model, carries the text of every user message that
leaves the verbatim tail (``ItemModel.user_text``: never tool output, even
where an API puts it in a user message) into the summary item, under its own
heading after the model's sections. Text the pins carry (``proxy.context.keep.pins``:
an instruction file an agent sends in a user message, a ``<pin>`` block) is
named there in place, not carried twice; aider's files message, its files' text
that the files in hand carry, is no words of the user's.

Some clients resend the state of the environment as a user message of its own
whenever it changes: Codex's ``<environment_context>`` (the working directory,
the shell), Cline's and Roo Code's ``<environment_details>``, a
``<system-reminder>`` that opens with a tagged block (gjc's
``<workspace-tree>``, about 650 tokens with the date and directory after it,
sent again every few turns). Such a message (``snapshot``: one of those blocks
and nothing else) is carried like the user's words, but only the newest of its
kind: a later one, carried or still in the verbatim tail, supersedes it (in the
replayed gjc session four trees took 2.6k of the 2.8k tokens of words). A
message that mixes the user's text with such a block is carried whole.

The words have a budget (``--keep-user-words``, default 10 % of the window, in
tokens). Over it, the oldest long messages are clipped head and tail around a
marker naming the log entry that keeps them whole; short ones stay whole as
long as clipping long ones is enough.

They live in the checkpoint (``Checkpoint.user_words``): each compaction adds
only the messages newly moved out of the tail to what the last one carried, and
an entry once written stays byte-identical until the budget forces it shorter,
so the summary item stays stable between reductions. A round's opening user
message that the view re-inserts (the split falls inside its round) is not
carried yet: it is still in view, whole.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from proxy.context.items import ItemModel
from proxy.context.keep.aiderfiles import aider_files
from proxy.context.keep.pins import unpinned
from proxy.context.view.clipping import CLIP_MARKER, Measure, cut_text
from proxy.context.view.tokens import MESSAGE_OVERHEAD_TOKENS
from proxy.types import Message

#: ``(index, seq or -1, tokens, text, messages)``, as ``Checkpoint.user_words`` stores them; ``messages`` is 1 but
#: for the one entry that stands for the oldest messages when even their markers overran the budget.
Entry = tuple[int, int, int, str, int]

HEADING = "## The user's messages so far, verbatim (carried by ctxproxy, oldest first)"
#: Tokens an entry's label and separators cost beside its text.
ENTRY_OVERHEAD = 8
#: A message is "long" when over this many tokens: the first to be clipped, never below it in the first pass.
LONG_TOKENS = 100
FOLDED = "[… {count:,} earlier user messages, from {first} on, elided by ctxproxy; full text in the fact log …]"
#: A message that is wholly one block of client-written state: its kind is the tag (or the tag a reminder opens with).
_SNAPSHOT = re.compile(r"(?:<(environment_context|environment_details)>.*</\1>"
                       r"|<system-reminder>\s*<([\w-]+)>.*</\2>.*</system-reminder>)", re.DOTALL)
_SNAPSHOT_ENDS = ("</environment_context>", "</environment_details>", "</system-reminder>")


def snapshot(text: str) -> str | None:
    """The kind of environment state ``text`` is wholly a block of (the module's docstring), or None. Its end is
    looked at first: a long message that ends otherwise is not searched."""
    stripped = text.strip()
    found = _SNAPSHOT.fullmatch(stripped) if stripped.endswith(_SNAPSHOT_ENDS) else None
    return (found.group(1) or f"system-reminder/{found.group(2)}") if found else None


def where(entry: Entry) -> str:
    index, seq = entry[0], entry[1]
    return f"log entry {seq}" if seq >= 0 else f"message index {index}"


def render(entries: Sequence[Entry]) -> str:
    """The section that follows the model's summary ("" when nothing is carried)."""
    if not entries:
        return ""
    return "\n\n".join([HEADING, *(e[3] if e[4] > 1 else f"[{where(e)}]\n{e[3]}" for e in entries)])


def _words(dialect: ItemModel, message: Message) -> str | None:
    """The user's words in ``message``, each pinned text in them named, not repeated (``proxy.context.keep.pins``);
    none in aider's files message, which aider writes, not the user: the files in hand carry its files' text
    (``proxy.context.keep.aiderfiles``), where it took 14k characters of a 16k window's item as words."""
    text = dialect.user_text(message)
    if text and aider_files(text) is not None:
        return None
    return unpinned(text) if text else text


def _total(entries: Sequence[Entry]) -> int:
    return sum(e[2] + ENTRY_OVERHEAD for e in entries)


def carry(dialect: ItemModel, messages: Sequence[Message], previous: Sequence[Entry], *, start: int, end: int,
          opener: int | None, previous_opener: int | None, seqs: Sequence[int], measure: Measure,
          budget: int, counts: Sequence[int] = ()) -> tuple[Entry, ...]:
    """What the next checkpoint carries: ``previous`` plus the user messages in ``messages[start:end]`` (the range
    newly summarised), without the round ``opener`` the view re-inserts, and with the last checkpoint's opener
    once it no longer is; within ``budget`` tokens. ``counts`` are the messages' token counts where known: a
    message that is all user words is not tokenised again."""
    indices = [i for i in range(start, min(end, len(messages))) if i != opener]
    if previous_opener is not None and previous_opener != opener and previous_opener < start:
        indices.insert(0, previous_opener)
    entries = list(previous)
    for index in sorted(indices):
        text = _words(dialect, messages[index])
        if text:
            seq = seqs[index] if index < len(seqs) else -1
            whole = index < len(counts) and text == dialect.text(messages[index])[0]
            tokens = max(1, counts[index] - MESSAGE_OVERHEAD_TOKENS) if whole else measure.text_tokens(text)
            entries.append((index, seq, tokens, text, 1))
    entries.sort(key=lambda e: e[0])
    return tuple(fit(dialect, messages, _newest_snapshots(dialect, messages, entries, end), measure, budget))


def _newest_snapshots(dialect: ItemModel, messages: Sequence[Message], entries: list[Entry],
                      end: int) -> list[Entry]:
    """``entries`` less each snapshot that a later one of its kind supersedes, among them or in ``messages[end:]``
    (the verbatim tail). A snapshot's kind is read from its message, so one clipped since is still known."""
    later = {kind for index in range(end, len(messages)) if (kind := _kind(dialect, messages, index))}
    kept: list[Entry] = []
    for entry in reversed(entries):
        kind = _kind(dialect, messages, entry[0]) if entry[4] == 1 else None  # a fold stands for many: kept
        if kind is not None:
            if kind in later:
                continue
            later.add(kind)
        kept.append(entry)
    return kept[::-1]


def _kind(dialect: ItemModel, messages: Sequence[Message], index: int) -> str | None:
    text = dialect.user_text(messages[index]) if index < len(messages) else None
    return snapshot(text) if text else None


def fit(dialect: ItemModel, messages: Sequence[Message], entries: list[Entry], measure: Measure,
        budget: int) -> list[Entry]:
    """``entries`` within ``budget``: the oldest long ones clipped first (down to ``LONG_TOKENS``), then, if that
    is not enough, the oldest of any length (down to the marker alone). Clipping starts from the message's
    original text, so a message clipped twice carries one marker with the right count. Should even the markers
    overrun the budget (thousands of messages), the oldest fold into one line naming where they start."""
    total = _total(entries)
    marker = measure.text_tokens(CLIP_MARKER.format(count=10**6, where="log entry 999999999"))
    for floor in (LONG_TOKENS, 0):
        for position, entry in enumerate(entries):
            if total <= budget:
                return entries
            index, seq, tokens, carried, count = entry
            if tokens <= floor + marker or count > 1 or index >= len(messages):
                continue  # clipping it would save nothing: short already, or clipped as far as this pass goes
            original = _words(dialect, messages[index])
            if not original:
                continue
            cap = max(floor, tokens - (total - budget) - marker)
            if cap > 0:
                whole = tokens if carried == original else measure.text_tokens(original)
                text = cut_text(original, whole, cap, measure, where(entry))
            else:
                text = CLIP_MARKER.format(count=len(original), where=where(entry))
            entries[position] = (index, seq, measure.text_tokens(text), text, 1)
            total += entries[position][2] - tokens
    return entries if total <= budget else _fold(entries, total, budget, measure)


def _fold(entries: list[Entry], total: int, budget: int, measure: Measure) -> list[Entry]:
    """The oldest entries replaced by one line, as few as bring the total within ``budget``."""
    line_tokens = measure.text_tokens(FOLDED.format(count=10**9, first="message index 999999999"))
    folded = 0
    count = 0
    while folded < len(entries) - 1 and total + line_tokens > budget:
        total -= entries[folded][2] + ENTRY_OVERHEAD
        count += entries[folded][4]
        folded += 1
    if not folded:
        return entries
    first = entries[0]  # a fold keeps the index and seq of the first message it stands for
    text = FOLDED.format(count=count, first=where(first))
    return [(first[0], first[1], measure.text_tokens(text), text, count), *entries[folded:]]
