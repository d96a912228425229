"""Updating a rolling summary section by section, so that it does not erode over many compactions.

Rewritten whole at every compaction, a summary loses a little each time: a
literal kept at step 1 is gone twenty rewrites later (a published study of
evolving contexts saw one monolithic rewrite shrink 18,282 tokens to 122). So
a later summary call is asked for the sections that change only, and the proxy
merges the answer into the previous summary here:

- a section the answer leaves out is carried over unchanged;
- a section it gives replaces the previous one (the model revises it), except
  when its body is empty or "None": that is taken for laziness, never for an
  order to erase what the section held;
- "Identifiers worth keeping" is extended, never rewritten: every previous line
  stays verbatim unless the answer retracts it (a line ``Superseded: TEXT``
  drops the previous lines containing TEXT), reassigns it (a line ``NAME=value``
  drops a previous ``NAME=…``), or repeats every word of it in the new lines
  (the literal is still there, in the new wording). These are the checks the
  proxy can make honestly from the text; it does not guess supersession.
- text outside the sections (an answer in which no section heading is
  recognised: another language, prose, numbered lines) is added to the
  previous summary's own text outside the sections, before the sections, which
  are all kept; only when the previous summary had no sections either is the
  answer a whole new summary, as before summaries were updated.

The merged summary is bounded (``trim``): over its budget, the oldest line of
the longest section goes first, and the section says how many it lost, rather
than the whole summary shrinking at the model's discretion.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.context.summary.summaryprompt import SECTIONS

#: How a section's title starts (lower case), for headings written without their number or in bold.
TITLE_KEYS = ("goals", "work completed", "key decisions", "files touched", "errors", "current state", "next steps",
              "identifiers")
#: The section that is extended, never rewritten.
IDENTIFIERS = len(SECTIONS)
#: Index of the text before the first heading (or of an answer with none).
PREAMBLE = 0
_NUMBERED = re.compile(r"(\d{1,2})\s*[.):]\s*(.*)")
_TRIMMED = re.compile(r"\[ctxproxy\] (\d+) older lines? trimmed")
_SUPERSEDED = re.compile(r"[-*\s]*superseded:\s*(.+)", re.IGNORECASE)
_ASSIGNMENT = re.compile(r"[-*\s`]*([A-Za-z_][\w.-]*)\s*=\s*\S")
_NONE = {"none", "none.", "- none", "n/a", "-"}
_WORD_EDGES = "`'\"()[]{}<>,;.:*-"

Count = Callable[[str], int]


@dataclass
class Section:
    """One section as written: its heading line ("" for the preamble), its lines, and how many were trimmed."""

    heading: str
    lines: list[str] = field(default_factory=list)
    trimmed: int = 0


def heading_index(line: str) -> int | None:
    """The section a line heads (1-based), or None: ``## N. Title``, ``## Title`` or ``**Title**``."""
    text = line.strip()
    hashed = text.startswith("#")
    if hashed:
        text = text.lstrip("#").strip()
    elif len(text) > 4 and text.startswith("**") and text.endswith("**"):
        text = text[2:-2].strip()
    else:
        return None
    text = text.strip("*").strip()
    numbered = _NUMBERED.fullmatch(text)
    if numbered is not None:
        number = int(numbered.group(1))
        if hashed and 1 <= number <= len(SECTIONS):
            return number
        text = numbered.group(2)
    title = text.rstrip(":").strip().lower()
    return next((index for index, key in enumerate(TITLE_KEYS, 1) if title.startswith(key)), None)


def parse(text: str) -> dict[int, Section]:
    """The sections of a summary by index; the text before the first heading is ``PREAMBLE`` (when not blank)."""
    sections: dict[int, Section] = {}
    current = Section("")
    sections[PREAMBLE] = current
    fenced = False  # inside a code block a "# 1. …" line is code, not a heading
    for line in text.strip().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        index = None if fenced else heading_index(line)
        if index is not None:
            current = sections.setdefault(index, Section(line.strip()))
            continue
        marker = _TRIMMED.fullmatch(line.strip())
        if marker is not None:
            current.trimmed += int(marker.group(1))
        elif line.strip() and line.strip().lower() not in _NONE:
            current.lines.append(line.rstrip())
    if not sections[PREAMBLE].lines and not sections[PREAMBLE].trimmed:
        del sections[PREAMBLE]
    return sections


def render(sections: dict[int, Section]) -> str:
    """The summary text: the preamble, then each section in order ("None" under an empty one)."""
    parts = []
    for index in sorted(sections):
        section = sections[index]
        body = ([f"[ctxproxy] {section.trimmed} older line{'s' if section.trimmed != 1 else ''} trimmed"]
                if section.trimmed else []) + section.lines
        if index == PREAMBLE:
            parts.extend(body)
        else:
            parts.append(section.heading)
            parts.extend(body or ["None"])
    return "\n".join(parts)


def _words(line: str) -> set[str]:
    return {word.strip(_WORD_EDGES) for word in line.split()} - {""}


def extend_identifiers(previous: Section | None, answer: Section) -> Section:
    """``previous`` with the answer's new lines added; a previous line goes only when retracted, reassigned or
    repeated word for word in the answer (see the module docstring)."""
    if previous is None:
        previous = Section(answer.heading)
    added: list[str] = []
    retracted: list[str] = []
    for line in answer.lines:
        superseded = _SUPERSEDED.fullmatch(line.strip())
        if superseded is not None:
            retracted.append(superseded.group(1).strip().strip("`"))
        else:
            added.append(line)
    names = {m.group(1) for m in map(_ASSIGNMENT.match, added) if m is not None}
    new_words = set().union(*map(_words, added)) if added else set()
    kept = []
    for line in previous.lines:
        assigned = _ASSIGNMENT.match(line)
        if (any(text in line for text in retracted) or (assigned is not None and assigned.group(1) in names)
                or (_words(line) and _words(line) <= new_words)):
            continue
        kept.append(line)
    return Section(previous.heading, kept + [line for line in added if line not in kept], previous.trimmed)


def merge(previous: str, answer: str) -> str:
    """``answer`` (the sections that change) merged into ``previous`` (see the module docstring)."""
    old, new = parse(previous), parse(answer)
    if not any(index != PREAMBLE for index in old) and not any(index != PREAMBLE for index in new):
        return answer.strip()
    merged = dict(old)
    for index, section in new.items():
        if index == PREAMBLE:
            before = old.get(PREAMBLE, Section(""))
            merged[index] = Section("", before.lines + [line for line in section.lines if line not in before.lines],
                                    before.trimmed)
        elif index == IDENTIFIERS:
            merged[index] = extend_identifiers(old.get(index), section)
        elif section.lines or index not in old:
            merged[index] = section
    return render(merged)


def trim(summary: str, budget: int, count: Count) -> str:
    """``summary`` within ``budget`` tokens: the oldest line of the longest section goes first, counted.

    Lines go by the characters the overshoot stands for, then the text is counted again: a few counts, not one
    per line."""
    tokens = count(summary)
    if tokens <= budget:
        return summary
    sections = parse(summary)
    text = summary
    while tokens > budget:
        excess = max(1, (tokens - budget) * len(text) // max(1, tokens))
        while excess > 0:
            full = [index for index, section in sections.items() if section.lines]
            if not full:
                return render(sections)
            longest = sections[max(full, key=lambda i: (sum(len(line) for line in sections[i].lines), -i))]
            excess -= len(longest.lines.pop(0)) + 1
            longest.trimmed += 1
        text = render(sections)
        tokens = count(text)
    return text


def update(previous: str | None, answer: str, budget: int, count: Count) -> str:
    """The summary after ``answer``: the answer itself for a first summary, else merged and kept within
    ``budget``."""
    if not previous or not previous.strip():
        return answer.strip()
    return trim(merge(previous, answer), budget, count)
