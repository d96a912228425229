"""The artifact trail: which files the agent touched and which commands it ran, stated from the log, not by a model.

Published evaluations of compaction find "which files were touched, and how"
the weakest part of every model-written summary. The proxy holds every tool
call in its log, so it can state that part exactly: this module reads the calls
made in a range of the conversation (through ``ItemModel.calls`` and
``call_of``, so it knows no wire format) and the results that answer them
(``results`` and ``result_paths``), and turns them into ``Artifact`` lines:

- **files** created, edited, moved or deleted, with the last action: Claude
  Code's ``Write``/``Edit``/``MultiEdit``/``NotebookEdit``, opencode's
  ``write``/``edit``, Gemini CLI's ``write_file``/``replace``, Anthropic's
  text editor tool, Codex's ``apply_patch`` (as a tool, or fed to its shell as
  a heredoc), and any tool whose name says it writes and whose arguments name
  a path. A call whose result states that it failed (or its API flags it so:
  ``ItemModel.result_failed``), or that its client refused or declined it,
  changed nothing and is left out; read-only tools are never artifacts.
- **commands** run by shell tools, with the exit status or first error line
  where the result states one (``proxy.context.keep.artifactparse``), ``refused:``
  and the client's reason where its client refused to run it
  (``proxy.context.keep.refusals``), and nothing where the result states
  nothing; a long one with its heredoc and here-string bodies shown as their
  line counts (``command_name``), so that the clip keeps what it did.

Lines are de-duplicated by path or command text, keeping the last touch, newest
last. ``collect`` costs O(range): it looks results up only for the calls the
range makes, in one pass from the range's start. The lead's checkpoints keep a
trail across compactions with ``merge`` and ``to_json``/``from_json``, and the
summary item shows it through ``render``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.context.items import ItemModel
from proxy.context.keep.artifactparse import (
    command_name,
    outcome,
    parsed_arguments,
    patch_files,
    patch_in_command,
)
from proxy.context.keep.toolkinds import EDITOR_COMMANDS, WRITE_VERBS, command_of, editor_command, path_of
from proxy.context.view.masking import answer_text
from proxy.types import Message

ARTIFACTS_HEADING = "## Artifact trail (from ctxproxy's log: exact, not model-written)"
DROPPED = "({count} older entries not shown; the log holds them)"
Kind = Literal["file", "command"]
_KINDS: frozenset[str] = frozenset({"file", "command"})
#: Argument names that hold the destination of a move (``toolkinds.PATH_KEYS`` hold the file a tool acts on).
DESTINATION_KEYS = ("destination", "destination_path", "new_path", "newPath", "dest", "target", "to")
PATCH_KEYS = ("input", "patch", "patchText", "patch_text", "diff")
#: A call as the trail knows it: the index of the item making it, and its key there (``ItemModel.calls``).
Call = tuple[int, str]


@dataclass(frozen=True)
class Artifact:
    """One line of the trail: a file and its last action, or a command and how it ended.

    ``action``: a file's ``created``, ``edited``, ``written`` (created or
    overwritten: the call does not say which), ``deleted``, ``moved from
    <old>`` / ``moved to <new>``; a command's ``exit 0``, ``exit N: <first
    error line>``, ``error: <line>``, ``refused: <the client's reason>`` (it
    never ran), or ``""`` when its result states no status (or has not come
    yet). ``index``/``seq``: the call's item in the
    conversation and in the log (-1 when not logged yet).
    """

    kind: Kind
    name: str
    action: str
    index: int
    seq: int


@dataclass(frozen=True)
class Result:
    """A call's result: its output text, whether it is flagged as an error, and its item's index."""

    text: str
    is_error: bool
    index: int = -1


def collect(dialect: ItemModel, messages: Sequence[Message], start: int, end: int,
            seqs: Sequence[int] = ()) -> list[Artifact]:
    """The trail of the calls made by ``messages[start:end]``, their results looked up in all of ``messages``.

    ``seqs[i]`` is the log seq of ``messages[i]`` where known. A call is known by its item and its key there: a
    key need not be unique across the conversation (a Gemini call without an ``id`` is ``name#k``, the k-th call
    of that name in its turn, in every turn), so two calls under one key are two lines.
    """
    calls = calls_in(dialect, messages, start, end)
    results = results_of(dialect, messages, start, calls)
    out: list[Artifact] = []
    for (index, call_id), (name, arguments) in calls.items():
        seq = seqs[index] if index < len(seqs) else -1
        for kind, subject, action in _artifacts(name, arguments, results.get((index, call_id))):
            out.append(Artifact(kind, subject, action, index, seq))
    return list(merge((), out))


def answered_calls(dialect: ItemModel, messages: Sequence[Message], start: int, end: int,
                   ) -> list[tuple[int, str, Any, str | None, bool]]:
    """Each call of ``messages[start:end]``: its item's index, tool name, arguments, result text (None: not
    answered yet) and whether the result carries an error flag; for readers beside the trail
    (``proxy.context.keep.literals``)."""
    calls = calls_in(dialect, messages, start, end)
    results = results_of(dialect, messages, start, calls)
    answered = [(call[0], name, arguments, results.get(call)) for call, (name, arguments) in calls.items()]
    return [(index, name, arguments, result.text if result is not None else None,
             result.is_error if result is not None else False) for index, name, arguments, result in answered]


def calls_in(dialect: ItemModel, messages: Sequence[Message], start: int, end: int) -> dict[Call, tuple[str, Any]]:
    """Each call ``messages[start:end]`` make, in call order: (item index, key) → (tool name, arguments). A call is
    known by its item and its key there: a key need not be unique across the conversation (a Gemini call without
    an ``id`` is ``name#k``, the k-th call of that name in its turn, in every turn)."""
    calls: dict[Call, tuple[str, Any]] = {}
    for index in range(max(start, 0), min(end, len(messages))):
        item = messages[index]
        for call_id in dialect.calls(item):
            found = dialect.call_of(item, call_id)
            if found is not None:
                calls.setdefault((index, call_id), found)
    return calls


def results_of(dialect: ItemModel, messages: Sequence[Message], start: int,
               calls: Collection[Call]) -> dict[Call, Result]:
    """The result of each call (``calls`` in conversation order), in one pass from ``start`` that stops once every
    call is answered: a result answers the latest call under its key made before it and not answered yet, so
    calls that share a key pair with their results by position.

    Each result is the item model's pairing of an id with its text (``ItemModel.answers``), so one that states
    no text (a Gemini ``functionResponse`` answering an image read with ``{}``) is answered with nothing stated
    and the results beside it keep their own; whether the API marks the output as a failed call's is the item
    model's word too (``ItemModel.result_failed``: Anthropic's ``is_error``, Gemini's ``error`` field, read
    before the output beside it).
    """
    waiting: dict[str, list[int]] = {}
    for index, call_id in calls:
        waiting.setdefault(call_id, []).append(index)
    found: dict[Call, Result] = {}
    for index in range(max(start, 0), len(messages) if calls else 0):
        item = messages[index]
        if not any(waiting.get(call_id) for call_id in dialect.results(item)):
            continue  # the common case, a result of no call asked about: its text is not read
        for answer in dialect.answers(item):
            made = waiting.get(answer.call_id)
            before = bisect.bisect_left(made, index) if made else 0
            if made and before:
                text, is_error = answer_text(dialect, item, answer)
                found[(made.pop(before - 1), answer.call_id)] = Result(text, is_error, index)
        if len(found) == len(calls):
            break
    return found


def _artifacts(name: str, arguments: Any, result: Result | None) -> list[tuple[Kind, str, str]]:
    """What one call did: the files it wrote (none if its result says it failed), or the command it ran."""
    args = parsed_arguments(arguments)
    lowered = name.lower()
    files: list[tuple[str, str]] | None = None
    if "patch" in lowered and (patch := patch_of(args)) is not None:
        files = patch_files(patch)
    elif isinstance(args, dict) and any(word in lowered for word, _ in WRITE_VERBS):
        files = _file_action(lowered, args)
    if files is None and isinstance(args, dict):
        command = command_of(lowered, args)
        if command is not None:
            patch = patch_in_command(command)
            if patch is None:
                status = outcome(result.text, result.is_error) if result is not None else ""
                return [("command", command_name(command), status)]
            files = patch_files(patch)
    if not files or (result is not None and failed(result)):
        return []
    return [("file", path, action) for path, action in files]


def patch_of(args: Any) -> str | None:
    if isinstance(args, str):
        return args
    if isinstance(args, dict):
        for key in PATCH_KEYS:
            if isinstance(args.get(key), str):
                return str(args[key])
    return None


def _file_action(lowered: str, args: dict[str, Any]) -> list[tuple[str, str]] | None:
    """The (path, action) a writing tool's arguments name: none when it only reads, None when they name no path."""
    path = path_of(args)
    if path is None:
        return None
    editor = editor_command(args)
    if editor is not None:
        action = EDITOR_COMMANDS[editor]
        return [(path, action)] if action is not None else []
    action = next(action for word, action in WRITE_VERBS if word in lowered)
    if action != "moved":
        return [(path, action)]
    target = next((args[key] for key in DESTINATION_KEYS if isinstance(args.get(key), str) and args[key]), None)
    return [(path, f"moved to {target}"), (target, f"moved from {path}")] if target else [(path, "edited")]


def failed(result: Result) -> bool:
    """Whether ``result`` says its call did not succeed: an error, a non-zero exit, a refusal."""
    status = outcome(result.text, result.is_error)
    return status.startswith(("error", "refused")) or (status.startswith("exit ") and status != "exit 0")


def merge(previous: Sequence[Artifact], new: Sequence[Artifact]) -> tuple[Artifact, ...]:
    """One line per (kind, name), the last touch's, ordered by last touch: newest last."""
    latest: dict[tuple[str, str], Artifact] = {}
    for artifact in (*previous, *new):
        latest.pop((artifact.kind, artifact.name), None)
        latest[(artifact.kind, artifact.name)] = artifact
    return tuple(latest.values())


def _line(artifact: Artifact) -> str:
    where = f"log #{artifact.seq}" if artifact.seq >= 0 else f"message {artifact.index}"
    if artifact.kind == "file":
        return f"- {artifact.name} — {artifact.action} ({where})"
    status = f" — {artifact.action}" if artifact.action else ""
    return f"- $ {artifact.name}{status} ({where})"


def _section(artifacts: Sequence[Artifact], dropped: int) -> str:
    lines = [ARTIFACTS_HEADING]
    if dropped:
        lines.append(DROPPED.format(count=dropped))
    kept = artifacts[dropped:]
    for kind, title in (("file", "Files:"), ("command", "Commands:")):
        rows = [_line(artifact) for artifact in kept if artifact.kind == kind]
        if rows:
            lines += [title, *rows]
    return "\n".join(lines)


def render(artifacts: Sequence[Artifact], budget: int, count: Callable[[str], int]) -> str:
    """The trail as a summary section within ``budget`` tokens (as ``count`` measures): ``""`` for none.

    The oldest lines give way first, and one line says how many did; ``""``
    when not even the heading and that line fit. Finding how many to drop
    takes O(log n) renderings.
    """
    if not artifacts:
        return ""
    if count(text := _section(artifacts, 0)) <= budget:
        return text
    low, high = 1, len(artifacts)  # the fewest to drop lies in [low, high] if any count fits
    while low < high:
        middle = (low + high) // 2
        if count(_section(artifacts, middle)) <= budget:
            high = middle
        else:
            low = middle + 1
    text = _section(artifacts, low)
    return text if count(text) <= budget else ""


def to_json(artifacts: Sequence[Artifact]) -> list[list[str | int]]:
    """The trail as compact JSON-able rows, ``[kind, name, action, index, seq]``, for a checkpoint."""
    return [[a.kind, a.name, a.action, a.index, a.seq] for a in artifacts]


def from_json(raw: Any) -> tuple[Artifact, ...]:
    """The trail ``to_json`` wrote; ValueError on anything else (a checkpoint from elsewhere must not pass as one)."""
    if not isinstance(raw, list):
        raise ValueError("an artifact trail is a list of rows")
    out: list[Artifact] = []
    for row in raw:
        if not (isinstance(row, list) and len(row) == 5 and row[0] in _KINDS and isinstance(row[1], str)
                and isinstance(row[2], str) and all(type(n) is int for n in row[3:])):
            raise ValueError(f"not an artifact row: {row!r:.80}")
        out.append(Artifact(row[0], row[1], row[2], row[3], row[4]))
    return tuple(out)
