"""The inspector's pages: the frame, sign-in, the sessions table, a session, one entry.

Everything from the log or the URL goes through ``markup.e``; the templates
only place HTML built here. Pages carry no inline script or style (the CSP
forbids both): behaviour is ``/ui/static/ui.js``, reading ``data-`` attributes.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlencode

import orjson

from proxy.blocks import content_text
from proxy.compactions import CompactionEvent
from proxy.context.keep.literals import coverage
from proxy.context.log.tiers import TierCounts
from proxy.render import fact_line, iso_time
from proxy.savings import UsageTotals, dialect_of, saved_text
from proxy.store.base import SessionInfo, SessionKey, StoredFact
from proxy.ui import csrf, template, tiers
from proxy.ui.markup import e, entry_html, message_html, text_html
from proxy.ui.plot import MarkLine, short, timeline_svg
from proxy.ui.timeline import Point, Timeline


def _signout(token: str) -> str:
    return (f'<form class="signout" method="post" action="/ui/signout">{csrf.field(token)}'
            '<button type="submit">Sign out</button></form>')


def layout(title: str, body: str, *, csrf_token: str | None, live: dict[str, str] | None = None) -> str:
    """The frame around ``body``; signed in (a sign-out form) when there is a ``csrf_token`` for its forms."""
    attrs = "".join(f' data-{name}="{e(value)}"' for name, value in (live or {}).items())
    nav = _signout(csrf_token) if csrf_token is not None else ""
    return template("page.html").substitute(title=e(title), nav=nav, main_attrs=attrs, body=body)


def signin_page(next_path: str, csrf_token: str, error: str = "") -> str:
    message = f'<p class="note warn">{e(error)}</p>' if error else ""
    form = template("signin.html").substitute(next=e(next_path), error=message, csrf=csrf.field(csrf_token))
    return layout("Sign in", form, csrf_token=None)


def message_page(title: str, text: str, *, csrf_token: str | None) -> str:
    return layout(title, f"<h1>{e(title)}</h1><p>{e(text)}</p>", csrf_token=csrf_token)


def disabled_page() -> str:
    """What ``/ui`` answers while the proxy has no admin token: how to turn the inspector on."""
    body = ("<h1>The inspector is off</h1><p>The inspector shows every tenant's sessions, so it is behind the admin "
            "token, and this proxy was started without one. Start it with an admin token, then open "
            "<code>/ui</code> again and sign in with that token:</p>"
            "<pre>ctxproxy serve --admin-token \"$(openssl rand -hex 24)\"</pre>"
            "<p>or set <code>CTXPROXY_ADMIN_TOKEN</code> in the proxy's environment. The same token opens the admin "
            "API (<code>/admin/…</code>).</p>")
    return layout("The inspector is off", body, csrf_token=None)


@dataclass(frozen=True)
class Links:
    """URLs of one session's pages; ``model`` (the window's model) is carried along."""

    key: SessionKey
    model: str = ""

    def _url(self, tail: str = "", **query: object) -> str:
        base = f"/ui/sessions/{quote(self.key.tenant, safe='')}/{quote(self.key.session, safe='')}{tail}"
        params = {k: str(v) for k, v in {**query, "model": self.model}.items() if v not in (None, "")}
        return f"{base}?{urlencode(params)}" if params else base

    def session(self, page: int | None = None) -> str:
        return self._url(page=page)

    def request(self, seq: int) -> str:
        return self._url(f"/requests/{seq}")

    def entry(self, seq: int) -> str:
        return self._url(f"/entries/{seq}")

    def live(self) -> str:
        return self._url("/live")

    def uncompact(self) -> str:
        return self._url("/uncompact")


@dataclass(frozen=True)
class SessionRow:
    info: SessionInfo
    latest: int | None
    totals: dict[tuple[str, str], int]
    savings: UsageTotals


def _totals(totals: dict[tuple[str, str], int]) -> str:
    return ", ".join(f"{trigger} {outcome}: {n}" for (trigger, outcome), n in sorted(totals.items())) or "—"


def _saved_cells(t: UsageTotals) -> str:
    """Client sent, model saw, saved (with its price where the model has one): tokens over the session's requests."""
    dollars = f" (${t.cost_saved:,.2f})" if t.cost_saved is not None else ""
    return (f'<td data-sort="{t.client_tokens}">{t.client_tokens:,}</td>'
            f'<td data-sort="{t.model_tokens}">{t.model_tokens:,}</td>'
            f'<td data-sort="{t.saved_tokens}">{t.saved_tokens:,}{e(dollars)}</td>')


def _meter(value: int | None, window: int) -> str:
    if value is None:
        return "—"
    return f'<meter min="0" max="{window}" value="{min(value, window)}"></meter> {value:,} / {window:,}'


def sessions_page(rows: Sequence[SessionRow], *, total: int, window: int, threshold: int, model: str,
                  csrf_token: str) -> str:
    head = "".join(f'<th data-type="{kind}"><button type="button">{e(name)}</button></th>' for name, kind in (
        ("tenant", "text"), ("session", "text"), ("entries", "num"), ("messages", "num"), ("checkpoints", "num"),
        ("compactions seen by this process", "text"), ("last activity", "num"), ("latest view", "num"),
        ("client sent", "num"), ("model saw", "num"), ("saved", "num")))
    body = []
    for row in rows:
        i = row.info
        link = Links(SessionKey(i.tenant, i.session), model).session()
        body.append(
            f'<tr><td>{e(i.tenant)}</td><td><a href="{e(link)}">{e(i.session)}</a></td>'
            f'<td data-sort="{i.entries}">{i.entries:,}</td><td data-sort="{i.messages}">{i.messages:,}</td>'
            f'<td data-sort="{i.checkpoints}">{i.checkpoints:,}</td><td>{e(_totals(row.totals))}</td>'
            f'<td data-sort="{i.updated_at}">{e(iso_time(i.updated_at))}</td>'
            f'<td data-sort="{row.latest if row.latest is not None else -1}">{_meter(row.latest, window)}</td>'
            f"{_saved_cells(row.savings)}</tr>")
    shown = f"{total:,} session{'s' if total != 1 else ''}"
    if total > len(rows):
        shown += f"; the {len(rows):,} most recently active shown"
    overall = UsageTotals()
    for row in rows:
        overall.merge(row.savings)
    intro = (f"<h1>Sessions</h1><p>{e(shown)}. The latest view is the upstream's prompt tokens for the session's "
             f"last request, against a {window:,}-token window (compaction above {threshold:,}; "
             "<code>?model=</code> picks the model whose window applies).</p>"
             f'<p class="saved">Over the sessions shown: {e(saved_text(overall))}.</p>')
    table = (f'<input id="filter" type="search" placeholder="Filter by text" aria-label="Filter sessions">'
             f'<table class="sessions sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')
    return layout("Sessions", intro + (table if rows else "<p>No sessions yet.</p>"), csrf_token=csrf_token)


def mark_lines(timeline: Timeline, events: Iterable[CompactionEvent]) -> list[MarkLine]:
    """A line per checkpoint (with its trigger and time when this process made it), and per failed attempt.

    A mark's figures are the bars' beside it (the model's count of the requests before and after it), not the
    compaction's own estimate of the messages, so the label and the bars agree.
    """
    events = list(events)
    made = {ev.view_key: ev for ev in events if ev.outcome in ("ok", "fallback") and ev.view_key}
    points = timeline.points
    lines = []
    for m in timeline.marks:
        ev = made.get(m.view_key)
        how = f"{ev.trigger} compaction in {ev.seconds:.1f} s" if ev is not None else "compaction"
        undone = f"; undone by entry #{m.retired_by}" if m.retired_by is not None else ""
        literals = f"; {coverage(m.literals)}" if m.literals else ""
        outcome = "retired" if m.retired_by is not None else "ok" if m.elided_from is None else "fallback"
        before = points[m.position - 1] if 0 < m.position <= len(points) else None
        after = points[m.position] if m.position < len(points) else None
        label, figures = tiers.LABELS[m.tier], []
        if before is not None and after is not None:
            label += f" {short(before.seen)}→{short(after.seen)}"
        if before is not None:
            figures.append(f"the request before it: model saw {before.seen:,} tokens")
        if after is not None:
            figures.append(f"the request after it: {after.seen:,}")
        told = f"; {', '.join(figures)}" if figures else ""
        lines.append(MarkLine(m.position, outcome, label, f"{how} (entry #{m.seq}): {m.what}{told}{literals}{undone}",
                              tier=m.tier))
    times = [p.ts for p in timeline.points]
    for ev in events:
        if ev.outcome not in ("ok", "fallback"):
            lines.append(MarkLine(bisect.bisect_right(times, ev.ts), ev.outcome, ev.outcome,
                                  f"{ev.trigger} compaction {ev.outcome} after {ev.seconds:.1f} s: {ev.detail}"))
    return lines


def _by_tier(t: Timeline) -> str:
    """The checkpoints in the log by the tier that made them, in the legend's words."""
    made = TierCounts()
    for m in t.marks:
        made.add(m.tier)
    return tiers.by_tier(made)


def summary_html(key: SessionKey, t: Timeline, events: Sequence[CompactionEvent], window: int,
                 threshold: int) -> str:
    k = t.kinds
    latest: Point | None = t.points[-1] if t.points else None
    seen = "—"
    if latest is not None:
        seen = (f"{_meter(latest.seen, window)} tokens" + ("" if latest.measured else " (estimated)")
                + f"; compaction above {threshold:,}")
    totals: dict[tuple[str, str], int] = {}
    for ev in events:
        totals[(ev.trigger, ev.outcome)] = totals.get((ev.trigger, ev.outcome), 0) + 1
    log = (f"{t.next_seq:,} entries: {k['message']:,} messages, {k['rewind']:,} rewinds, "
           f"{k['summary']:,} summaries, {k['checkpoint']:,} checkpoints ({k['retire']:,} undone)")
    rows: tuple[tuple[str, str], ...] = (("Log", log),
            ("Conversation now", f"{len(t.lineage.messages):,} messages, {t.prefix[-1]:,} tokens"),
            ("Upstream requests", f"{len(t.points):,}"),
            ("Compactions by tier", _by_tier(t)),
            ("Saved", saved_text(t.lineage.usage)),
            ("Compaction attempts seen by this process", _totals(totals)),
            ("Last activity", iso_time(t.updated_at)))
    if not t.complete:  # a long log is read a bounded stretch per look: the page updates as the rest is read
        rows = (("Read so far", f"the first {t.next_seq:,} entries of the log; the page updates as the rest is "
                                "read"), *rows)
    items = "".join(f"<dt>{e(name)}</dt><dd>{e(value)}</dd>" for name, value in rows)
    return (f'<h1>Session {e(key.session)} <small>tenant {e(key.tenant)}</small></h1><dl class="facts">{items}'
            f"<dt>Latest view</dt><dd>{seen}</dd></dl>")


LEGEND = ('<p class="legend"><span class="key bar"></span> model saw (hollow: estimated) '
          '<span class="key cached"></span> of which cached <span class="key sent"></span> client sent '
          '<span class="key window"></span> window <span class="key trigger"></span> compaction trigger. '
          'Compactions: ' + " ".join(f'<span class="key mark tier-{tier}"></span> {text}'
                                     for tier, text in tiers.LEGEND.items())
          + '. Click a request to see what the model saw.</p>')


def timeline_html(t: Timeline, events: Sequence[CompactionEvent], links: Links, window: int, threshold: int) -> str:
    svg = timeline_svg(t.points, mark_lines(t, events), window=window, threshold=threshold,
                       href=lambda p: links.request(p.seq))
    return svg + (LEGEND if t.points else "")


def undo_form(links: Links, seq: int, csrf_token: str) -> str:
    """The button that undoes the compaction at entry ``seq`` (``proxy.context.log.undo``), a POST with the CSRF
    token."""
    return (f'<form class="undo" method="post" action="{e(links.uncompact())}">{csrf.field(csrf_token)}'
            f'<input type="hidden" name="checkpoint" value="{seq}">'
            '<button type="submit" title="Retire this checkpoint and those made from it: the next request is built '
            'from the one it was made from, or from the whole history">Undo this compaction</button></form>')


def log_items(facts: Iterable[StoredFact], t: Timeline, links: Links, csrf_token: str) -> str:
    marks = {m.seq: m for m in t.marks}
    out = []
    for fact in facts:
        tokens = t.counter.message_tokens(dialect_of(fact), dict(fact.message), fact.hash) if fact.message else None
        request = links.request(fact.seq) if fact.kind == "message" and fact.source == "upstream" else None
        mark = marks.get(fact.seq)
        undo = undo_form(links, fact.seq, csrf_token) if mark is not None and mark.retired_by is None else ""
        out.append(entry_html(fact, tokens=tokens, mark=mark, entry_url=links.entry(fact.seq), request_url=request,
                              undo=undo))
    return "".join(out)


def _pager(page: int, pages: int, links: Links) -> str:
    if pages <= 1:
        return ""
    cells = [f'<a href="{e(links.session(p))}">{label}</a>' if p != page and 0 <= p < pages else f"<span>{label}</span>"
             for p, label in ((0, "first"), (page - 1, "previous"), (page + 1, "next"), (pages - 1, "last"))]
    return f'<nav class="pager">page {page + 1} of {pages}: {" · ".join(cells)}</nav>'


def session_page(key: SessionKey, t: Timeline, events: Sequence[CompactionEvent], facts: Sequence[StoredFact], *,
                 page: int, pages: int, links: Links, window: int, threshold: int, csrf_token: str) -> str:
    tail = page == pages - 1
    live = {"live": links.live(), "since": str(t.next_seq), "tail": "1" if tail else "0",
            "reading": "0" if t.complete else "1"}
    start = facts[0].seq if facts else 0
    body = (f'<section id="summary">{summary_html(key, t, events, window, threshold)}</section>'
            f'<section id="timeline">{timeline_html(t, events, links, window, threshold)}</section>'
            '<section id="request-panel" aria-live="polite"></section>'
            f'<section id="log-section"><h2>Log</h2>{_pager(page, pages, links)}'
            f'<ol id="log" class="log" start="{start}">{log_items(facts, t, links, csrf_token)}</ol>'
            f"{_pager(page, pages, links)}</section>")
    return layout(f"{key.session} ({key.tenant})", body, live=live, csrf_token=csrf_token)


def entry_page(key: SessionKey, fact: StoredFact, links: Links, *, csrf_token: str) -> str:
    message = fact.message or {}
    shown = (message_html(message, limit=None) if fact.kind == "message"
             else text_html(content_text(message.get("content")), label="text", limit=None, collapse=False))
    raw = orjson.dumps(orjson.loads(fact_line(fact)), option=orjson.OPT_INDENT_2).decode()
    body = (f'<p><a href="{e(links.session())}">← session {e(key.session)}</a></p>'
            f"<h1>Entry #{fact.seq}: {e(fact.kind)} from {e(fact.source)}</h1>{shown}"
            f"<details><summary>The entry as JSON</summary><pre>{e(raw)}</pre></details>")
    return layout(f"Entry #{fact.seq} of {key.session}", body, csrf_token=csrf_token)


def request_page(key: SessionKey, seq: int, section: str, links: Links, *, csrf_token: str) -> str:
    back = f'<p><a href="{e(links.session())}">← session {e(key.session)}</a></p>'
    return layout(f"Request at entry #{seq} of {key.session}", back + section, csrf_token=csrf_token)
