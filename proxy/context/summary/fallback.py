"""The model-free tier: the reduction the proxy can always make, because it needs no model.

A summary needs a model that answers, in time, with something usable, through
an upstream that accepts the call. When none can be had (the call failed, timed
out or was refused twice, the failure backoff is open, the summary model is too
small for its input) and the view would still pass what the upstream accepts,
the proxy does not send it anyway: it elides the older turns itself. The split
is the one a summary would have used; what stands for the elided turns is what
the proxy can state exactly from the log:

- the previous model summary, as it was (it covers what came before);
- one marker naming the elided range: conversation indices and log entries,
  where the full text stays (``ctxproxy_recall`` and the inspector read it);
- the user's own words of that range, carried verbatim (``proxy.context.keep.userwords``);
- the artifact trail: files written and commands run (``proxy.context.keep.artifacts``).

The checkpoint records where the model's summary ends (``summarised_until``),
so the next compaction that gets a model summary starts there and folds the
elided range back in. A partial fold (a summary of the first chunks only, the
rest out of time) is the same checkpoint with a longer summary and a shorter
elided range.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.context.checkpoint import Checkpoint, Pin, UserWords, prefix_hash

ELISION = (
    "## Not summarised yet (elided by ctxproxy)\n"
    "Messages {first} to {last} of this conversation ({entries}) are not shown and no summary of them could be "
    "made yet. Their full text is kept in the proxy's fact log; the user's words and the files and commands of "
    "those messages are listed below, exactly as the log has them."
)


def elision_text(first: int, end: int, seqs: Sequence[int]) -> str:
    """The marker for ``messages[first:end]``; ``seqs`` (the log's seqs by conversation index) name the entries."""
    known = [seqs[i] for i in (first, end - 1) if 0 <= i < len(seqs) and seqs[i] >= 0]
    entries = f"log entries {known[0]} to {known[-1]}" if len(known) == 2 else "not all logged yet"
    return ELISION.format(first=first, last=end - 1, entries=entries)


def reduced_checkpoint(*, summary: str, summary_end: int, start: int,
                       opener: int | None, hashes: Sequence[str], masked_until: int, user_words: tuple[UserWords, ...],
                       artifacts: tuple[object, ...], trail: str, seqs: Sequence[int], model: str, created_at: float,
                       tokens_before: int, pins: tuple[Pin, ...] = (), working_set: tuple[object, ...] = (),
                       files: str = "") -> Checkpoint:
    """The checkpoint for a split at ``start`` whose model summary (``summary``) covers the conversation up to
    ``summary_end``; what lies between is elided behind a marker. A full summary has ``summary_end == start``
    and no marker; the model-free tier keeps the previous summary and its end. ``working_set`` and ``files``: the
    files in hand the summary item carries (``proxy.context.keep.workingset``)."""
    masked_until = masked_until if masked_until > start else 0  # a masked region elided or summarised is no more
    elided = summary_end < start
    return Checkpoint(
        summary=summary,
        retain_start_idx=start,
        prefix_hash=prefix_hash(hashes, max(start, masked_until)),
        round_start_idx=opener,
        tokens_before=tokens_before,
        tokens_after=0,
        model=model,
        created_at=created_at,
        masked_until=masked_until,
        user_words=user_words,
        summarised_until=summary_end if elided else -1,
        elision=elision_text(summary_end, start, seqs) if elided else "",
        artifacts=artifacts,
        trail=trail,
        pins=pins,
        working_set=working_set,
        files=files,
    )
