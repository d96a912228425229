"""The artifact trail as a checkpoint carries it: merged across compactions, bounded, rendered once.

``proxy.context.keep.artifacts`` reads files and commands out of tool calls; this
binds it to the compactor (``TrailMaker``): each compaction collects only the
range newly leaving the verbatim tail, merges it into what the previous
checkpoint carried, and renders the section within its token budget. The
rendering is stored in the checkpoint, so the summary item stays byte-identical
from step to step until the next compaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from proxy.context.compactor import TrailMaker
from proxy.context.items import ItemModel
from proxy.context.keep.artifacts import collect, from_json, merge, render, to_json
from proxy.types import Message

logger = logging.getLogger(__name__)

#: Lines a checkpoint keeps (the rendering shows as many of the newest as its budget allows): bounds the log entry.
MAX_ARTIFACTS = 1_000


def trail_maker(dialect: ItemModel, budget: int, count: Callable[[str], int]) -> TrailMaker:
    """The compactor's ``trail_of`` for one API, with ``budget`` tokens for the section."""

    def make(previous: tuple[object, ...], messages: Sequence[Message], start: int, end: int,
             seqs: Sequence[int]) -> tuple[tuple[object, ...], str]:
        try:
            carried = from_json([list(row) for row in previous if isinstance(row, list | tuple)])
        except ValueError:
            logger.warning("ignoring a malformed artifact trail in a checkpoint")
            carried = ()
        merged = merge(carried, collect(dialect, messages, start, end, seqs))[-MAX_ARTIFACTS:]
        return tuple(tuple(row) for row in to_json(merged)), render(merged, max(0, budget), count)

    return make
