"""The timeline as inline SVG: one slot per upstream request, the window and trigger lines, compaction marks.

Each slot is a link to its request's view (the page's script opens it in
place; without script it is a page of its own). A bar is what the model saw
(hollow when estimated), its darker foot the part the upstream read from its
prompt cache, and a line what the client sent. Past ``MAX_SLOTS`` requests,
consecutive requests share a slot (the largest figures of the group, linking
to its last request), so a session of any length draws at most that many.
Styling is the stylesheet's (classes only): the page's CSP allows no inline style.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.ui.markup import e
from proxy.ui.timeline import Point

WIDTH, HEIGHT = 960, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 14, 30
MAX_SLOTS = 400


@dataclass(frozen=True, slots=True)
class Slot:
    first: Point
    last: Point
    sent: int
    seen: int
    cached: int | None
    measured: bool


@dataclass(frozen=True, slots=True)
class MarkLine:
    """A compaction drawn before point ``position``; ``outcome`` styles it, ``title`` is its tooltip."""

    position: int
    outcome: str
    label: str
    title: str
    #: The tier that made it (``proxy.ui.tiers``), which colours it; empty for a failed attempt.
    tier: str = ""


def slots(points: Sequence[Point], limit: int = MAX_SLOTS) -> tuple[list[Slot], int]:
    """The slots to draw and how many requests each holds."""
    size = max(1, math.ceil(len(points) / limit))
    out = []
    for start in range(0, len(points), size):
        group = points[start:start + size]
        cached = [p.cached for p in group if p.cached is not None]
        out.append(Slot(group[0], group[-1], max(p.sent for p in group), max(p.seen for p in group),
                        max(cached) if cached else None, all(p.measured for p in group)))
    return out, size


def ticks(top: int) -> list[int]:
    """Round values from 0 up to ``top``, four or five of them."""
    raw = max(top, 1) / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [int(i * step) for i in range(int(top // step) + 1)]


def short(n: int) -> str:
    """12k, 1.9k, 640: a token count for a label."""
    if n >= 10_000:
        return f"{round(n / 1000)}k"
    return f"{n / 1000:.1f}".removesuffix(".0") + "k" if n >= 1000 else str(n)


def _title(slot: Slot, size: int) -> str:
    p = slot.last
    which = f"request {p.n + 1}" if size == 1 else f"requests {slot.first.n + 1}–{p.n + 1} (largest figures)"  # noqa: RUF001
    seen = f"model saw {slot.seen:,} tokens" + ("" if slot.measured else " (estimated)")
    if slot.cached is not None:
        seen += f", {slot.cached:,} cached"
    view = f" · view of {p.view_length} messages" if p.view_length is not None else ""
    return f"{which} · entry #{p.seq} · client sent {slot.sent:,} tokens ({p.index} messages) · {seen}{view}"


def timeline_svg(points: Sequence[Point], marks: Sequence[MarkLine], *, window: int, threshold: int,
                 href: Callable[[Point], str]) -> str:
    if not points:
        return '<p class="empty">No upstream requests in this log yet.</p>'
    drawn, size = slots(points)
    top = max(window, max(s.sent for s in drawn), max(s.seen for s in drawn), 1) * 21 // 20
    width, height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = width / len(drawn)

    def y(value: int) -> float:
        return TOP + height * (1 - value / top)

    def x(slot_position: float) -> float:
        return LEFT + slot_position * step

    out = [f'<svg class="timeline" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
           f'aria-label="Tokens per upstream request" data-requests="{len(points)}" data-slots="{len(drawn)}">']
    for tick in ticks(top):
        out.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
                   f'<text class="axis" x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{short(tick)}</text>')
    for cls, value, label in (("window", window, "window"), ("trigger", threshold, "compaction trigger")):
        out.append(f'<line class="{cls}" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}">'
                   f"<title>{e(label)}: {value:,} tokens</title></line>"
                   f'<text class="{cls}-label" x="{WIDTH - RIGHT - 4}" y="{y(value) - 4:.1f}" text-anchor="end">'
                   f"{e(label)} {value:,}</text>")
    bar = max(1.0, step * 0.7)
    for i, slot in enumerate(drawn):
        cx = x(i + 0.5)
        est = "" if slot.measured else " estimated"
        cached = ""
        if slot.cached:
            cached = (f'<rect class="cached" x="{cx - bar / 2:.1f}" y="{y(slot.cached):.1f}" width="{bar:.1f}" '
                      f'height="{y(0) - y(slot.cached):.1f}"/>')
        out.append(f'<a class="point{est}" href="{e(href(slot.last))}" data-seq="{slot.last.seq}">'
                   f"<title>{e(_title(slot, size))}</title>"
                   f'<rect class="bar" x="{cx - bar / 2:.1f}" y="{y(slot.seen):.1f}" width="{bar:.1f}" '
                   f'height="{y(0) - y(slot.seen):.1f}"/>{cached}'
                   f'<circle cx="{cx:.1f}" cy="{y(slot.seen):.1f}" r="3.5"/></a>')
    sent = " ".join(f"{x(i + 0.5):.1f},{y(s.sent):.1f}" for i, s in enumerate(drawn))
    out.append(f'<polyline class="sent" points="{sent}"/>')
    for mark in marks:
        mx = x(mark.position / size)
        near_end = mx > WIDTH - RIGHT - 170  # label on the line's left, inside the plot
        label = f'x="{mx - 3:.1f}" text-anchor="end"' if near_end else f'x="{mx + 3:.1f}"'
        row = TOP + (10 if mark.outcome == "ok" else 24)  # failures' labels a row lower: they sit beside a retry
        tier = f" tier-{e(mark.tier)}" if mark.tier else ""
        out.append(f'<g class="mark outcome-{e(mark.outcome)}{tier}"><title>{e(mark.title)}</title>'
                   f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{TOP}" y2="{TOP + height}"/>'
                   f'<text {label} y="{row}">{e(mark.label)}</text></g>')
    last = points[-1].n + 1
    out.append(f'<text class="axis" x="{LEFT}" y="{HEIGHT - 8}">request 1</text>'
               f'<text class="axis" x="{WIDTH - RIGHT}" y="{HEIGHT - 8}" text-anchor="end">request {last}</text>'
               "</svg>")
    return "".join(out)
