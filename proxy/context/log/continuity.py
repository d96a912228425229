"""What proves that a request continues a session: the rule that lets a new credential take a session up.

A session belongs to the tenant (the credential's hash) that made it. A request under another credential may
continue it (an OAuth access token refreshed mid-run) only by showing what only a party holding that
conversation can show: its items, hashed and chained as the log chains them (``ConversationState``), must be
the session's conversation from its first message, as far as the log goes:

- the request's leading items are a path of the log from its root, at least ``PROOF_MIN_ITEMS`` long, holding
  at least one assistant item (a model's words, which nobody guesses) and ``PROOF_MIN_TOKENS`` tokens, so a
  one-line conversation with a stock reply proves nothing;
- that path is the session's current lineage, all of it but at most ``PROOF_MAX_UNSEEN`` trailing entries the
  caller must check are the upstream's replies (one the client never got: an interrupted stream). So a party
  that knows how the session started, but not where it is now, proves nothing either: continuing a session
  gives nothing of it that the prover does not already hold, but the proxy's own summaries of it;
- and the request goes at most ``PROOF_MAX_NEW`` items past it (a refresh comes between two steps: the new
  items are one step's results). So a session made to look like the start of someone else's conversation
  (by a party that knows that start and the session id) does not capture that conversation's refresh.

Knowing the session id alone never suffices; a reference the proxy handed out for the session (``proxy.secret``)
is the other proof, checked where references are read.

What a proof gives is scoped to what it proved (``scope``, ``serves``): the credential is linked to the session
for conversations that extend the proved items only, so a later request that does not hold them (an empty one, a
short stock start, another conversation) is its own key's again, and nothing the session's owner did since
reaches it. Before any of this reads another tenant's session, the request's opening (``opening``) must be the
one noted for that tenant: a cheap comparison that fails the same way for an id held elsewhere and an absent one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.context.items import Item, ItemModel, leading_system_count
from proxy.context.log.chain import chain_hash
from proxy.context.log.lineage import ROOT, ConversationState

PROOF_MIN_ITEMS = 2
PROOF_MIN_TOKENS = 256
PROOF_MAX_UNSEEN = 4
PROOF_MAX_NEW = 32
#: Leading items ``holds`` compares: enough to pass the opening system and user items of any client.
HOLDS_SCAN = 16


@dataclass(frozen=True, slots=True)
class Proof:
    """A request's history matches a session's: ``matched`` leading items are the log's, and ``unseen`` are the
    seqs of the session's current lineage past them, which must be upstream replies for the proof to stand."""

    matched: int
    unseen: tuple[int, ...]


def proof(state: ConversationState, model: ItemModel, items: Sequence[Item], hashes: Sequence[str],
          tokens: Callable[[Item, str], int]) -> Proof | None:
    """The proof ``items`` (hashed ``hashes``) give of the session ``state`` folds, or None when they give none.

    ``tokens`` counts one item. Work: one chain hash per matched item, one count per item until the minimum.
    """
    lineage = len(state.seqs)
    if lineage == 0:
        return None
    path = state.known_prefixes(hashes, 0, ROOT)
    matched = len(path)
    shared = min(matched, lineage)
    if matched < PROOF_MIN_ITEMS or path[shared - 1] != state.prefixes[shared - 1]:
        return None  # too short, or a branch the session has left
    unseen = tuple(state.seqs[matched:])
    if len(unseen) > PROOF_MAX_UNSEEN or len(hashes) - matched > PROOF_MAX_NEW:
        return None
    if not any(model.role(item) == "assistant" for item in items[:matched]):
        return None
    total = 0
    for item, digest in zip(items[:matched], hashes[:matched], strict=True):
        total += tokens(item, digest)
        if total >= PROOF_MIN_TOKENS:
            return Proof(matched, unseen)
    return None


def holds(state: ConversationState, model: ItemModel, items: Sequence[Item], hashes: Sequence[str]) -> bool:
    """Whether the session ``state`` folds already holds this conversation: its opening up to an assistant item
    is a path of the log. Then the request is the session's own, and no other tenant's session is looked at."""
    path = state.known_prefixes(hashes[:HOLDS_SCAN], 0, ROOT)
    return any(model.role(item) == "assistant" for item in items[:len(path)])


def scope(hashes: Sequence[str], count: int) -> str:
    """The chain hash naming the first ``count`` items (hashed ``hashes``): what a link keeps of what proved it."""
    prefix = ""
    for digest in hashes[:count]:
        prefix = chain_hash(prefix, digest)
    return prefix


def serves(proved: int, prefix: str, hashes: Sequence[str]) -> bool:
    """Whether a link scoped to ``proved`` items chaining to ``prefix`` serves the conversation ``hashes``: it holds
    those items. A link with no scope (``prefix`` '', made before links had one) serves nothing."""
    return bool(prefix) and proved > 0 and len(hashes) >= proved and scope(hashes, proved) == prefix


def opening(model: ItemModel, items: Sequence[Item], hashes: Sequence[str]) -> str:
    """The chain hash of a conversation's opening: its leading system items and the first item after them ('':
    none). A proof holds the session from its first item, so it holds this; comparing it first keeps the store
    from reading a session a request cannot prove."""
    count = min(len(hashes), leading_system_count(model, items) + 1)
    return scope(hashes, count) if count else ""
