"""ConversationState: a session's log folded into a tree of lineages, with the current lineage spelled out.

A session's log is a tree (CONTRACT, "The fact log"): each ``message`` entry
continues the head, the message before it; a ``rewind`` moves the head to the
message entry its ``from_seq`` names (``null``: the start), so a side request
(opencode's title call), a retry or a return to an earlier branch costs one
entry and logs nothing twice. pi's session files, entries with parent ids, are
the model; here the parent is implied by log order, so a message entry carries
no extra field. A rewind written before lineages were a tree has no
``from_seq``: it continues from the message at ``index - 1`` of the lineage
current at that point, which is what it meant then.

The state keeps the current lineage as flat lists (``hashes``, ``prefixes``,
``seqs``: what planning and views read) plus a compact index of every message
ever logged, by seq: its parent, its position, its hash and its prefix hash
(the chain hash of the path to it, which names the whole path), and a map from
prefix hash to seq. A request is recognised by walking that map from where it
leaves the current lineage, one hash per message, so extending the lineage
costs what is new and returning to a branch costs that branch's length; the
log is never read for it. Strings are shared between the lineage and the
index, so a message costs about 100 bytes of index on top of the lineage
(states are cached for up to 10,000 sessions).

Checkpoints are kept whatever the lineage does: ``checkpoint_for`` serves a
conversation the checkpoint that covers the most of it among those it may use
(``proxy.context.view.applying``: made under its credential, or within its proof). A
``retire`` entry (an undo of a compaction: ``proxy.context.log.undo``) names a
checkpoint entry by its seq; from then on that checkpoint and every one made
from it (a masking one carries its summary, a rolling summary folds it) serve
nobody, and the one it was made from (or none) applies again; other lineages'
checkpoints stay. The log keeps every entry: retiring is a fact, not a deletion.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any, NamedTuple

from proxy.context.log.chain import chain_hash
from proxy.context.view.applying import ANYONE, LiveCheckpoint, Requester, choose, descendants
from proxy.store.base import StoredFact

#: The head before the first message: a rewind with ``from_seq: null`` returns there.
ROOT = -1
#: Parent slot of a fact that is not a message.
NOT_A_MESSAGE = -2
#: How a conversation key (``proxy.http.subagents.conversation``) ends when its requests offer tools: a client's
#: run does, its side calls (a title call, a quota probe, a next-speaker check) do not.
TOOLS = ":tools"
#: Memory one logged message costs a state, measured (its index entries, its place in the lineage, its hash
#: strings), and one checkpoint (its payload, with the summary text): what ``ConversationState.bytes`` counts.
MESSAGE_BYTES = 256
CHECKPOINT_BYTES = 4096
#: Upstream ``usage`` figures remembered per session, newest last; enough to survive a few lineage switches.
USAGES_KEPT = 4
#: Branch walks remembered per session (``ConversationState.known_prefixes``): a request's, and the few other
#: walks a request makes from the root (``proxy.context.log.continuity``).
WALKS_KEPT = 4


def common_prefix(known: Sequence[str], incoming: Sequence[str]) -> int:
    """Length of the longest common prefix of two hash lists."""
    n = min(len(known), len(incoming))
    if known[:n] == incoming[:n]:
        return n
    lo, hi = 0, n  # binary search: a prefix of equal lists is equal
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if known[:mid] == incoming[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def covered(payload: Mapping[str, Any]) -> int:
    """Length of the prefix a checkpoint payload depends on: what it summarised, and what it masks."""
    return max(int(payload.get("retain_start_idx", 0)), int(payload.get("masked_until", 0)))


class Measured(NamedTuple):
    """An upstream reply's ``usage``, the view it measured (key, length, last hash) and the proxy's own counts of it
    (``client``, ``view``): what the upstream counted more than the proxy carries over to a view the usage did not
    measure (``ContextBudgetPolicy.estimate``)."""

    usage: Mapping[str, Any]
    view: Mapping[str, Any] | None
    tokens: Mapping[str, Any] | None


@dataclass
class ConversationState:
    """The tree of lineages of one session, derived from its facts; never stored on its own."""

    next_seq: int = 0
    #: ``digest`` of the last fact folded: the append names the log's end by it, so a log that lost its tail and
    #: was written again to the same length is not taken for the one this state was folded from.
    tail: str | None = None
    #: The current lineage: message hashes, ``prefixes[i]`` the chain hash of ``hashes[: i + 1]``, and the seq
    #: of the fact that logged each message (names log entries in views).
    hashes: list[str] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    #: Every live checkpoint of the session (not retired), oldest first; each serves the lineages whose prefix hash
    #: it matches.
    live: list[LiveCheckpoint] = field(default_factory=list)
    #: The seqs of the checkpoints a ``retire`` entry took back.
    retired: set[int] = field(default_factory=set)
    #: Seq of the newest ``retire`` entry (-1: none): what a compaction planned before it must not overrule.
    last_retire: int = -1
    #: What the session's conversations open with (the ``opening`` of each first message): a request that shares
    #: no message with the log and opens otherwise is another agent's conversation (``proxy.http.subagents``).
    openings: set[str] = field(default_factory=set)
    #: Messages in the session's longest lineage, wherever the head is: whether it holds more than a side call
    #: (``proxy.http.subagents``) is not a question of the branch a title call left the head on.
    longest: int = 0
    #: Seq of the newest reply to a request that offered tools (its view's ``conversation`` ends in ``TOOLS``): the
    #: run's, whatever side calls (which offer none) were logged since (``proxy.render.run_end``).
    run_reply: int | None = None
    # The tree, indexed by seq (non-message facts hold NOT_A_MESSAGE / -1 / None).
    _parents: array[int] = field(default_factory=lambda: array("q"))
    _depths: array[int] = field(default_factory=lambda: array("i"))
    _node_hashes: list[str | None] = field(default_factory=list)
    _node_prefixes: list[str | None] = field(default_factory=list)
    _by_prefix: dict[str, int] = field(default_factory=dict)
    #: The last message logged from each upstream reply that has an id (``response_id``: the Responses API's,
    #: which a ``previous_response_id`` request continues).
    _by_response: dict[str, int] = field(default_factory=dict)
    #: (seq of the reply, its ``usage``, the view it measured, the proxy's counts beside it), newest last.
    _usages: list[tuple[int, Mapping[str, Any], Mapping[str, Any] | None, Mapping[str, Any] | None]] = field(
        default_factory=list)
    #: The newest walks of ``known_prefixes``, by the prefix hash each starts after: the message hashes walked and
    #: the prefix hashes found, never changed once kept.
    _walks: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        """What the state holds, estimated: a cache of states is bounded by it (``HistoryManager``)."""
        return len(self._parents) * MESSAGE_BYTES + len(self.live) * CHECKPOINT_BYTES

    @property
    def checkpoints(self) -> list[Mapping[str, Any]]:
        """The live checkpoints' payloads, oldest first."""
        return [entry.payload for entry in self.live]

    @property
    def checkpoint_seqs(self) -> list[int]:
        """The live checkpoints' seqs, oldest first."""
        return [entry.seq for entry in self.live]

    @property
    def head(self) -> int:
        """Seq of the current lineage's last message, ``ROOT`` before any."""
        return self.seqs[-1] if self.seqs else ROOT

    def apply(self, fact: StoredFact) -> None:
        """Fold one fact into the state. Facts arrive in seq order; one already folded is ignored.

        A catch-up read and an append's own result may both deliver the same
        fact, so folding is idempotent by seq.
        """
        if fact.seq < self.next_seq:
            return
        if fact.seq != self.next_seq:
            raise ValueError(f"fact {fact.seq} folded after {self.next_seq - 1}: the log has a gap")
        self.next_seq = fact.seq + 1
        self.tail = fact.digest
        if fact.kind == "message" and fact.hash is not None:
            self._add_node(fact.seq, fact.hash)
            opening = fact.extra.get("opening") if fact.index == 0 else None
            if isinstance(opening, str):
                self.openings.add(opening)
            if fact.source == "upstream":
                self._add_reply(fact)
            return
        self._parents.append(NOT_A_MESSAGE)
        self._depths.append(-1)
        self._node_hashes.append(None)
        self._node_prefixes.append(None)
        if fact.kind == "rewind":
            self._switch(self._rewind_target(fact))
        elif fact.kind == "checkpoint":
            self._add_checkpoint(fact)
        elif fact.kind == "retire":
            self._retire(fact)

    def _add_reply(self, fact: StoredFact) -> None:
        usage, reply, view = fact.extra.get("usage"), fact.extra.get("response_id"), fact.extra.get("view")
        view = view if isinstance(view, Mapping) else None
        if isinstance(reply, str):
            self._by_response[reply] = fact.seq
        if isinstance(usage, Mapping):
            tokens = fact.extra.get("tokens")
            self._usages = [*self._usages[1 - USAGES_KEPT:], (
                fact.seq, usage, view, tokens if isinstance(tokens, Mapping) else None)]
        conversation = view.get("conversation") if view is not None else None
        if isinstance(conversation, str) and conversation.endswith(TOOLS):
            self.run_reply = fact.seq

    def _add_checkpoint(self, fact: StoredFact) -> None:
        payload = fact.extra.get("checkpoint")
        if not isinstance(payload, Mapping):
            return
        try:
            covers = covered(payload)
        except (TypeError, ValueError):
            return  # unusable: no view could apply it
        maker = fact.extra.get("tenant")
        if "made_from" in fact.extra:
            made_from = fact.extra["made_from"]
            parent = made_from if type(made_from) is int else None
        else:  # logged before entries named it: the checkpoint that served its covered prefix then
            parent = self._served(covers, payload.get("prefix_hash"))
        self.live.append(LiveCheckpoint(fact.seq, payload, covers, maker if isinstance(maker, str) else None, parent,
                                        max(covers, self.live[-1].ceiling if self.live else 0)))

    def _served(self, covers: int, prefix: object) -> int | None:
        """The seq of the newest live checkpoint (any maker's) whose covered prefix starts the path that a prefix of
        ``covers`` messages hashed ``prefix`` names: what the view of that path used, under the rule of the time."""
        node = ROOT if covers == 0 else self._by_prefix.get(prefix) if isinstance(prefix, str) else None
        if node is None:
            return None
        for entry in reversed(self.live):
            if self._path_starts_with(node, entry.covers, entry.payload.get("prefix_hash")):
                return entry.seq
        return None

    def _path_starts_with(self, node: int, length: int, prefix: object) -> bool:
        """Whether the path from the root to message ``node`` starts with the ``length`` messages ``prefix`` names."""
        if length == 0:
            return True
        if node == ROOT or self._depths[node] + 1 < length:
            return False
        while self._depths[node] + 1 > length:
            node = self._parents[node]
        return self._node_prefixes[node] == prefix

    def lineage_through(self, covers: int, prefix: object) -> list[str]:
        """Message hashes of the newest logged conversation whose path starts with the ``covers`` messages hashed
        ``prefix`` (a checkpoint's covered prefix), the current lineage when none does.

        What a checkpoint served: a side call since (a title call on the
        run's first message) moved the head to a branch the checkpoint never
        covered, but the run's own newest message is still on its path.
        """
        seq = self.newest_through(covers, prefix)
        return self.path_to(seq)[1] if seq is not None else self.hashes

    def newest_through(self, covers: int, prefix: object) -> int | None:
        """Seq of the newest logged message whose path starts with the ``covers`` messages hashed ``prefix``."""
        for seq in range(len(self._parents) - 1, -1, -1):
            if self._parents[seq] != NOT_A_MESSAGE and self._path_starts_with(seq, covers, prefix):
                return seq
        return None

    def path_to(self, seq: int) -> tuple[list[int], list[str]]:
        """Seqs and hashes of the messages of the conversation that ends at message ``seq``, first to last."""
        seqs: list[int] = []
        hashes: list[str] = []
        node = seq
        while node != ROOT:
            digest = self._node_hashes[node]
            assert digest is not None  # a node on a path is a message
            seqs.append(node)
            hashes.append(digest)
            node = self._parents[node]
        return seqs[::-1], hashes[::-1]

    def _retire(self, fact: StoredFact) -> None:
        """Take back the checkpoint the entry names and the live ones made from it; naming no live one changes
        nothing."""
        gone = self.retiring(fact.extra.get("checkpoint_seq"))
        if gone:
            self.retired.update(self.live[at].seq for at in gone)
            for at in reversed(gone):
                del self.live[at]
            ceiling = 0
            for at, entry in enumerate(self.live):
                ceiling = max(ceiling, entry.covers)
                self.live[at] = replace(entry, ceiling=ceiling)
            self.last_retire = fact.seq

    def retiring(self, checkpoint_seq: object) -> list[int]:
        """Where in ``live`` checkpoint ``checkpoint_seq`` is, then every live one made from it: what retiring it
        takes back (empty when it is not a live checkpoint)."""
        if type(checkpoint_seq) is not int:
            return []
        at = bisect_left(self.live, checkpoint_seq, key=attrgetter("seq"))
        if at == len(self.live) or self.live[at].seq != checkpoint_seq:
            return []
        return descendants(self.live, at)

    @property
    def undone(self) -> bool:
        """Whether the newest reduction decision is an undo: no checkpoint was made since the last ``retire``."""
        return self.last_retire > (self.live[-1].seq if self.live else -1)

    def _add_node(self, seq: int, digest: str) -> None:
        prefix = chain_hash(self.prefixes[-1] if self.prefixes else "", digest)
        self._parents.append(self.head)
        self._depths.append(len(self.seqs))
        self._node_hashes.append(digest)
        self._node_prefixes.append(prefix)
        self._by_prefix[prefix] = seq
        self.hashes.append(digest)
        self.prefixes.append(prefix)
        self.seqs.append(seq)
        self.longest = max(self.longest, len(self.seqs))

    def _is_message(self, seq: int) -> bool:
        return 0 <= seq < len(self._parents) and self._parents[seq] != NOT_A_MESSAGE

    def _rewind_target(self, fact: StoredFact) -> int:
        from_seq = fact.extra.get("from_seq", NOT_A_MESSAGE)
        if from_seq is None:
            return ROOT
        if type(from_seq) is int and self._is_message(from_seq):
            return from_seq
        # Written before the log was a tree (or unreadable): the message before ``index`` on the current lineage.
        index = min(max(fact.index or 0, 0), len(self.seqs))
        return self.seqs[index - 1] if index else ROOT

    def _on_lineage(self, seq: int) -> bool:
        depth = self._depths[seq]
        return depth < len(self.seqs) and self.seqs[depth] == seq

    def _switch(self, target: int) -> None:
        """Make the lineage end at message ``target``: cut back to where its path joins, then follow the path."""
        path: list[int] = []
        node = target
        while node != ROOT and not self._on_lineage(node):
            path.append(node)
            node = self._parents[node]
        keep = self._depths[node] + 1 if node != ROOT else 0
        del self.hashes[keep:], self.prefixes[keep:], self.seqs[keep:]
        for seq in reversed(path):
            digest, prefix = self._node_hashes[seq], self._node_prefixes[seq]
            assert digest is not None and prefix is not None  # a node on a path is a message
            self.hashes.append(digest)
            self.prefixes.append(prefix)
            self.seqs.append(seq)

    def locate(self, hashes: Sequence[str]) -> tuple[int, int]:
        """How much of the conversation ``hashes`` the log holds, and the seq of its last logged message.

        The common prefix with the current lineage is found by comparison; from
        there the tree is walked by prefix hash, so a return to a known branch
        is recognised without reading anything.
        """
        shared = common_prefix(self.hashes, hashes)
        branch = self.known_prefixes(hashes, shared)
        if branch:
            return shared + len(branch), self._by_prefix[branch[-1]]
        return shared, self.seqs[shared - 1] if shared else ROOT

    def known_prefixes(self, hashes: Sequence[str], start: int, base: int | None = None) -> list[str]:
        """Prefix hashes of ``hashes[start:]`` for as long as the log holds that path.

        The path starts after message ``base`` (default: the current lineage's
        message at ``start - 1``); ``ROOT`` starts it at the beginning.
        The walk is remembered by where it starts (``_walks``), and a later one
        from there hashes only past what it shares with it: a run whose head
        a side call left on another branch (a title call on its first
        message) is walked whole once, not several times per request and
        again at every step.
        """
        if base is None:
            base = self.seqs[start - 1] if start else ROOT
        origin = (self._node_prefixes[base] or "") if base != ROOT else ""
        walked, found = self._walks.get(origin, ([], []))
        tail = list(hashes[start:])
        shared = common_prefix(walked, tail)
        out = found[:shared]  # a message never leaves the tree: what a walk found is there still
        for digest in tail[shared:]:
            seq = self._by_prefix.get(chain_hash(out[-1] if out else origin, digest))
            prefix = self._node_prefixes[seq] if seq is not None else None  # the tree's string: kept at no cost
            if prefix is None:
                break
            out.append(prefix)
        if len(out) == shared:
            return out
        walks = {begin: walk for begin, walk in self._walks.items() if begin != origin}
        walks[origin] = (tail[:len(out)], out)
        self._walks = dict(list(walks.items())[-WALKS_KEPT:])  # replaced whole: the offload pool may read it
        return out[:]

    def seq_of_prefix(self, prefix: str) -> int:
        return self._by_prefix[prefix]

    def after_response(self, response_id: str) -> int | None:
        """Seq of the last message logged from the upstream reply ``response_id``, if the log has it."""
        return self._by_response.get(response_id)

    def position(self, seq: int) -> int:
        """Position in its conversation of message ``seq`` (0 for the first)."""
        return self._depths[seq]

    def entries_for(self, hashes: Sequence[str], end: int) -> tuple[Sequence[int], Sequence[str]]:
        """Seqs and prefix hashes of ``hashes[:end]``'s messages, for as far as the log holds them.

        Follows the tree beyond the current lineage (a request on another branch
        than the last logged one), so names and keys of logged messages do not
        depend on which branch was logged last.
        """
        end = min(end, len(hashes))
        shared = len(hashes) if hashes is self.hashes else common_prefix(self.hashes, hashes)
        if shared >= end:
            return self.seqs[:end], self.prefixes[:end]
        branch = self.known_prefixes(hashes[:end], shared)
        return ([*self.seqs[:shared], *(self._by_prefix[p] for p in branch)],
                [*self.prefixes[:shared], *branch])

    @property
    def last_usage(self) -> Mapping[str, Any] | None:
        """The newest upstream ``usage`` measured on the current lineage (a reply on another branch does not count)."""
        found = self.usage_for(self.hashes)
        return found.usage if found is not None else None

    @property
    def last_view(self) -> Mapping[str, Any] | None:
        """The view (key, length, last hash) ``last_usage`` measured."""
        found = self.usage_for(self.hashes)
        return found.view if found is not None else None

    def usage_for(self, hashes: Sequence[str]) -> Measured | None:
        """The newest upstream ``usage`` measured on the conversation ``hashes``' path, with the view it measured and
        the proxy's own counts beside it.

        The path, not the current lineage: a side call the client sent since
        (a title call on the run's first message, a question on its history)
        moved the head to a branch of its own, and its reply measured another
        prompt (another system prompt, no tools); the run's next request
        estimated from it read hundreds of tokens short and was never compacted.
        """
        shared = common_prefix(self.hashes, hashes)
        branch: list[str] | None = None
        for seq, usage, view, tokens in self._usages[::-1]:
            depth = self._depths[seq]
            if depth < shared:
                if self.seqs[depth] == seq:
                    return Measured(usage, view, tokens)
                continue
            if branch is None:
                branch = self.known_prefixes(hashes, shared)
            if depth < shared + len(branch) and self._by_prefix[branch[depth - shared]] == seq:
                return Measured(usage, view, tokens)
        return None

    @property
    def checkpoint(self) -> Mapping[str, Any] | None:
        """The checkpoint the current lineage's view uses (any maker's)."""
        return self.checkpoint_for(self.hashes)

    def checkpoint_for(self, hashes: Sequence[str], requester: Requester = ANYONE) -> Mapping[str, Any] | None:
        """The checkpoint the view of ``hashes`` uses for ``requester`` (``proxy.context.view.applying.choose``), on
        whatever lineage it was made.

        Lets a request use the session's checkpoint before its own new messages
        are logged, and a lineage keep its checkpoint while another one was
        current: only the prefix the checkpoint covers has to agree, and its
        prefix hash proves that. Beyond the current lineage the request's
        prefix hashes come from the tree walk, computed only if a checkpoint
        needs them.
        """
        found = self._applying(hashes, requester)
        return dict(self.live[found].payload) if found is not None else None

    def checkpoint_seq_for(self, hashes: Sequence[str], requester: Requester = ANYONE) -> int | None:
        """The seq of the entry ``checkpoint_for(hashes, requester)`` comes from, or None."""
        found = self._applying(hashes, requester)
        return self.live[found].seq if found is not None else None

    def made_from_for(self, hashes: Sequence[str], requester: Requester = ANYONE) -> Mapping[str, Any] | None:
        """The checkpoint ``checkpoint_for(hashes, requester)`` was made from (its entry's ``made_from``), or None
        when it was made from none (or none applies). Live whenever the one made from it is: an undo retires a
        checkpoint with every one made from it."""
        found = self._applying(hashes, requester)
        parent = self.live[found].made_from if found is not None else None
        at = bisect_left(self.live, parent, key=attrgetter("seq")) if parent is not None else len(self.live)
        return dict(self.live[at].payload) if at < len(self.live) and self.live[at].seq == parent else None

    def _applying(self, hashes: Sequence[str], requester: Requester) -> int | None:
        if not self.live:
            return None
        shared = len(hashes) if hashes is self.hashes else common_prefix(self.hashes, hashes)
        branch: list[str] | None = None

        def holds(entry: LiveCheckpoint) -> bool:
            nonlocal branch
            idx = entry.covers
            if idx == 0:
                return True
            if idx <= shared:
                prefix = self.prefixes[idx - 1]
            else:
                if branch is None:
                    branch = self.known_prefixes(hashes, shared)
                if idx - shared > len(branch):
                    return False
                prefix = branch[idx - shared - 1]
            return prefix == entry.payload.get("prefix_hash")

        return choose(self.live, holds, requester)
