"""What a checkpoint did, in the inspector's words: which of the three tiers made it, and the messages it touched.

The log's ``checkpoint`` entry holds the checkpoint, not the tier that made it;
the tier is read off the change from the checkpoint it was made from: a masking
batch keeps that one's summary and split and masks further, the model-free tier
leaves an elided range (``Checkpoint.elision``), and anything else is a summary.
Each tier has its own label, colour (the stylesheet's ``tier-*`` classes) and
legend entry, so a page never calls a masking batch a summary.
"""

from __future__ import annotations

from proxy.context.checkpoint import Checkpoint, Tier

#: Short names for the timeline's marks and its legend.
LABELS: dict[Tier, str] = {"mask": "outputs shortened", "summary": "summarised", "fallback": "left out"}
#: The legend's words for each tier.
LEGEND: dict[Tier, str] = {
    "mask": "old tool outputs shortened (no model call)",
    "summary": "older messages summarised by the model",
    "fallback": "older messages left out: no summary could be made",
}


def tier_of(checkpoint: Checkpoint, previous: Checkpoint | None) -> Tier:
    """The tier that made ``checkpoint`` from ``previous`` (the one it was made from; None: the first)."""
    summary, split, elision = ((previous.summary, previous.retain_start_idx, previous.elision) if previous is not None
                               else ("", None, ""))
    same = checkpoint.summary == summary and checkpoint.elision == elision and (
        split is None or checkpoint.retain_start_idx == split)
    if same and checkpoint.masked_until > (previous.masked_until if previous is not None else 0):
        return "mask"
    return "fallback" if checkpoint.elision else "summary"


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
