"""The last resort when a view cannot fit: clip tool results, measured in tokens.

Compaction summarises what lies before the retained tail, but the tail always
keeps the last step, and one tool result there can be larger than the window (a
build log, a page of text with a screenshot). The upstream refuses such a view
on every retry, so it is cut here, and only here: when the view, with the tool
definitions and the answer reserve, is over the limit after compaction had its
chance. A view that fits is never touched.

What goes is the least that makes the view fit (water-filling): the text of
every tool result larger than a common cap is cut to the cap, and the cap is as
large as the limit allows, so the largest results are cut first and a result
under the cap is left whole. A cut text keeps its head and tail around a marker
naming its log entry. A non-text part (an image, audio, a file) cannot be cut:
it is replaced by a placeholder naming its entry only when the cap falls below
its size. Parts keep their other keys (``cache_control``). Nothing is written
back; the log keeps every result whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.context.items import ItemModel, Path, get_path, set_path
from proxy.context.view.budget import Estimate
from proxy.types import Message

CLIP_MARKER = "[… {count} characters elided by ctxproxy; full text in the fact log, {where} …]"
PART_PLACEHOLDER = "[{kind} part elided by ctxproxy; kept in the fact log, {where}]"
#: The widest name a marker may carry, to price markers before they are written.
_WIDEST_NAME = "entry seq 999999999"

#: Names the log entry of a conversation message: ``entry seq 12``, or ``message index 5`` before it is logged.
Namer = Callable[[Message], str]


class Measure(Protocol):
    """Token counts in the units of the budget's estimate (``ContextBudgetPolicy`` is one)."""

    def text_tokens(self, text: str) -> int: ...

    def part_tokens(self, part: Any) -> int: ...


@dataclass(frozen=True)
class _Unit:
    """One piece that can be cut: a string output (``part`` None) or one part of an output list."""

    message: int
    path: Path
    part: int | None
    tokens: int
    text: str | None  # None: a non-text part, replaced whole or kept


def _units(dialect: ItemModel, view: Sequence[Message], measure: Measure) -> list[_Unit]:
    units: list[_Unit] = []
    for position, message in enumerate(view):
        for path in dialect.result_paths(message):
            output = get_path(message, path)
            if isinstance(output, str):
                units.append(_Unit(position, path, None, measure.text_tokens(output), output))
            elif isinstance(output, list):
                for index, part in enumerate(output):
                    text = part.get("text") if isinstance(part, dict) else None
                    if isinstance(text, str):
                        units.append(_Unit(position, path, index, measure.text_tokens(text), text))
                    else:
                        units.append(_Unit(position, path, index, measure.part_tokens(part), None))
    return units


def _saved(units: Sequence[_Unit], cap: int, marker: int, placeholder: int) -> int:
    """Tokens saved by cutting every unit over ``cap``: text to the cap plus a marker, a part to a placeholder."""
    total = 0
    for unit in units:
        if unit.text is None:
            total += max(0, unit.tokens - placeholder) if unit.tokens > cap else 0
        else:
            total += max(0, unit.tokens - cap - marker)
    return total


def _largest_cap(units: Sequence[_Unit], excess: int, marker: int, placeholder: int) -> int:
    """The largest cap that saves at least ``excess`` (0, the most there is, when none does)."""
    low, high = 0, max(unit.tokens for unit in units)
    if _saved(units, low, marker, placeholder) < excess:
        return 0
    while low < high:  # _saved never grows with the cap
        mid = (low + high + 1) // 2
        if _saved(units, mid, marker, placeholder) >= excess:
            low = mid
        else:
            high = mid - 1
    return low


def _chars_within(limit: int, per_token: float, budget: int, tokens_of: Callable[[int], int]) -> int:
    """Most characters, up to ``limit``, whose piece counts at most ``budget`` tokens (within about 1 %).

    ``per_token`` is the text's characters per token, for the first guess; each
    correction rescales by what the last piece counted, a few tokenisations of
    about ``budget`` tokens in all. Never over ``budget``: a piece that no
    correction brought under it is dropped.
    """
    if budget <= 0 or limit == 0:
        return 0
    best = 0
    n = min(limit, int(budget * per_token))
    for _ in range(6):
        counted = tokens_of(n)
        if counted > budget:
            n = n * budget // (counted + 1)
        else:
            best = n
            if n == limit or counted * 100 >= budget * 99:
                break
            n = min(limit, n * budget // max(1, counted))
        if n <= best:
            break
    return best


def cut_text(text: str, tokens: int, cap: int, measure: Measure, where: str) -> str:
    """Head and tail of ``text``, ``cap`` tokens together, around a marker saying where the whole text is."""
    per_token = len(text) / max(1, tokens)
    head = _chars_within(len(text), per_token, cap // 2, lambda n: measure.text_tokens(text[:n]))
    rest = len(text) - head
    tail = _chars_within(rest, per_token, cap - cap // 2, lambda n: measure.text_tokens(text[len(text) - n:]))
    marker = CLIP_MARKER.format(count=rest - tail, where=where)
    return f"{text[:head]}\n{marker}\n{text[len(text) - tail:] if tail else ''}"


def clip_to_fit(dialect: ItemModel, view: Sequence[Message], excess: int, measure: Measure,
                name: Namer) -> list[Message] | None:
    """``view`` with tool results cut to save at least ``excess`` tokens, or None when none can be cut.

    Non-text parts over the cap go first (they cannot shrink in part), then the
    text is capped again for what is still missing, so text is not cut further
    than those parts' removal leaves necessary.
    """
    units = _units(dialect, view, measure)
    if not units or excess <= 0:
        return None
    marker = measure.text_tokens(CLIP_MARKER.format(count=10**9, where=_WIDEST_NAME)) + 2
    placeholder = measure.text_tokens(PART_PLACEHOLDER.format(kind="image_url", where=_WIDEST_NAME))
    cap = _largest_cap(units, excess, marker, placeholder)
    dropped = [u for u in units if u.text is None and u.tokens > cap]
    texts = [u for u in units if u.text is not None]
    still = excess - _saved(dropped, cap, marker, placeholder)
    text_cap = _largest_cap(texts, still, marker, placeholder) if texts and still > 0 else None
    cuts = [u for u in texts if text_cap is not None and u.tokens > text_cap + marker]
    if not dropped and not cuts:
        return None
    clipped = list(view)
    for unit in [*dropped, *cuts]:
        message = clipped[unit.message]
        where = name(view[unit.message])
        if unit.text is not None and text_cap is not None:
            replacement: Any = cut_text(unit.text, unit.tokens, text_cap, measure, where)
        else:
            replacement = None
        if unit.part is None:
            clipped[unit.message] = set_path(message, unit.path, replacement)
            continue
        parts = list(get_path(message, unit.path))
        part = parts[unit.part]
        if replacement is not None:
            parts[unit.part] = {**part, "text": replacement}
        else:
            kind = part.get("type") if isinstance(part, dict) else None
            text = PART_PLACEHOLDER.format(kind=kind if isinstance(kind, str) else "non-text", where=where)
            kept = {key: part[key] for key in ("cache_control",) if isinstance(part, dict) and key in part}
            parts[unit.part] = {"type": "text", "text": text, **kept}
        clipped[unit.message] = set_path(message, unit.path, parts)
    return clipped


def fit_by_clipping(dialect: ItemModel, view: Sequence[Message], excess: int, limit: int, measure: Measure,
                    name: Namer, estimate: Callable[[list[Message]], Estimate],
                    ) -> tuple[list[Message], Estimate] | None:
    """``view`` clipped until ``estimate`` puts it at ``limit`` or under, and that estimate; None if nothing can be cut.

    Markers and cut points are priced ahead, so one pass nearly always fits; a
    second (and third) pass asks for what the last one fell short by.
    """
    best: tuple[list[Message], Estimate] | None = None
    for _ in range(3):
        clipped = clip_to_fit(dialect, view, excess, measure, name)
        if clipped is None:
            break
        best = clipped, estimate(clipped)
        if best[1].tokens <= limit:
            break
        excess += best[1].tokens - limit
    return best


def entry_namer(messages: Sequence[Message], seqs: Sequence[int]) -> Namer:
    """Names a message of ``messages`` by the seq of its log entry (``seqs`` covers the logged prefix)."""
    positions = {id(m): i for i, m in enumerate(messages)}

    def name(message: Message) -> str:
        index = positions.get(id(message))
        if index is None:
            return "a message of this request"
        return f"entry seq {seqs[index]}" if index < len(seqs) else f"message index {index}"

    return name
