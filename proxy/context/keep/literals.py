"""Exact literals a compaction would lose, added back by the proxy: what the summary must not paraphrase away.

A summary, even a good one, rewrites: an error line becomes "the build
failed", a path becomes "the config file", a version disappears. The agent
then re-runs, re-reads and loops. The proxy holds every entry of the log, so at
each compaction it reads the exact literals of everything compacted so far:

- **error lines**, verbatim, each with the command or tool call that produced
  it (a failed call's status line and the lines that say what went wrong);
- **written paths** and **commands run**, exactly as the calls gave them (the
  trail folds and cuts commands; here they are whole);
- the user's **constraint sentences** (must, never, only, required, …);
- **URLs**, **versions**, **identifiers** (backticked names, snake_case and
  camelCase words of the user) and **numbers** the user gave.

A literal no longer stands when a later entry superseded it: an error of a
command that ran again and failed anew (the newer error stands), a literal
seen again later (the newest occurrence stands). An error followed by a success
of the same command stays, marked resolved. A call its client refused to run
(``proxy.context.keep.refusals``) ran nothing: its command is no command run, it
neither resolves nor supersedes an error of the same command, and the client's
reason stands as an error of that call. Each literal the view does not
hold without help (the summary item, the verbatim tail) is added back in the
summary item, one per line, within a token budget: unresolved errors first,
then constraints, paths, commands, resolved errors, the commands that write a
file's text from a heredoc, URLs, versions, identifiers, numbers, and last the
heredoc commands longer than a literal (a whole file each: what room is left),
each kind newest first. The budget is the literals' share of the window and
what the files in hand leave of theirs (``literal_maker``). What did not fit
is counted as dropped for budget. The checkpoint keeps every live literal (``literals``, as
JSON rows, bounded) so the next compaction checks them again against its own
summary, its rendering (``literals_text``) and its receipt.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from proxy.context.items import ItemModel
from proxy.context.keep.artifactparse import clip, command_name, parsed_arguments, patch_files
from proxy.context.keep.artifacts import answered_calls, collect, patch_of
from proxy.context.keep.codexcode import cell_calls, cell_source
from proxy.context.keep.errorlines import call_errors, failed_call
from proxy.context.keep.refusals import refused
from proxy.context.keep.shellwrites import writes_text, written
from proxy.context.keep.toolkinds import is_shell, shell_command
from proxy.types import Message

LITERALS_HEADING = "## Exact literals of the compacted messages (from ctxproxy's log: verbatim, not model-written)"
#: Kinds in the order they are added back (an unresolved error is ``error``, a resolved one ``resolved``).
PRIORITY = ("error", "constraint", "path", "command", "resolved", "url", "version", "identifier", "number")
TITLES = {"error": "Errors (unresolved):", "constraint": "The user's constraints:", "path": "Paths written:",
          "command": "Commands run:", "resolved": "Errors since resolved (a later run of the same call succeeded):",
          "url": "URLs:", "version": "Versions:", "identifier": "Identifiers:", "number": "Numbers:"}
#: Share of the window the literals added back may take, as much as the artifact trail's: an error line with its
#: call is 30 to 60 tokens, a command 20 to 200. Replayed in a third of their size, the corpus's sessions fit every
#: literal but one session's commands (215 of them, 10.5k tokens, in a 57k window); 15 % kept 31 more of those and
#: cost that session one more summary; 5 % kept 29 fewer commands (440 of 646 against 469). The files in hand lend
#: what they leave of their share (``literal_maker``).
LITERALS_SHARE = 0.10
#: Live literals a checkpoint keeps (the newest): bounds the log entry.
MAX_LITERALS = 2_000
#: A literal longer than this is no literal (a pasted file), but for the commands below.
MAX_LITERAL_CHARS = 1_000
#: A command that writes no file's text is a literal up to this length (a run of ``mv`` lines renaming assets).
MAX_COMMAND_CHARS = 4_000
#: A command that writes a file's text from a heredoc is a literal of any length (what the agent ran, and the
#: file), but a checkpoint keeps those longer than ``MAX_LITERAL_CHARS`` only the newest first while their
#: characters stay within this many per token of the budget: what could never be shown is not logged again.
LONG_CHARS_PER_TOKEN = 10
#: Characters of an error's call shown beside it.
SOURCE_CHARS = 200
_CONSTRAINT = re.compile(r"\b(must|should|never|always|don't|do not|make sure|required?|only|need to|avoid|"
                         r"prefer|instead of|no more than|at most|at least)\b", re.IGNORECASE)
#: A line of the user's that sets a task: a list item, or a sentence opening with an imperative.
_TASK = re.compile(r"^(?:[-*•]|\d+[.)])\s+\S|^(?:Implement|Build|Add|Use|Create|Write|Make|Keep|Ensure|Support|"
                   r"Provide|Include|Follow|Return|Store|Show|Allow|Require|Do|Don't|Never|Always|Avoid)\b")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_URL = re.compile(r"https?://[^\s<>\"'`)\]}]+")
_VERSION = re.compile(r"(?<![\w.])v?\d+\.\d+(?:\.\d+)+(?:[-+][0-9A-Za-z.]+)?(?![\w])|(?<![\w.])v\d+(?:\.\d+)?(?![\w.])")
_BACKTICKED = re.compile(r"`([^`\n]{2,100})`")
_NAME = re.compile(r"(?<![\w/.-])(?:[A-Za-z]\w*_\w+|[a-z]+[A-Z]\w*|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\(\))(?![\w/-])")
_NUMBER = re.compile(r"(?<![\w.:/-])(?:\d{3,}|\d+\.\d+)(?:%|ms|s|px|k|KB|MB|GB)?(?![\w.:/-])")


@dataclass(frozen=True)
class Exact:
    """One literal: its kind (``PRIORITY``), its exact text, where an error came from (the command or tool call
    that produced it; ``""`` for other kinds), the conversation index and log seq it was last seen at."""

    kind: str
    text: str
    source: str
    index: int
    seq: int


@dataclass(frozen=True)
class Receipt:
    """What one compaction did with the literals of everything compacted: in range (live, not superseded), kept
    by the view without help (the summary item or the verbatim tail), added back, dropped for budget."""

    in_range: int
    kept: int
    added: int
    dropped: int

    def to_json(self) -> dict[str, int]:
        return {"in_range": self.in_range, "kept": self.kept, "added": self.added, "dropped": self.dropped}


class LiteralMaker(Protocol):
    """The compactor's hook: from the previous checkpoint's rows, the conversation, the range ``[start, end)``
    newly compacted, the log's seqs, the text the view shows without add-back and the files in hand it carries
    (their section): the rows, the section and its receipt. ``cap``: tokens the section may take at most, below
    its budget (``proxy.context.keep.room``); the rows are kept as without it, for a later compaction to show."""

    def __call__(self, previous: tuple[object, ...], messages: Sequence[Message], start: int, end: int,
                 seqs: Sequence[int], shown: str, files: str = "", /,
                 cap: int | None = None) -> tuple[tuple[object, ...], str, Receipt]: ...


def strings(value: Any, out: list[str]) -> list[str]:
    """Every string in ``value``, and in any JSON object or list a string holds (a call's ``arguments``)."""
    if isinstance(value, str):
        out.append(value)
        if value[:1] in ("{", "["):
            try:
                inner = orjson.loads(value)
            except orjson.JSONDecodeError:
                return out
            if isinstance(inner, dict | list):
                strings(inner, out)
    elif isinstance(value, Mapping):
        for inner in value.values():
            strings(inner, out)
    elif isinstance(value, list | tuple):
        for inner in value:
            strings(inner, out)
    return out


def shown_text(dialect: ItemModel, items: Sequence[Message]) -> str:
    """One searchable text of ``items``' strings (a NUL between strings: no literal spans two), tool outputs left
    out: masking takes them from a later view (``proxy.context.view.masking``), and a literal they alone hold would be
    lost then with no compaction to add it back."""
    kept: list[Any] = []
    for item in items:
        for path in dialect.result_paths(item) if dialect.results(item) else ():
            item = dialect.with_output(item, path, "") or {}
        kept.append(item)
    return "\0".join(strings(kept, []))


def call_source(name: str, arguments: Any, command: str | None) -> str:
    """How an error's call is named: ``$ <command>`` for a shell call, ``<tool> <arguments>`` for any other; a long
    one by its head, length and digest (a heredoc need not ride along with each of its error lines), a long
    command's head as the trail names it (its heredoc bodies as their line counts: what it wrote stays named)."""
    if command is not None:
        text = f"$ {command}"
    else:
        args = arguments if isinstance(arguments, str) else orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)
        text = f"{name} {args if isinstance(args, str) else args.decode()}"
    if len(text) <= MAX_LITERAL_CHARS:
        return text
    digest = hashlib.blake2b(text.encode(), digest_size=6).hexdigest()  # still one key per call for resolving
    head = f"$ {command_name(command)}".removesuffix("…") if command is not None else text
    return f"{head[:SOURCE_CHARS]}… ({len(text):,} characters, {digest})"


def _rank(literal: Exact, replaced: bool) -> float:
    """Where ``literal`` comes in the add-back: its kind's place in ``PRIORITY``, a command that writes a file's
    text just after the resolved errors (an error line and its call say more in fewer tokens), one longer than
    ``MAX_LITERAL_CHARS`` after every other literal, in the room they leave (one such command would take the
    place of dozens of the others), and of those, one ``replaced`` (every file it wrote, a later one wrote again)
    after those whose text may still be a file's."""
    if literal.kind == "command" and writes_text(literal.text):
        if len(literal.text) > MAX_LITERAL_CHARS:
            return len(PRIORITY) + int(replaced)
        return PRIORITY.index("resolved") + 0.5
    return PRIORITY.index(literal.kind)


def rewritten(literals: Sequence[Exact]) -> set[int]:
    """Indices (in ``literals``, oldest first) of the heredoc writes whose every file a later one wrote again: the
    text they carry is no file's any more, only history. A file edited since (a patch) is not counted so: most of
    the text is still the file's, and the path literals do not tell a whole write from an edit."""
    later: set[str] = set()
    out: set[int] = set()
    for at in range(len(literals) - 1, -1, -1):
        literal = literals[at]
        if literal.kind == "command" and writes_text(literal.text):
            paths = set(written(literal.text))
            if paths <= later:
                out.add(at)
            later |= paths
    return out


def _words(text: str) -> Iterable[tuple[str, str]]:
    """(kind, literal) of a user's message: constraint sentences, URLs, versions, identifiers, numbers."""
    for sentence in _SENTENCE.split(text):
        sentence = sentence.strip()
        if sentence and len(sentence) <= MAX_LITERAL_CHARS and (_CONSTRAINT.search(sentence) or _TASK.match(sentence)):
            yield "constraint", sentence
    yield from _tokens(text)
    for found in _NAME.finditer(text):
        yield "identifier", found.group(0)
    for found in _NUMBER.finditer(_URL.sub(" ", text)):
        yield "number", found.group(0)


def _tokens(text: str) -> Iterable[tuple[str, str]]:
    """URLs, versions and backticked identifiers: literals in anyone's words, the assistant's as well."""
    for found in _URL.finditer(text):
        yield "url", found.group(0).rstrip(".,;:")
    for found in _VERSION.finditer(_URL.sub(" ", text)):
        yield "version", found.group(0)
    for found in _BACKTICKED.finditer(text):
        yield "identifier", found.group(1).strip()


def cell_of(name: str, arguments: Any) -> list[tuple[str, Any]] | None:
    """The tool calls a Codex code-mode cell (``exec`` with a JavaScript ``input``) makes, as
    ``proxy.context.keep.codexcode`` reads them (``[]`` for a cell it cannot read); None for any other call. The
    commands such a cell runs and the files its patches write are the agent's as much as a shell call's."""
    source = cell_source(name, parsed_arguments(arguments))
    return None if source is None else cell_calls(source) or []


def extract(dialect: ItemModel, messages: Sequence[Message], start: int, end: int,
            seqs: Sequence[int] = ()) -> tuple[list[Exact], list[tuple[str, int, bool]]]:
    """The literals of ``messages[start:end]`` in conversation order, and the runs of every call from ``start``
    on (its source, index, whether it succeeded), which resolve or supersede errors."""
    def seq(index: int) -> int:
        return seqs[index] if index < len(seqs) else -1

    found: list[Exact] = []
    runs: list[tuple[str, int, bool]] = []
    for index, name, arguments, text, is_error in answered_calls(dialect, messages, start, len(messages)):
        inner = cell_of(name, arguments)
        calls = [(name, arguments)] if inner is None else inner
        commands = [c for n, a in calls if (c := shell_command(n, a)) is not None]
        command = commands[0] if len(commands) == 1 else None  # the call an error line is named by
        source = call_source(name, arguments, command)
        if text is None:
            continue
        lines = call_errors(name, text, is_error=is_error, shell=is_shell(name, arguments))
        ran_it = not refused(text)  # refused before it ran: its reason is an error of the call, but it is no run
        if ran_it:
            runs.append((source, index, not lines))
        if index >= end:
            continue
        if ran_it:
            found += [Exact("command", ran, "", index, seq(index)) for ran in commands
                      if len(ran) <= MAX_COMMAND_CHARS or writes_text(ran)]
        if ran_it and not failed_call(text, is_error):
            found += [Exact("path", path, "", index, seq(index)) for ran in commands for path in written(ran)]
            found += [Exact("path", path, "", index, seq(index)) for n, a in inner or () if "patch" in n.lower()
                      and (patch := patch_of(parsed_arguments(a))) is not None for path, _ in patch_files(patch)]
        found += [Exact("error", line, source, index, seq(index)) for line in lines]
    found += [Exact("path", a.name, "", a.index, a.seq) for a in collect(dialect, messages, start, end, seqs)
              if a.kind == "file"]
    for index in range(max(start, 0), min(end, len(messages))):
        item = messages[index]
        words = dialect.user_text(item)
        if words:
            found += [Exact(kind, text, "", index, seq(index)) for kind, text in _words(words)]
        elif dialect.role(item) == "assistant":
            found += [Exact(kind, text, "", index, seq(index)) for kind, text in _tokens(dialect.text(item)[0])]
    found.sort(key=lambda literal: literal.index)
    return found, runs


def live(literals: Iterable[Exact], runs: Sequence[tuple[str, int, bool]]) -> list[Exact]:
    """``literals`` less those a later entry superseded, newest occurrence of each kept, errors resolved by a
    later success of the same call marked ``resolved``; oldest first."""
    latest: dict[str, tuple[int, bool]] = {}
    for source, index, ok in runs:
        if index >= latest.get(source, (-1, False))[0]:
            latest[source] = (index, ok)
    newest: dict[tuple[str, str], Exact] = {}
    for literal in literals:
        if literal.kind in ("error", "resolved"):
            last = latest.get(literal.source)
            if last is not None and last[0] > literal.index:
                if not last[1]:
                    continue  # the call failed again later: the newer error stands for it
                literal = replace(literal, kind="resolved")
        key = ("error" if literal.kind == "resolved" else literal.kind, literal.text)
        if key in newest and newest[key].index > literal.index:
            continue
        newest.pop(key, None)
        newest[key] = literal
    return sorted(newest.values(), key=lambda literal: literal.index)


def _line(literal: Exact) -> str:
    where = f"log #{literal.seq}" if literal.seq >= 0 else f"message {literal.index}"
    if literal.kind in ("error", "resolved"):
        short = "\n" not in literal.source and len(literal.source) <= SOURCE_CHARS
        return f"- {literal.text}\n  (from {literal.source if short else clip(literal.source, SOURCE_CHARS)}, {where})"
    if literal.kind == "command":
        return f"- $ {literal.text}"
    return f"- {literal.text}"


def add_back(literals: Sequence[Exact], shown: str, budget: int,
             count: Callable[[str], int]) -> tuple[str, Receipt]:
    """The section adding back each literal ``shown`` lacks, within ``budget`` tokens (as ``count`` measures):
    by ``PRIORITY``, newest first within a kind; a literal that does not fit is dropped and smaller later ones
    still tried. ``""`` when nothing is added."""
    missing = [literal for literal in literals if literal.text not in shown]
    replaced = {id(literals[at]) for at in rewritten(literals)}
    ranked = sorted(missing, key=lambda literal: (_rank(literal, id(literal) in replaced), -literal.index))
    spent = count(LITERALS_HEADING) + 2 * len(PRIORITY)
    chosen: list[Exact] = []
    for literal in ranked:
        cost = count(_line(literal)) + 1
        if spent + cost <= budget:
            chosen.append(literal)
            spent += cost
    receipt = Receipt(len(literals), len(literals) - len(missing), len(chosen), len(missing) - len(chosen))
    if not chosen:
        return "", receipt
    lines = [LITERALS_HEADING]
    for kind in PRIORITY:
        rows = [_line(literal) for literal in chosen if literal.kind == kind]
        if rows:
            lines += [TITLES[kind], *rows]
    return "\n".join(lines), receipt


def coverage(receipt: Mapping[str, int]) -> str:
    """A compaction's receipt as the inspector and the log's text show it."""
    return (f"literals: {receipt.get('in_range', 0):,} in range, {receipt.get('kept', 0):,} kept by the summary "
            f"and tail, {receipt.get('added', 0):,} added, {receipt.get('dropped', 0):,} dropped")


def to_json(literals: Sequence[Exact]) -> list[list[str | int]]:
    """Literals as compact JSON-able rows, ``[kind, text, source, index, seq]``, for a checkpoint."""
    return [[a.kind, a.text, a.source, a.index, a.seq] for a in literals]


def from_json(raw: Any) -> list[Exact]:
    """The rows ``to_json`` wrote; ValueError on anything else."""
    if not isinstance(raw, list | tuple):
        raise ValueError("literals are a list of rows")
    out: list[Exact] = []
    for row in raw:
        if not (isinstance(row, list | tuple) and len(row) == 5 and row[0] in PRIORITY
                and isinstance(row[1], str) and isinstance(row[2], str) and all(type(n) is int for n in row[3:])):
            raise ValueError(f"not a literal row: {row!r:.80}")
        out.append(Exact(row[0], row[1], row[2], row[3], row[4]))
    return out


def bounded(literals: Sequence[Exact], chars: int) -> list[Exact]:
    """``literals`` less the oldest of those longer than ``MAX_LITERAL_CHARS`` (heredoc writes) past ``chars``
    characters of them, the newest kept first; the last ``MAX_LITERALS`` of what remains."""
    left = chars
    dropped: set[int] = set()
    for at in range(len(literals) - 1, -1, -1):
        if len(text := literals[at].text) > MAX_LITERAL_CHARS:
            left -= len(text)
            if left < 0:
                dropped.add(at)
    return [literal for at, literal in enumerate(literals) if at not in dropped][-MAX_LITERALS:]


def literal_maker(dialect: ItemModel, budget: int, count: Callable[[str], int], lent: int = 0) -> LiteralMaker:
    """The compactor's ``literals_of`` for one API, with ``budget`` tokens for the section, and the part of
    ``lent`` (the files in hand's budget, ``proxy.context.keep.workingset``) that their section leaves: what the
    proxy carries exactly from the log fills the two shares whichever has more to carry (a session whose files
    cannot be known, or are all in view, has commands to carry)."""

    def make(previous: tuple[object, ...], messages: Sequence[Message], start: int, end: int,
             seqs: Sequence[int], shown: str, files: str = "", /,
             cap: int | None = None) -> tuple[tuple[object, ...], str, Receipt]:
        try:
            carried = from_json(list(previous))
        except ValueError:
            carried = []
        new, runs = extract(dialect, messages, start, end, seqs)
        most = max(0, budget) + max(0, lent)
        literals = bounded(live([*carried, *new], runs), most * LONG_CHARS_PER_TOKEN)
        spare = max(0, lent - (count(files) if files else 0))
        most = max(0, budget) + spare
        text, receipt = add_back(literals, shown, most if cap is None else min(most, cap), count)
        return tuple(tuple(row) for row in to_json(literals)), text, receipt

    return make
