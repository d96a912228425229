"""Undoing a compaction: a ``retire`` entry appended to the log takes a checkpoint back.

Nothing is deleted: the checkpoint and its summary stay in the log, and the
``retire`` entry after them names the checkpoint's seq (``extra.checkpoint_seq``).
Folded (``ConversationState``), the checkpoint and every one made from it (a
masking one carries its summary, a rolling summary folds it: the entries'
``made_from``) no longer serve any lineage, so the next view of that lineage is
built from the checkpoint it was made from, or from the whole history, exactly
as it was before that compaction. Another lineage's checkpoints stay in force.
By default the newest live checkpoint is undone; undoing again takes back the
one before, as a stack.

An undo never lands in the middle of a compaction: it takes the session's
compaction lock (``proxy.context.log.sessionlock``, across processes and replicas),
and when a compaction holds it past ``UNDO_WAIT`` the undo is refused
(``CompactionRunning``, a 409), to be tried again once it is done. A compaction
it overruled would otherwise leave the request that waited for it with the
whole history, over the window (8,815 tokens went into a 6,000 window). After
an undo the next view compacts again once it passes the trigger, with the
model-free tier when no summary can be had: never over the window.

An undo is the newest decision about the session's reductions, so it is not
made again unasked: a compaction planned before it (a lock lost to a store
failure) appends nothing (``ContextEngine._record``; the request that waited for
it compacts again only when the view the undo left is over the window), and
until a request passes the compaction trigger again neither a background
summary nor a masking batch starts (``ConversationState.undone``).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.context.log.history import HistoryManager
from proxy.context.log.lineage import ConversationState
from proxy.context.log.sessionlock import CompactionLock
from proxy.errors import CompactionRunning, NothingToUndo
from proxy.store.base import NewFact, SessionKey

#: Seconds an undo waits for a compaction of its session to end before it is refused: an undo holds the lock for
#: one append (milliseconds), a compaction for its summary call (seconds to minutes).
UNDO_WAIT = 2.0


@dataclass(frozen=True, slots=True)
class Undone:
    """What an undo did: the checkpoint entries it retired (the one named, then those made from it), the ``retire``
    entry, and the checkpoint the view of the conversation it served uses now (None: the whole history): that
    conversation, not the log's head, which a side call since (a title call) left on a branch of its own."""

    retired: tuple[int, ...]
    entry: int
    now: int | None

    def to_json(self) -> dict[str, object]:
        return {"retired": list(self.retired), "entry": self.entry, "checkpoint": self.now}


def retire_fact(state: ConversationState, checkpoint_seq: int | None) -> NewFact:
    """The entry that retires checkpoint ``checkpoint_seq`` (None: the newest live one); ``NothingToUndo`` when
    that is no live checkpoint."""
    if checkpoint_seq is None:
        if not state.checkpoint_seqs:
            raise NothingToUndo("The session has no compaction left to undo.")
        checkpoint_seq = state.checkpoint_seqs[-1]
    elif checkpoint_seq in state.retired:
        raise NothingToUndo(f"The compaction at entry #{checkpoint_seq} is undone already.", param="checkpoint")
    elif checkpoint_seq not in state.checkpoint_seqs:
        raise NothingToUndo(f"Entry #{checkpoint_seq} is not a checkpoint of this session.", param="checkpoint")
    return NewFact(kind="retire", index=None, source="proxy", extra={"checkpoint_seq": checkpoint_seq})


async def uncompact(history: HistoryManager, key: SessionKey, checkpoint_seq: int | None = None) -> Undone:
    """Retire a checkpoint of ``key``'s session (``retire_fact``) under the session's compaction lock, waited for
    up to ``UNDO_WAIT`` seconds (``CompactionRunning`` past them); the append is planned on the log as it is, so two
    undos at once take back two checkpoints, never one twice. ``StoreError`` when the store fails."""
    retired: list[int] = []
    served: list[tuple[int, object]] = []  # the retired checkpoint's covered prefix: its length and prefix hash

    def plan(state: ConversationState) -> list[NewFact]:
        fact = retire_fact(state, checkpoint_seq)
        gone = state.retiring(fact.extra["checkpoint_seq"])
        retired[:] = [state.live[at].seq for at in gone]
        served[:] = [(state.live[gone[0]].covers, state.live[gone[0]].payload.get("prefix_hash"))]
        return [fact]

    async with CompactionLock(history.log, wait=UNDO_WAIT).held(key) as taken:
        if not taken:
            raise CompactionRunning("A compaction of this session is running; undo it once it is done.")
        state = await history.append_planned(key, plan)
    return Undone(tuple(retired), state.last_retire, state.checkpoint_seq_for(state.lineage_through(*served[0])))
