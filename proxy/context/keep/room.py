"""How much of what the proxy carries a summary item may hold: the room a compaction must leave below the trigger.

A summary item carries, beside the model's summary, what the proxy keeps exactly from the log: the artifact
trail, the pins, the user's words, the files in hand (``proxy.context.keep.workingset``, up to their share of the
window) and the literals added back (``proxy.context.keep.literals``, their share and what the files leave of
theirs). Each part is bounded by its share, but their sum is not bounded by what the window leaves: replayed in a
57k window (docs/BENCHMARKS.md, "Replayed corpus, issue 33"), codex-meridianops' item took 27k, a summary left the
view 5.6k under the 45.9k trigger, the session grew 1.5-2k a step, and the trigger came back three to five steps
later (18 summaries in 133 steps, some two steps apart): each summary call and each rewrite of the prefix bought
almost nothing, and the run cost more through the proxy than sent directly.

The rule (issue 34's hysteresis between the trigger and the target): where a summary lands, the view sits at least
``DUE_STEPS`` steps of the session's growth (``proxy.context.view.batches.typical_growth``) below the trigger, the
distance at which a reduction counts as due (``proxy.context.view.worth``). Measured from where the next background
summary starts (the soft threshold, at least one step of growth below the trigger,
``ContextBudgetPolicy.soft_threshold``): ``DUE_STEPS - 1`` steps below it. And where it lands, not where it is
made: a background summary made at the soft threshold waits for the trigger mid-burst
(``proxy.context.view.holding``) and lands with the steps grown since, so it leaves room for those too. When the
parts would leave the view nearer, they give way, in this order, each down to its floor before the next gives
anything:

1. the literals (``literals``): ``add_back`` ranks them, so a smaller budget drops the heredoc writes longer than a
   literal first (a whole file each, the largest and the least needed: the files in hand hold the current text),
   then numbers, identifiers, versions, URLs, the shorter heredoc writes, resolved errors; down to their own share
   of the window (``LITERALS_SHARE``), so that what they borrowed from the files in hand's share goes first, and
   the unresolved errors, constraints, paths and commands ranked first stay;
2. the files in hand (``files``): ``render`` fills newest first, so a smaller budget drops the older files and
   shows the last of those left as its most recently touched region; down to ``FILES_FLOOR`` of the window, which
   holds the newest files. The checkpoint keeps the cap (``Checkpoint.files_cap``): a masking batch that renders
   the files again before the next summary stays within it (``proxy.context.keep.workingset.refreshed``).

What the floors hold stays even where the view then sits nearer the trigger: a view that loses the errors it must
fix or the file it is editing makes the agent re-run and re-read, which costs more steps than the summaries it
saves. Measured on the replayed corpus (docs/BENCHMARKS.md, "Replayed corpus, issue 33"): floors of 5 % of the
window each lost codex-flowdesk (18.7k window) two of its five error lines and five of its paths, and
gemini-saas-dashboard one of its last files. The trail, pins and user words do not give way here (each is small
and bounded by its own share).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.context.keep.literals import LITERALS_SHARE
from proxy.context.view.worth import DUE_STEPS

__all__ = ["FILES_FLOOR", "LITERALS_FLOOR", "Caps", "caps"]

#: Share of the window the literals keep whatever the room: their own, without what the files in hand lend.
LITERALS_FLOOR = LITERALS_SHARE
#: Share of the window the files in hand keep whatever the room (of their 15 %): the newest files whole.
FILES_FLOOR = 0.10


@dataclass(frozen=True)
class Caps:
    """Tokens each part may take in the summary item (None: its own budget, uncapped)."""

    literals: int | None = None
    files: int | None = None


def caps(*, view: int, soft: int, growth: int, literals: int, files: int, window: int, lands_after: int = 0) -> Caps:
    """The caps for a compaction whose view (``view`` tokens, its summary item holding ``literals`` tokens of
    literals and ``files`` of files in hand), once it lands, would sit within ``DUE_STEPS - 1`` steps of ``growth``
    of ``soft``, where the next summary starts (in the same measure): what the module's docstring says gives way,
    in its order, down to the floors (shares of ``window``). ``lands_after``: what the conversation grows before
    the checkpoint lands (a background summary made at ``soft`` waits for the trigger mid-burst,
    ``proxy.context.view.holding``: it lands with the steps since in its view). No caps when the view is far
    enough below, or the session does not grow."""
    excess = view + max(0, lands_after) - (soft - (DUE_STEPS - 1) * growth)
    if growth <= 0 or excess <= 0:
        return Caps()
    floor = int(window * LITERALS_FLOOR)
    from_literals = min(excess, max(0, literals - floor))
    from_files = min(excess - from_literals, max(0, files - int(window * FILES_FLOOR)))
    # The literals are capped whenever anything gives way (files that give way leave spare the literals would
    # borrow), never below their own share: a file that gives way may take out of the view a literal it held.
    return Caps(max(floor, literals - from_literals), files - from_files if from_files else None)
