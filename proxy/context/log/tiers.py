"""Which tier made each checkpoint in the log, read one way for every surface that counts them.

The engine knows the tier when it writes a checkpoint (``CompactionResult.tier``) and
records it in the entry (``tier``, ``proxy.context.view.batches.checkpoint_fact``), so the
run's closing line, the demo's report and the inspector read it rather than each
guessing from what changed. An entry logged before it was recorded has its tier
derived from the checkpoint it was made from: a masking batch keeps that one's
summary, elision and split and masks further; the model-free tier leaves an elided
range (``Checkpoint.elision``); anything else is a summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args

from proxy.context.checkpoint import Checkpoint, Tier
from proxy.store.base import FactLog, SessionKey

TIERS: tuple[Tier, ...] = get_args(Tier)


def derived_tier(checkpoint: Checkpoint, previous: Checkpoint | None) -> Tier:
    """The tier that made ``checkpoint`` from ``previous`` (the one it was made from; None: the first), read off
    what changed: for an entry that does not say."""
    summary, split, elision = ((previous.summary, previous.retain_start_idx, previous.elision) if previous is not None
                               else ("", None, ""))
    same = checkpoint.summary == summary and checkpoint.elision == elision and (
        split is None or checkpoint.retain_start_idx == split)
    if same and checkpoint.masked_until > (previous.masked_until if previous is not None else 0):
        return "mask"
    return "fallback" if checkpoint.elision else "summary"


def tier_of_entry(extra: Mapping[str, Any], checkpoint: Checkpoint, previous: Checkpoint | None) -> Tier:
    """The tier a checkpoint entry (its ``extra``, holding ``checkpoint``) records, or for one logged before
    entries recorded it, the one derived from ``previous`` (the checkpoint it was made from)."""
    recorded = extra.get("tier")
    return recorded if recorded in TIERS else derived_tier(checkpoint, previous)


def plural(count: int, one: str, many: str) -> str:
    """``1 summary``, ``2 summaries``."""
    return f"{count:,} {one if count == 1 else many}"


@dataclass
class TierCounts:
    """Checkpoints by the tier that made them."""

    mask: int = 0
    summary: int = 0
    fallback: int = 0

    def add(self, tier: Tier) -> None:
        setattr(self, tier, getattr(self, tier) + 1)

    def merge(self, other: TierCounts) -> None:
        for tier in TIERS:
            setattr(self, tier, getattr(self, tier) + getattr(other, tier))

    def count(self, tier: Tier) -> int:
        return int(getattr(self, tier))

    def text(self) -> str:
        """``2 summaries, 5 masking batches, 1 model-free checkpoint`` (the tiers there were), or ``no
        compaction``."""
        said = [plural(n, one, many) for n, one, many in (
            (self.summary, "summary", "summaries"), (self.mask, "masking batch", "masking batches"),
            (self.fallback, "model-free checkpoint", "model-free checkpoints")) if n]
        return ", ".join(said) or "no compaction"


async def tiers_in_log(store: FactLog, key: SessionKey, page: int = 500) -> TierCounts:
    """The session's checkpoints by tier, every one logged (an undone one too: it was made). An entry that does
    not record its tier is read against the checkpoint it was made from (logged before entries said: the last)."""
    counts, made, after = TierCounts(), dict[int, Checkpoint](), -1
    last: int | None = None
    while facts := await store.read(key, after=after, limit=page):
        for fact in facts:
            payload = fact.extra.get("checkpoint")
            if fact.kind != "checkpoint" or not isinstance(payload, Mapping):
                continue
            try:
                checkpoint = Checkpoint.from_json(payload)
            except ValueError:
                continue
            made_from = fact.extra.get("made_from") if "made_from" in fact.extra else last
            counts.add(tier_of_entry(fact.extra, checkpoint, made.get(made_from) if type(made_from) is int else None))
            made[fact.seq], last = checkpoint, fact.seq
        after = facts[-1].seq
        if len(facts) < page:
            break
    return counts
