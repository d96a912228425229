"""What a view should still hold, and how much of it does: the probes of a session and their retention.

The probes are the facts an agent needs after a compaction: the paths it wrote,
the commands it ran, the error lines it saw, the user's constraint sentences,
and the exact current text of the files it wrote last. A source that carries
them (the shared corpus's ``probes``) is taken at its word; otherwise they are
derived from the items with the engine's own artifact parser
(``proxy.context.keep.artifacts``), so a replay measures any recorded session.

Retention is a plain search: each probe's exact text among the strings of a
view (every string of its items, and of the JSON objects a string holds, such
as a Chat call's ``arguments``). A probe counts only where the client's own last
request holds it (a fact stated only in the last reply cannot be in any view of
that request), and the working set counts every one of the last three files
written before the last reply whose text is known, since the exact text may
never have been sent whole (a file the last reply writes is left out: its new
text is that reply's, and the request has not seen it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.context.items import ItemModel
from proxy.context.keep.artifacts import collect
from proxy.context.keep.literals import strings
from proxy.types import Message

#: The kinds of probe, in report order (``working_set``: the exact text of the last three written files).
KINDS = ("paths", "commands", "errors", "constraints", "working_set")
WORKING_SET_FILES = 3
#: Words that make a sentence of the user's a constraint (derived probes only).
_CONSTRAINT = re.compile(r"\b(must|should|never|always|don't|do not|make sure|required?|only|need to|avoid)\b",
                         re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_ERROR_ACTION = re.compile(r"^(?:exit -?\d+|error): (.+)$")
CONTENT_KEYS = ("content", "file_text")


@dataclass(frozen=True)
class Probes:
    paths: tuple[str, ...]
    commands: tuple[str, ...]
    errors: tuple[str, ...]
    constraints: tuple[str, ...]
    #: (path, text) of the last written files whose text is known, newest last.
    working_set: tuple[tuple[str, str], ...]

    def of(self, kind: str) -> tuple[str, ...]:
        if kind == "working_set":
            return tuple(text for _, text in self.working_set)
        return tuple(getattr(self, kind))

    def named(self, kind: str) -> tuple[tuple[str, str], ...]:
        """(name, probe) of each probe of ``kind``: a file of the working set is named by its path, any other
        probe by its own text."""
        if kind == "working_set":
            return self.working_set
        return tuple((probe, probe) for probe in getattr(self, kind))


def _unique(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v for v in values if v))


def written_order(dialect: ItemModel, items: Sequence[Message]) -> list[str]:
    """Paths of the files the session wrote, by last touch, newest last."""
    return [a.name for a in collect(dialect, items, 0, len(items)) if a.kind == "file"]


def from_source(raw: Mapping[str, Any], dialect: ItemModel, items: Sequence[Message], request: int) -> Probes:
    """The corpus's probes (``files_written``, ``commands``, ``errors[].line``, ``user_constraints``,
    ``final_files``); the last three written files ordered by the session's own last touch where it names them,
    less those the last reply (``items[request:]``) writes: their final text is not yet current in its request."""
    given = raw.get("final_files")
    finals: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    later = set(written_order(dialect, items[request:]))
    order = [p for p in written_order(dialect, items) if p in finals and p not in later]
    order += [p for p in finals if p not in order and p not in later]
    errors = [e.get("line", "") for e in raw.get("errors") or () if isinstance(e, Mapping)]
    return Probes(_unique(map(str, raw.get("files_written") or ())), _unique(map(str, raw.get("commands") or ())),
                  _unique(map(str, errors)), _unique(map(str, raw.get("user_constraints") or ())),
                  tuple((p, str(finals[p])) for p in order[-WORKING_SET_FILES:]))


def derive(dialect: ItemModel, items: Sequence[Message], request: int) -> Probes:
    """Probes read from the items: the artifact trail's paths, commands and error lines, the user's sentences
    that state a requirement, and the text of each file a call wrote whole (edits applied where the old text is
    found once; any other change makes the text unknown) as of ``items[:request]``, the last request."""
    trail = collect(dialect, items, 0, len(items))
    folded = [m.group(1) for a in trail if a.kind == "command" and (m := _ERROR_ACTION.match(a.action))]
    # The trail folds whitespace: each line is looked up as the output wrote it.
    raw = {" ".join(line.split()): line.strip() for line in text_of(items).splitlines()} if folded else {}
    errors = [raw.get(line, line) for line in folded]
    constraints = [sentence.strip() for item in items if (text := dialect.user_text(item))
                   for sentence in _SENTENCE.split(text) if _CONSTRAINT.search(sentence)]
    upto = min(request, len(items))
    files = _file_texts(dialect, items[:upto])
    order = [a.name for a in collect(dialect, items, 0, upto) if a.kind == "file" and a.name in files]
    return Probes(_unique(a.name for a in trail if a.kind == "file"),
                  _unique(a.name for a in trail if a.kind == "command"), _unique(errors), _unique(constraints),
                  tuple((p, files[p]) for p in order[-WORKING_SET_FILES:]))


def _file_texts(dialect: ItemModel, items: Sequence[Message]) -> dict[str, str]:
    """The current text of each file whose every change since a whole write is known."""
    texts: dict[str, str] = {}
    for index, item in enumerate(items):
        touched = {a.name for a in collect(dialect, items, index, index + 1) if a.kind == "file"}
        if not touched:
            continue
        known: set[str] = set()
        for call_id in dialect.calls(item):
            found = dialect.call_of(item, call_id)
            args = _arguments(found[1]) if found is not None else {}
            path = next((args[k] for k in ("file_path", "path", "filePath") if isinstance(args.get(k), str)), None)
            if path not in touched:
                continue
            known.add(path)
            content = next((args[k] for k in CONTENT_KEYS if isinstance(args.get(k), str)), None)
            old, new = args.get("old_string"), args.get("new_string")
            if content is not None:
                texts[path] = content
            elif isinstance(old, str) and isinstance(new, str) and texts.get(path, "").count(old) == 1:
                texts[path] = texts[path].replace(old, new)
            else:
                texts.pop(path, None)
        for path in touched - known:  # changed by a call whose arguments say no text (a patch, a move)
            texts.pop(path, None)
    return texts


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {}
    return arguments if isinstance(arguments, dict) else {}


def text_of(items: Sequence[Any]) -> str:
    """One searchable text of ``items``' strings (a NUL between strings: no probe spans two)."""
    return "\0".join(strings(list(items), []))


@dataclass(frozen=True)
class Retention:
    """Per kind: (kept, counted) probes; and the names of the counted ones the view lost (``Probes.named``), so a
    user sees what went, not only how much."""

    counts: tuple[tuple[str, int, int], ...]
    missed: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def to_json(self) -> dict[str, dict[str, int]]:
        return {kind: {"kept": kept, "of": of} for kind, kept, of in self.counts}

    def missed_json(self) -> dict[str, list[str]]:
        return {kind: list(names) for kind, names in self.missed}


def retention(probes: Probes, view: str, request: str) -> Retention:
    """How many probes of each kind ``view`` holds, of those ``request`` holds (of all, for the working set)."""
    counts, missed = [], []
    for kind in KINDS:
        wanted = [(name, p) for name, p in probes.named(kind) if kind == "working_set" or p in request]
        lost = tuple(name for name, p in wanted if p not in view)
        counts.append((kind, len(wanted) - len(lost), len(wanted)))
        missed.append((kind, lost))
    return Retention(tuple(counts), tuple(missed))
