"""What a checkpoint did, in the inspector's words: which of the three tiers made it, and the messages it touched.

The tier is the one the log's ``checkpoint`` entry records (``proxy.context.log.tiers``,
which reads it the same way for the run's closing line and the demo's report).
Each tier has its own label, colour (the stylesheet's ``tier-*`` classes) and
legend entry, so a page never calls a masking batch a summary.
"""

from __future__ import annotations

from proxy.context.checkpoint import Checkpoint, Tier
from proxy.context.log.tiers import TierCounts

#: Short names for the timeline's marks and its legend.
LABELS: dict[Tier, str] = {"mask": "outputs shortened", "summary": "summarised", "fallback": "left out"}
#: The legend's words for each tier.
LEGEND: dict[Tier, str] = {
    "mask": "old tool outputs shortened (no model call)",
    "summary": "older messages summarised by the model",
    "fallback": "older messages left out: no summary could be made",
}


def by_tier(counts: TierCounts) -> str:
    """``outputs shortened: 3, summarised: 2, left out: 0``: checkpoints by tier in the legend's words."""
    return ", ".join(f"{LABELS[tier]}: {counts.count(tier):,}" for tier in LABELS)


def span(first: int, last: int) -> str:
    """``message 3``, ``messages 0-5`` (an en dash); empty for an empty range (never ``0--1``)."""
    if last < first:
        return ""
    return f"message {first}" if last == first else f"messages {first}–{last}"  # noqa: RUF001


def described(tier: Tier, *, first: int, retain_start: int, elided_from: int | None, masked_from: int,
              masked_until: int) -> str:
    """What the checkpoint did to the conversation, in words: "tool outputs of messages 4-9 shortened"."""
    if tier == "mask":
        outputs = span(masked_from, masked_until - 1)
        return f"tool outputs of {outputs} shortened" if outputs else "tool outputs shortened"
    if tier == "fallback" and elided_from is not None:
        summarised, left = span(first, elided_from - 1), span(elided_from, retain_start - 1)
        gone = f"{left} left out: no summary could be made" if left else "nothing left out"
        return f"{summarised} summarised, {gone}" if summarised else gone
    covered = span(first, retain_start - 1)
    return f"{covered} summarised" if covered else "nothing summarised"


def view_parts(checkpoint: Checkpoint, first: int) -> list[str]:
    """What a view under ``checkpoint`` has done to the messages after the ``first`` (system) ones, tier by tier."""
    parts = []
    if checkpoint.summary and (summarised := span(first, checkpoint.summary_end - 1)):
        parts.append(f"{summarised} summarised")
    if checkpoint.elision and (left := span(checkpoint.summary_end, checkpoint.retain_start_idx - 1)):
        parts.append(f"{left} left out: no summary could be made")
    if outputs := span(checkpoint.retain_start_idx, checkpoint.masked_until - 1):
        parts.append(f"tool outputs of {outputs} shortened")
    return parts
