"""The checkpoint: what a reduction of the view leaves in the log, and the prefix it depends on.

Compaction never touches a message: every reduction (a summary, tier 2, or
masked tool outputs, tier 1) is a ``Checkpoint`` appended to the log, which
the projection applies on every later call. Its ``prefix_hash`` names the exact
conversation prefix it was made for, so it serves every lineage that shares
that prefix and no other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from typing import Any, Literal

import orjson

from proxy.context.log.chain import chain_hash
from proxy.context.summary.callusage import CallUsage

#: ``fallback``: no usable summary could be had and the model-free tier (``proxy.context.summary.fallback``) stood in.
CompactionOutcome = Literal["ok", "failed", "timeout", "skipped", "fallback"]
#: Which reduction a compaction made: masked tool outputs (no model call), a summary, or the model-free tier.
Tier = Literal["mask", "summary", "fallback"]

#: Version 2 added ``masked_until`` and ``user_words``; version 3 ``summarised_until``, ``elision``, ``artifacts``
#: and ``trail``; ``working_set`` and ``files`` came after it, additive (absent: none), as did ``literals``,
#: ``literals_text`` and ``literal_receipt``. An older checkpoint reads as one without them.
CHECKPOINT_FORMAT = 3
READABLE_FORMATS = (1, 2, 3)
#: One user message carried verbatim: its conversation index, the seq of its log entry (-1: not known),
#: its tokens as carried, its text as carried (clipped head and tail when the budget required it), and how many
#: messages the entry stands for (1; more for the line that folds the oldest: ``proxy.context.keep.userwords``).
UserWords = tuple[int, int, int, str, int]
#: Fields added within version 3, each read as empty where absent (``Checkpoint.from_json``) and written only where
#: it holds something (``Checkpoint.to_json``).
ADDITIVE = ("pins", "working_set", "files", "files_cap", "literals", "literals_text", "literal_receipt")
#: One pinned text (``proxy.context.keep.pins``): its source (a file's path, or the user), the seq of the log entry it
#: comes from (-1: not known), its tokens, and its text ("" when left out for the pin budget).
Pin = tuple[str, int, int, str]


def prefix_hash(hashes: Sequence[str], end: int) -> str:
    """Chain hash over ``hashes[:end]``, folded from ``""``: names the exact prefix a checkpoint covers."""
    digest = ""
    for message_digest in hashes[:end]:
        digest = chain_hash(digest, message_digest)
    return digest


def _required(spec: Field[Any]) -> bool:
    return spec.default is MISSING and spec.default_factory is MISSING


def _default(spec: Field[Any]) -> Any:
    return spec.default_factory() if spec.default_factory is not MISSING else spec.default


@dataclass(frozen=True)
class Checkpoint:
    """A reduction of the view: a summary of ``messages[:retain_start_idx]`` (leading system messages excepted)
    and masked tool outputs in ``messages[retain_start_idx:masked_until]``.

    ``round_start_idx`` is the user message opening the round that the split
    falls inside, or ``None`` when the split is at a round boundary. A masking
    checkpoint (tier 1, ``proxy.context.view.masking``) keeps the previous summary
    as it is, or has none (``summary == ""``: the view shows no summary item).
    ``user_words`` are the user's messages that left the verbatim tail, carried
    verbatim after the summary (``proxy.context.keep.userwords``). ``prefix_hash``
    names ``messages[:covers]``: everything the checkpoint's view depends on,
    so a rewind never gets a view masking an item it does not have.

    ``summarised_until`` is where the model's summary ends (-1: at
    ``retain_start_idx``). When it ends earlier, the model-free tier
    (``proxy.context.summary.fallback``) elided ``messages[summarised_until:retain_start_idx]``
    behind ``elision``, a marker naming their log range; the next model summary
    starts there and folds them back in. ``artifacts`` are the files and
    commands of everything before the split (``proxy.context.keep.artifacts``, as
    JSON), and ``trail`` their rendering in the summary item: both written by
    the proxy from the log, never by the model. ``pins`` are the instruction
    files and user-pinned text that left the tail, carried verbatim
    (``proxy.context.keep.pins``). ``working_set`` names the files whose exact text
    the summary item carries (``proxy.context.keep.workingset``: ``[path, seq it is
    current as of, index, first line, last line]``) and ``files`` is that section;
    ``files_cap`` the tokens the section was capped to so that the summary left
    room below the trigger (``proxy.context.keep.room``; 0: its own budget), which
    a masking that renders it again keeps (``proxy.context.keep.workingset.refreshed``).
    ``literals`` are the exact literals of everything compacted
    (``proxy.context.keep.literals``, as JSON), ``literals_text`` those the view
    lacked without them, added back, and ``literal_receipt`` the compaction's
    receipt (``in_range``, ``kept``, ``added``, ``dropped``; empty: made before
    literals were checked).
    """

    summary: str
    retain_start_idx: int
    prefix_hash: str
    round_start_idx: int | None
    tokens_before: int
    tokens_after: int
    model: str
    created_at: float
    masked_until: int = 0
    user_words: tuple[UserWords, ...] = ()
    summarised_until: int = -1
    elision: str = ""
    artifacts: tuple[Any, ...] = ()
    trail: str = ""
    pins: tuple[Pin, ...] = ()
    working_set: tuple[Any, ...] = ()
    files: str = ""
    files_cap: int = 0
    literals: tuple[Any, ...] = ()
    literals_text: str = ""
    literal_receipt: Mapping[str, int] = field(default_factory=dict)

    @property
    def summary_end(self) -> int:
        """Where the model's summary ends: the next summary folds in what follows, elided range first."""
        return self.retain_start_idx if self.summarised_until < 0 else self.summarised_until

    @property
    def covers(self) -> int:
        """Length of the conversation prefix the checkpoint depends on (``prefix_hash`` names it)."""
        return max(self.retain_start_idx, self.masked_until)

    @property
    def summarises(self) -> bool:
        """Whether the view carries a summary item (a masking checkpoint made before any summary has none)."""
        return bool(self.summary.strip() or self.user_words or self.elision or self.trail or self.pins or self.files
                    or self.literals_text)

    @property
    def masks(self) -> bool:
        """Whether the view masks tool outputs."""
        return self.masked_until > self.retain_start_idx

    @property
    def view_key(self) -> str:
        """Names the view base this checkpoint produces, for matching a remembered ``UsageSample``.

        A checkpoint without masking or carried user words keeps the key
        version 1 gave it, so usage logged before stays matched.
        """
        summary = hashlib.blake2b(self.summary.encode(), digest_size=8).hexdigest()
        key = f"{self.retain_start_idx}:{self.prefix_hash}:{summary}"
        if self.masked_until or self.user_words:
            words = hashlib.blake2b(orjson.dumps(self.user_words), digest_size=8).hexdigest()
            key += f":m{self.masked_until}:u{words}"
        if self.elision or self.trail or self.literals_text:
            added = f"\0{self.literals_text}" if self.literals_text else ""  # keys made before literals stay
            proxy_text = hashlib.blake2b(f"{self.elision}\0{self.trail}{added}".encode(), digest_size=8).hexdigest()
            key += f":e{self.summarised_until}:{proxy_text}"
        if self.pins:
            key += f":p{hashlib.blake2b(orjson.dumps(self.pins), digest_size=8).hexdigest()}"
        if self.files:
            key += f":w{hashlib.blake2b(self.files.encode(), digest_size=8).hexdigest()}"
        return key

    def matches(self, hashes: Sequence[str]) -> bool:
        """Whether the conversation still starts with the prefix this checkpoint depends on."""
        return len(hashes) >= self.covers and prefix_hash(hashes, self.covers) == self.prefix_hash

    def to_json(self) -> str:
        """The checkpoint as the log keeps it; the fields added within version 3 only where they hold something,
        so one without them is written as it was before they existed."""
        values = asdict(self)
        for name in ADDITIVE:
            if not values[name]:
                del values[name]
        return orjson.dumps({"v": CHECKPOINT_FORMAT, **values}, option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def from_json(cls, data: str | bytes | Mapping[str, Any]) -> Checkpoint:
        raw = orjson.loads(data) if isinstance(data, str | bytes) else dict(data)
        if not isinstance(raw, dict) or raw.get("v") not in READABLE_FORMATS:
            raise ValueError(f"not a version {' or '.join(map(str, READABLE_FORMATS))} checkpoint")
        try:
            values = {f.name: raw[f.name] if f.name in raw or _required(f) else _default(f) for f in fields(cls)}
        except KeyError as exc:
            raise ValueError(f"checkpoint lacks field {exc}") from exc
        if not isinstance(values["summary"], str) or not isinstance(values["retain_start_idx"], int):
            raise ValueError("checkpoint has a malformed summary or retain_start_idx")
        if not isinstance(values["masked_until"], int) or not isinstance(values["user_words"], list | tuple):
            raise ValueError("checkpoint has a malformed masked_until or user_words")
        try:
            values["user_words"] = tuple((int(i), int(seq), int(tokens), str(text), int(count))
                                         for i, seq, tokens, text, count in values["user_words"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint has malformed user_words: {exc}") from exc
        if (not isinstance(values["summarised_until"], int) or not isinstance(values["elision"], str)
                or not isinstance(values["trail"], str) or not isinstance(values["artifacts"], list | tuple)):
            raise ValueError("checkpoint has a malformed summarised_until, elision, artifacts or trail")
        try:
            if not isinstance(values["pins"], list | tuple):
                raise TypeError("not a list")
            values["pins"] = tuple((str(source), int(seq), int(tokens), str(text))
                                   for source, seq, tokens, text in values["pins"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint has malformed pins: {exc}") from exc
        values["artifacts"] = tuple(tuple(a) if isinstance(a, list) else a for a in values["artifacts"])
        if (not isinstance(values["files"], str) or not isinstance(values["working_set"], list | tuple)
                or type(values["files_cap"]) is not int):
            raise ValueError("checkpoint has a malformed working_set, files or files_cap")
        values["working_set"] = tuple(tuple(w) if isinstance(w, list) else w for w in values["working_set"])
        receipt = values["literal_receipt"]
        if (not isinstance(values["literals"], list | tuple) or not isinstance(values["literals_text"], str)
                or not isinstance(receipt, Mapping)
                or not all(isinstance(k, str) and type(v) is int for k, v in receipt.items())):
            raise ValueError("checkpoint has malformed literals, literals_text or literal_receipt")
        values["literals"] = tuple(tuple(a) if isinstance(a, list) else a for a in values["literals"])
        values["literal_receipt"] = dict(receipt)
        return cls(**values)


@dataclass(frozen=True)
class CompactionResult:
    """``checkpoint`` is the new one when ``outcome`` is ``"ok"``, else ``None`` (nothing changes)."""

    outcome: CompactionOutcome
    checkpoint: Checkpoint | None
    tokens_before: int
    tokens_after: int
    detail: str = ""
    tier: Tier = "summary"
    #: Why the model's summary failed when the result still carries a reduction (a masking kept, the model-free
    #: tier): the failure backoff counts it.
    summary_error: str | None = None
    #: What the summary calls made for it cost (None: none was made, or none reported its usage).
    usage: CallUsage | None = None


def masking_checkpoint(previous: Checkpoint | None, masked_until: int, hashes: Sequence[str], *, system_end: int,
                       model: str, created_at: float, tokens_before: int = 0, tokens_after: int = 0) -> Checkpoint:
    """``previous`` (or, without one, a checkpoint summarising nothing) masking up to ``masked_until``.

    The summary, the split and the carried user words stay as they are: a
    masking checkpoint needs no summary call, and the log gets no ``summary``
    entry for it. The prefix hash is taken again over what it now covers.
    """
    base = previous if previous is not None else Checkpoint("", system_end, "", None, 0, 0, model, created_at)
    checkpoint = replace(base, masked_until=masked_until, created_at=created_at, tokens_before=tokens_before,
                         tokens_after=tokens_after)
    return replace(checkpoint, prefix_hash=prefix_hash(hashes, checkpoint.covers))
