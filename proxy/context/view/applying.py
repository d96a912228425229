"""Which checkpoint a view uses: the one made on the request's lineage, never one another credential made.

A session's log holds the checkpoints of every lineage and, once a second credential continues the session
(``proxy.http.continuity``), of every tenant that continued it. Taking the newest one whose covered prefix the
request holds let a second tenant's compaction of a shared start, made with its key, its tools and its model,
become the owner's view (the owner's view grew from 1,195 to 1,926 tokens, and text of the other tenant's tool
descriptions reached the owner's upstream inside "the summary"). So a checkpoint applies by what it covers:

- it covers a prefix the request holds (its prefix hash: ``ConversationState``);
- it was made under the requesting credential, or the request's proof of the session covers its whole range
  (``Requester``): a checkpoint another credential made is never this one's view on the strength of a link alone;
- of those, a checkpoint made from another (``made_from``: the one whose view it replaced) supersedes it, and the
  one covering the most of the request wins, the newest on a tie: the checkpoint made on the request's own
  lineage, not one a sibling lineage made of the shared start since.

Each checkpoint entry names its maker's tenant (``tenant``) and the checkpoint it was made from (``made_from``),
fields added to the entry beside the payload. An entry logged before them has neither: it is the session
owner's, and it was made from the checkpoint that served its covered prefix when it was logged (what the view
used then), which ``ConversationState`` works out when it folds the entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Requester:
    """Whom a view is built for: the request's own credential's ``tenant`` (None: anyone, as in a session only
    one credential uses; the engine's default), and ``proved``: how many leading items of the request its proof
    of the session covers when it continues another tenant's session (None: it is the session's own tenant)."""

    tenant: str | None = None
    proved: int | None = None

    def may_use(self, maker: str | None, covers: int) -> bool:
        """Whether a checkpoint ``maker`` made (None: the session's owner, before makers were recorded), covering
        ``covers`` items, may be this requester's view."""
        if self.tenant is None or maker == self.tenant:
            return True
        if self.proved is None:  # the owner: its own checkpoints, never a linked credential's
            return maker is None
        return self.proved >= covers


#: The engine's default: every checkpoint of the session may serve (a single-tenant session).
ANYONE = Requester()


@dataclass(frozen=True, slots=True)
class LiveCheckpoint:
    """A checkpoint entry not retired: its seq, its payload, the length of the prefix it covers, its maker's
    tenant (None: the owner's), the seq of the checkpoint it was made from (None: none), and ``ceiling``: the
    most any live checkpoint up to it covers (where ``choose`` stops looking)."""

    seq: int
    payload: Mapping[str, Any]
    covers: int
    maker: str | None
    made_from: int | None
    ceiling: int = 0


def choose(live: Sequence[LiveCheckpoint], holds: Callable[[LiveCheckpoint], bool],
           requester: Requester) -> int | None:
    """The index in ``live`` (oldest first) of the checkpoint the request's view uses, or None.

    ``holds`` tells whether the request holds a checkpoint's covered prefix. One pass, newest first: a
    checkpoint made from one that serves the request is seen before it, so what it supersedes is known in time;
    it stops where no older one covers more than the best so far (at once, on a lineage compacted step by step).
    """
    superseded: set[int] = set()
    best: int | None = None
    for at in range(len(live) - 1, -1, -1):
        entry = live[at]
        if best is not None and entry.ceiling <= live[best].covers:
            break
        if entry.seq in superseded:
            if entry.made_from is not None:
                superseded.add(entry.made_from)
            continue
        if not requester.may_use(entry.maker, entry.covers) or not holds(entry):
            continue
        if entry.made_from is not None:
            superseded.add(entry.made_from)
        if best is None or entry.covers > live[best].covers:
            best = at
    return best


def descendants(live: Sequence[LiveCheckpoint], at: int) -> list[int]:
    """Indexes in ``live`` of checkpoint ``live[at]`` and of every live one made from it, directly or not: what
    undoing it takes back (``proxy.context.log.undo``). Later entries only: a checkpoint is made from an older one."""
    gone = {live[at].seq}
    found = [at]
    for later in range(at + 1, len(live)):
        if live[later].made_from in gone:
            gone.add(live[later].seq)
            found.append(later)
    return found
