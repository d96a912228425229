"""The replay's report as text for people (``--json`` prints ``Report.to_json`` instead)."""

from __future__ import annotations

from proxy.context.keep.artifactparse import clip
from proxy.replay.lab import Report
from proxy.replay.probes import KINDS, Retention

CLOCKS = {"recorded": "the recording's times (a request after a gap writes its whole prompt)",
          "fixed": "fixed (the source records no times: every request mid-burst)"}
SUMMARISERS = {"none": "built-in, keeps nothing", "upstream": "the configured upstream"}
LABELS = {"paths": "written paths", "commands": "commands", "errors": "error lines",
          "constraints": "user constraints", "working_set": "working set (last 3 files, exact)"}


#: Lost probes shown per kind, and characters of each (a heredoc command is a whole file).
SHOWN, LINE_CHARS = 5, 120


def _share(kept: int, of: int) -> str:
    return f"{kept}/{of} ({kept / of:.0%})" if of else "-"


def _short(retention: Retention | None) -> str:
    if retention is None:
        return ""
    return " ".join(f"{kind}={kept}/{of}" for kind, kept, of in retention.counts)


def _money(value: float | None) -> str:
    return "n/a (no price for the model)" if value is None else f"${value:,.4f}"


def render(report: Report) -> str:
    lines = [f"# Replay: {report.dialect} session, model {report.model or '(unnamed)'}, window {report.window:,} "
             f"tokens, summariser {report.summariser} ({SUMMARISERS.get(report.summariser, '')})",
             f"{report.items:,} items, {report.steps:,} steps; probes {report.probes_from}", "",
             "## Compactions"]
    made = [c for c in report.compactions if c.outcome in ("ok", "fallback")]
    for c in made:
        lines.append(f"- step {c.step}: {c.trigger} {c.tier or '-'} {c.outcome}, {c.tokens_before:,} -> "
                     f"{c.tokens_after:,} tokens; prefix changes so far {c.prefix_changes}, cost so far "
                     f"{_money(c.cost)}; kept {_short(c.retention)}")
    if not made:
        lines.append("- none")
    if len(report.compactions) > len(made):
        lines.append(f"({len(report.compactions) - len(made)} attempts made no checkpoint)")
    lines += ["", "## At the end",
              f"last request {report.client_tokens:,} tokens as sent, its view {report.view_tokens:,} "
              f"(largest view {report.largest_view:,}); views over the window: {report.over_window}",
              f"prefix changes: {report.prefix_changes} of {max(report.steps - 1, 0)} steps",
              f"cost: {_money(report.cost)} through the proxy, {_money(report.cost_as_sent)} as sent (no window; "
              f"cache reads at the cached price)",
              f"clock: {CLOCKS[report.clock]}; requests after a gap past the cache's life: {report.cache_lapses}", "",
              "## Retention in the last view (beside plain truncation: the newest messages that fit)",
              f"{'':36} {'proxy':>14} {'truncation':>14}"]
    view = dict((k, (a, b)) for k, a, b in report.retention.counts) if report.retention else {}
    cut = dict((k, (a, b)) for k, a, b in report.truncation.counts) if report.truncation else {}
    for kind in KINDS:
        lines.append(f"{LABELS[kind]:36} {_share(*view.get(kind, (0, 0))):>14} {_share(*cut.get(kind, (0, 0))):>14}")
    return "\n".join(lines + _missed(report.retention))


def _missed(retention: Retention | None) -> list[str]:
    """What the last view lost, kind by kind: the first ``SHOWN`` of each, each on one line (``--json`` has all)."""
    lost = [(kind, names) for kind, names in retention.missed if names] if retention is not None else []
    if not lost:
        return []
    lines = ["", "## What the last view lost"]
    for kind, names in lost:
        lines.append(f"{LABELS[kind]}: {len(names)}")
        lines += [f"- {clip(name, LINE_CHARS)}" for name in names[:SHOWN]]
        if len(names) > SHOWN:
            lines.append(f"- and {len(names) - SHOWN} more (--json lists them all)")
    return lines
