"""One upstream request rebuilt: the view as it went upstream, beside the conversation the client sent.

The view is the engine's own projection of the lineage at that request under
the checkpoint its logged ``view.key`` names, so it is what the proxy sent as
long as the settings that shape a view (the window, for the clip limit) are
the same; the logged view's length and last message tell, and the page says
when they differ. Where each view message came from is read off the
projection's output rather than re-derived: a message passed through is the
lineage's own object, a clipped one carries the projection's elision marker
(which names its index), and anything else is the summary.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.blocks import role_label
from proxy.context.compactor import Checkpoint
from proxy.context.items import ItemModel, leading_system_count
from proxy.context.view.clipping import CLIP_MARKER
from proxy.context.view.masking import PLACEHOLDER_PATTERN
from proxy.context.view.projection import ProjectionBuilder
from proxy.context.view.tokens import TokenCounter
from proxy.render import iso_time, replay
from proxy.store.base import FactLog, SessionKey
from proxy.types import Message
from proxy.ui.markup import e, message_html, message_preview
from proxy.ui.tiers import span, view_parts
from proxy.ui.timeline import Point

OriginKind = Literal["verbatim", "clipped", "masked", "summary"]
#: The marker ``proxy.context.view.clipping`` leaves in a clipped tool output: how much, and which entry holds it whole.
ELIDED = re.compile(re.escape(CLIP_MARKER).replace(r"\{count\}", "([0-9]+)").replace(
    r"\{where\}", "(?:entry seq ([0-9]+)|message index ([0-9]+))"))
#: The colours of the view's messages that are not the client's own.
VIEW_LEGEND = ('<p class="legend"><span class="key vm summary"></span> the summary '
               '<span class="key vm masked"></span> tool output shortened to a placeholder '
               '<span class="key vm clipped"></span> tool output clipped to fit the window</p>')
#: Rows of one run of summarised messages shown in the history column (the first and last halves).
MAX_RUN_ROWS = 200


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a view message came from: lineage message ``index`` as is, clipped, or the summary."""

    kind: OriginKind
    index: int | None
    elided: int = 0


def origins(view: Sequence[Message], messages: Sequence[Message], dialect: ItemModel,
            seqs: Sequence[int]) -> list[Origin]:
    positions = {id(m): i for i, m in enumerate(messages)}
    by_seq = {seq: i for i, seq in enumerate(seqs)}
    out = []
    for position, message in enumerate(view):
        index = positions.get(id(message))
        text = dialect.text(message)[0] if index is None else ""
        match = ELIDED.search(text) if index is None else None
        masked = PLACEHOLDER_PATTERN.search(text) if index is None and match is None else None
        if index is not None:
            out.append(Origin("verbatim", index))
        elif masked is not None:
            out.append(Origin("masked", by_seq.get(int(masked.group(1))) if masked.group(1) else int(masked.group(2))))
        elif match is not None:
            clipped = by_seq.get(int(match.group(2))) if match.group(2) else int(match.group(3))
            out.append(Origin("clipped", clipped, int(match.group(1))))
        elif dialect.role(message) == "system" and position < len(messages):
            out.append(Origin("summary", position))  # the system message the summary was appended to
        else:
            out.append(Origin("summary", None))
    return out


@dataclass(frozen=True)
class RequestView:
    point: Point
    messages: Sequence[Message]
    seqs: Sequence[int]
    view: list[Message]
    checkpoint: Checkpoint | None
    logged_view: Mapping[str, Any]
    reply: Mapping[str, Any]
    dialect: ItemModel
    #: The view settings now (``CompactionEngine.view_settings``), to name the one that changed since.
    settings: Mapping[str, object] = field(default_factory=dict)

    @property
    def clipped(self) -> frozenset[int]:
        """Positions of the view whose tool output went upstream cut to fit (the rebuild shows them whole)."""
        positions = self.logged_view.get("clipped")
        return frozenset(p for p in positions if isinstance(p, int)) if isinstance(positions, list) else frozenset()

    def matches(self) -> bool:
        """Whether the rebuilt view has the logged view's length and last message (or a last message clipped)."""
        if not self.view:
            return False
        last = len(self.view) - 1 in self.clipped or self.logged_view.get("last") == self.dialect.hash(self.view[-1])
        return self.logged_view.get("length") == len(self.view) and last


async def rebuild(store: FactLog, key: SessionKey, point: Point, checkpoint: Checkpoint | None,
                  projection: Callable[[ItemModel], ProjectionBuilder],
                  settings: Mapping[str, object] | None = None) -> RequestView:
    """Request ``point`` again: the lineage as it stood at its reply, projected under ``checkpoint``."""
    lineage = await replay(store, key, until=point.seq)
    reply = (await store.read(key, after=point.seq - 1, limit=1))[0]
    messages = lineage.messages[:point.index]
    logged = reply.extra.get("view")
    view = projection(lineage.dialect).build(messages, checkpoint, seqs=lineage.state.seqs,
                                             keys=lineage.state.prefixes)
    return RequestView(point, messages, lineage.state.seqs, view, checkpoint,
                       logged if isinstance(logged, Mapping) else {}, reply.message or {}, lineage.dialect,
                       settings or {})


def _figures(r: RequestView) -> str:
    p = r.point
    seen = f"model saw {p.seen:,} tokens" + ("" if p.measured else " (estimated: no usage in the reply)")
    if p.cached is not None:
        seen += f", {p.cached:,} from the prompt cache"
    text = f"Client sent {p.index:,} messages, {p.sent:,} tokens · view of {len(r.view):,} messages · {seen}"
    if r.checkpoint is not None:
        parts = view_parts(r.checkpoint, leading_system_count(r.dialect, r.messages))
        text += f" · compacted: {'; '.join(parts) or 'nothing yet'}"
    note = "" if r.matches() else (
        '<p class="note warn">This rebuilt view differs from the logged one (length '
        f'{e(r.logged_view.get("length", "unknown"))}, rebuilt {len(r.view):,}): {e(_why_different(r))}.</p>')
    return f'<p class="figures">{e(text)}</p>{note}'


def _why_different(r: RequestView) -> str:
    """What changed since the request went out, as far as its log entry tells: the window, a view setting."""
    reasons = []
    window = r.logged_view.get("window")
    if r.logged_view.get("learned_window") is True and isinstance(window, int):
        reasons.append(f"it went out under a {window:,}-token window the upstream taught the proxy (smaller than "
                       "the configured one), and was fitted to it")
    logged = r.logged_view.get("settings")
    if isinstance(logged, Mapping):
        for name, now in r.settings.items():
            if name in logged and logged[name] != now:
                reasons.append(f"--{name.replace('_', '-')} was {logged[name]!r} then and is {now!r} now")
    if reasons:
        return "; ".join(reasons)
    if isinstance(logged, Mapping):
        return ("its log entry names no setting that changed since; pass ?model= if the session's model has a window "
                "of its own")
    return ("the request was logged before the proxy recorded the settings that shape a view, so which one changed "
            "cannot be told")


def _view_rows(r: RequestView, kinds: list[Origin], counter: TokenCounter, entry: Callable[[int], str]) -> str:
    rows = []
    summarised = _summarised_span(r, kinds)
    for message, origin in zip(r.view, kinds, strict=True):
        tokens = f"{counter.message_tokens(r.dialect, message):,} tokens"
        at = f"[{origin.index}] " if origin.index is not None else ""
        badge = ""
        if origin.kind == "summary":
            badge = f'<span class="badge summary">summary · stands in for {e(summarised)}</span>'
        elif origin.kind in ("clipped", "masked") and origin.index is not None:
            link = entry(r.seqs[origin.index]) if origin.index < len(r.seqs) else ""
            if origin.kind == "masked":
                label = "masked · a placeholder stands in for the output"
            elif origin.elided:
                label = f"clipped · {origin.elided:,} characters elided"
            else:
                label = "clipped to fit the window when it went upstream · shown whole here"
            badge = (f'<span class="badge {origin.kind}">{e(label)}</span> '
                     + (f'<a href="{e(link)}">whole output</a>' if link else ""))
        rows.append(f'<li class="vm {origin.kind}"><div class="head">{e(at)}<b>{e(role_label(message))}</b> '
                    f"{e(tokens)} {badge}</div>{message_html(message)}</li>")
    return "".join(rows)


def _summarised_span(r: RequestView, kinds: list[Origin]) -> str:
    kept = {o.index for o in kinds if o.index is not None}
    gone = [i for i in range(len(r.messages)) if i not in kept]
    if not gone:
        return "nothing"
    return f"messages {gone[0]}–{gone[-1]} ({len(gone):,})" if len(gone) > 1 else f"message {gone[0]}"  # noqa: RUF001


def _history_rows(r: RequestView, kinds: list[Origin], entry: Callable[[int], str]) -> str:
    status = dict.fromkeys(range(len(r.messages)), "elided")
    for origin in kinds:
        if origin.index is not None:
            status[origin.index] = "verbatim" if origin.kind not in ("clipped", "masked") else "clipped"

    def row(i: int) -> str:
        link = entry(r.seqs[i]) if i < len(r.seqs) else ""
        seq = f'<a class="seq" href="{e(link)}">#{r.seqs[i]}</a> ' if link else ""
        return (f'<li class="hm {status[i]}"><div class="head">{seq}[{i}] <b>{e(role_label(r.messages[i]))}</b>'
                f"</div><p>{e(message_preview(r.messages[i]))}</p></li>")

    rows, i = [], 0
    while i < len(r.messages):
        if status[i] != "elided":
            rows.append(row(i))
            i += 1
            continue
        end = i
        # The model-free tier's range is left out, not summarised: a run stops where it starts.
        left_from = r.checkpoint.summary_end if r.checkpoint is not None and r.checkpoint.elision else None
        stop = left_from if left_from is not None and i < left_from else len(r.messages)
        while end < min(stop, len(r.messages)) and status[end] == "elided":
            end += 1
        shown = list(range(i, end))
        if len(shown) > MAX_RUN_ROWS:
            half = MAX_RUN_ROWS // 2
            shown = [*shown[:half], -1, *shown[-half:]]
        inner = "".join(row(j) if j >= 0 else f'<li class="gap">… {end - i - MAX_RUN_ROWS:,} more</li>'
                        for j in shown)
        what = ("left out: no summary could be made" if left_from is not None and i >= left_from
                else "summarised: the summary stands in for them")
        rows.append(f'<li class="hm elided run"><details><summary>{e(span(i, end - 1))} ({end - i:,}) {e(what)}'
                    f"</summary><ol>{inner}</ol></details></li>")
        i = end
    return "".join(rows)


def request_html(r: RequestView, counter: TokenCounter, *, entry: Callable[[int], str]) -> str:
    """The request's section: figures, the view and the history side by side, and the reply."""
    kinds = [Origin("clipped", origin.index) if position in r.clipped and origin.kind == "verbatim" else origin
             for position, origin in enumerate(origins(r.view, r.messages, r.dialect, r.seqs))]
    p = r.point
    # --shadow: the view was computed and logged, and the client's request went upstream unchanged.
    title = ("Shadow view: what the proxy would have sent (the client's request went upstream unchanged)"
             if r.logged_view.get("shadow") is True else "As sent upstream")
    return (f'<section class="request" id="request-view" data-seq="{p.seq}">'
            f"<h2>Request {p.n + 1} · entry #{p.seq} · {e(iso_time(p.ts))}</h2>{_figures(r)}"
            f'<div class="columns"><div class="col"><h3>{e(title)}</h3>'
            f'{VIEW_LEGEND}<ol class="view">{_view_rows(r, kinds, counter, entry)}</ol></div>'
            '<div class="col"><h3>The conversation the client sent</h3>'
            f'<ol class="history">{_history_rows(r, kinds, entry)}</ol></div></div>'
            f'<h3>The reply</h3><div class="reply">{message_html(r.reply)}</div></section>')
