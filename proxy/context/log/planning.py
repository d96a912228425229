"""Planning: the facts that put a conversation into a session's tree of lineages, given what the log holds.

Pure functions of a ``ConversationState``: ``HistoryManager`` runs them as the
session's one writer and appends their result conditionally on the log's
length, so a plan is always made against the log it extends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxy.context.log.lineage import ROOT, ConversationState
from proxy.context.log.pending import PendingReply
from proxy.store.base import NewFact, Source
from proxy.types import Message


def rewind(index: int, from_seq: int, source: Source, extra: Mapping[str, Any] | None = None) -> NewFact:
    """A rewind entry: the next message takes position ``index`` and continues after message ``from_seq``."""
    return NewFact(kind="rewind", index=index, source=source,
                   extra={**(extra or {}), "from_seq": None if from_seq == ROOT else from_seq})


def plan_sync(
    state: ConversationState,
    messages: Sequence[Message],
    hashes: Sequence[str],
    upstream_from: int,
    pending: Mapping[str, PendingReply],
    extra_upstream: Mapping[str, Any],
    extra_client: Mapping[str, Any] | None = None,
    extra_rewind: Mapping[str, Any] | None = None,
    after: int | None = None,
    extra_opening: Callable[[], Mapping[str, Any]] | None = None,
) -> list[NewFact]:
    """The facts that make the log's head ``messages``: maybe a rewind, then only what the log lacks.

    What the log already holds, on the current lineage or on any other branch,
    is recognised (``ConversationState.locate``); when it is not the head, one
    rewind names the message the conversation continues from. Messages at
    ``upstream_from`` and beyond came from the upstream in this request; a new
    client message whose hash matches a reply kept in ``pending`` is logged as
    that reply, with its upstream source. ``extra_client`` goes with the client's own messages (their
    dialect), ``extra_rewind`` with a rewind (what the client did: e.g. compact its history itself),
    ``extra_opening()`` with a conversation's first message (what it opens with: ``ConversationState.openings``;
    called only then, since a request that continues its conversation, nearly every one, needs none).

    ``after``: ``messages`` are not a whole conversation but what follows message ``after`` (a Responses
    request with ``previous_response_id`` sends only what is new): they continue the lineage that ends there,
    and what the log already holds after it (a retry) is recognised the same way.
    """
    offset = 0
    if after is None:
        keep, base = state.locate(hashes)
    else:
        branch = state.known_prefixes(hashes, 0, base=after)
        keep, base = len(branch), state.seq_of_prefix(branch[-1]) if branch else after
        offset = state.position(after) + 1
    facts: list[NewFact] = []
    if base != state.head:
        facts.append(rewind(offset + keep, base, "client", extra_rewind))
    for i in range(keep, len(messages)):
        digest = hashes[i]
        source: Source = "client"
        message = messages[i]
        extra: Mapping[str, Any] = extra_client or {}
        if i >= upstream_from:
            source, extra = "upstream", extra_upstream
        elif digest in pending:
            source, message, extra = "upstream", pending[digest].message, pending[digest].extra
        elif offset + i == 0 and extra_opening is not None:
            extra = {**extra, **extra_opening()}
        facts.append(NewFact(kind="message", index=offset + i, source=source, message=message, hash=digest,
                             extra=extra))
    return facts


def plan_pending(state: ConversationState, record: PendingReply) -> list[NewFact]:
    """The facts that log ``record``'s reply after its base, leaving the head where it is; none if it is logged.

    ``state`` must know the record's base, which holds for any state of the
    session caught up at least as far as the one the record was made from.
    """
    branch = state.known_prefixes(record.digests, 0, base=record.base)
    done = len(branch)
    if done == len(record.digests):
        return []  # echoed by the client meanwhile, or an append whose acknowledgement was lost
    start = state.seq_of_prefix(branch[-1]) if branch else record.base
    head = state.head
    facts: list[NewFact] = []
    if start != head:
        facts.append(rewind(record.index + done, start, "proxy"))
    for k in range(done, len(record.tail)):
        index = record.index + k
        upstream = index >= record.upstream_from
        facts.append(NewFact(kind="message", index=index, source="upstream" if upstream else "client",
                             message=record.tail[k], hash=record.digests[k], extra=record.extra if upstream else {}))
    if start != head:
        facts.append(rewind(len(state.seqs), head, "proxy"))
    return facts
