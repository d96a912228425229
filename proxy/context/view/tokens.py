"""Token counts: the seed's characters ÷ 3, and a real tokenizer as a second opinion.

Characters ÷ 3 undercounts Chinese, dense code and random identifiers, so the
budget can also use tiktoken. The encodings come from the files litellm ships
(tiktoken's cache layout: a file named by the SHA-1 of its download URL), and
``TIKTOKEN_CACHE_DIR`` points there only while the encoding loads, so the proxy
never downloads anything and leaves the process environment as it found it.
When no bundled file exists the counter falls back to characters ÷ 3.

Counting is the hot path of every request, so counts are cached per message
hash in an LRU bounded by count and by bytes: a conversation that grows by two
messages costs two tokenisations, not two hundred.

The sum over a view is kept per session too (``ViewCounts``): a session's next
view is summed from where it parts from the last one, so that a step adding two
messages to three hundred looks at two, not at three hundred cache entries.

A request's own tokenizing is bounded too (issue 23): a text over
``SAMPLE_CHARS`` is counted from evenly spaced samples of that many characters
in all and scaled (BPE on 30 MiB of one repeated character took 25 s), and one
``count_many`` tokenizes at most ``BUDGET_CHARS``; the messages past that are
counted as characters ÷ 3, an estimate cached like a count.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, count
from operator import is_not
from pathlib import Path
from typing import Any, Protocol, cast

import orjson

from proxy.context.items import ItemModel
from proxy.context.view.window import litellm_dir
from proxy.types import Message

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN = 3
#: Role marker and separators each message costs in a chat template (OpenAI documents 3 to 4).
MESSAGE_OVERHEAD_TOKENS = 4
#: A flat guess for an image, audio or file part: its bytes say nothing about its token cost.
NON_TEXT_PART_TOKENS = 1024
#: Preferred first: o200k_base is what current OpenAI models use and is closer for CJK.
ENCODING_PREFERENCE = ("o200k_base", "cl100k_base")
#: Characters of one text tokenized at most: a longer one is counted from samples (``sampled``).
SAMPLE_CHARS = 64 * 1024
#: Samples a long text is read in: spread over it, so that one uniform stretch does not set the whole count.
SAMPLES = 8
#: Characters one ``count_many`` tokenizes at most (about 0.1 s of prose, 0.5 s of a repeated character); the
#: messages past it are counted as characters ÷ 3.
BUDGET_CHARS = 4 * 1024 * 1024
#: Bytes an LRU entry of the count cache costs besides its key (the dict's slot, the link, the int).
ENTRY_BYTES = 120
TOKENIZERS_SUBDIR = ("litellm_core_utils", "tokenizers")
#: Messages a view needs for its sums to be kept (``ViewCounts``): a shorter one is summed whole in microseconds.
RUNNING_FROM = 64
#: Messages the kept sums cover in all (about 100 bytes each, with their digests), least recently used out first.
RUNNING_ENTRIES = 200_000


class MessageCounter(Protocol):
    """Tokens of one item; ``digest`` is its hash when the caller already has it."""

    def __call__(self, message: Message, digest: str | None = None, /) -> int: ...


def chars_tokens(chars: int) -> int:
    """Characters ÷ 3, rounded up so that a non-empty text never counts as free."""
    return -(-chars // CHARS_PER_TOKEN)


def text_length(dialect: ItemModel, item: Message) -> int:
    """Characters the model reads in an item, a non-text part priced as ``NON_TEXT_PART_TOKENS`` of them."""
    text, non_text = dialect.text(item)
    return len(text) + non_text * NON_TEXT_PART_TOKENS * CHARS_PER_TOKEN


def tools_chars(tools: Sequence[Any] | None) -> int:
    """Characters of the tool definitions: the model reads them as part of the prompt."""
    return len(orjson.dumps(list(tools))) if tools else 0


def sampled(encode: Callable[[str], list[int]], text: str) -> int:
    """Tokens of ``text``: exact up to ``SAMPLE_CHARS``, else ``SAMPLES`` evenly spaced windows of that many
    characters in all, their tokens per character applied to the whole (rounded up)."""
    if len(text) <= SAMPLE_CHARS:
        return len(encode(text))
    width = SAMPLE_CHARS // SAMPLES
    stride = (len(text) - width) // (SAMPLES - 1)
    tokens = chars = 0
    for i in range(SAMPLES):
        window = text[i * stride: i * stride + width]
        tokens += len(encode(window))
        chars += len(window)
    return -(-tokens * len(text) // chars)


def bundled_encoding_name(directory: Path) -> str | None:
    """The preferred encoding whose file is present in ``directory`` (tiktoken's cache layout)."""
    for name in ENCODING_PREFERENCE:
        url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
        if (directory / hashlib.sha1(url.encode()).hexdigest()).is_file():
            return name
    return None


@functools.cache
def bundled_encoding() -> Any | None:
    """A tiktoken ``Encoding`` loaded from litellm's files, or ``None``; never downloads."""
    root = litellm_dir()
    if root is None:
        return None
    directory = root.joinpath(*TOKENIZERS_SUBDIR)
    name = bundled_encoding_name(directory)
    if name is None:
        logger.warning("no bundled tiktoken encoding in %s; counting characters / 3", directory)
        return None
    import tiktoken  # deferred: loading an encoding costs about half a second

    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(directory)
    try:
        return tiktoken.get_encoding(name)
    finally:
        if previous is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous


def identical_prefix(old: Sequence[object], new: Sequence[object]) -> int:
    """How many leading elements of ``old`` and ``new`` are the very same objects (``is``), found in C."""
    return next(compress(count(), map(is_not, old, new)), min(len(old), len(new)))


@dataclass(frozen=True, slots=True)
class RunningCount:
    """A session's last counted view: its digests, and ``sums[i]`` the count of its first ``i`` messages.

    A message is known by the identity of its digest, not by its value: ``HistoryManager.hashes_for``
    gives each message equal to the previous request's (deep equality: what a count reads, reasoning
    included, where a Chat digest leaves reasoning out) that request's very hash string, and a new string
    to every message it hashes; the masker gives a masked item the same string each time. So the same
    string at the same place is the same message, and has the same count.
    """

    digests: tuple[str, ...]
    sums: array[int]


class ViewCounts:
    """The ``RunningCount`` of each session with views of ``RUNNING_FROM`` messages or more, least recently used
    out first past ``max_entries`` messages in all. An entry is replaced whole, never changed: a count in the
    offload pool and one on the loop each read a complete one."""

    def __init__(self, max_entries: int = RUNNING_ENTRIES) -> None:
        self._runs: OrderedDict[Hashable, RunningCount] = OrderedDict()
        self._entries = 0
        self._max_entries = max_entries
        self._lock = threading.Lock()

    def get(self, session: Hashable) -> RunningCount | None:
        return self._runs.get(session)

    def put(self, session: Hashable, run: RunningCount) -> None:
        with self._lock:
            old = self._runs.pop(session, None)
            self._entries += len(run.digests) - (len(old.digests) if old is not None else 0)
            self._runs[session] = run
            while self._runs and self._entries > self._max_entries:
                _, dropped = self._runs.popitem(last=False)
                self._entries -= len(dropped.digests)

    def __len__(self) -> int:
        return len(self._runs)


class TokenCounter:
    """Tokenizer counts of messages, cached per message hash in an LRU bounded by ``maxsize`` and ``max_bytes``.

    ``encoding`` is anything with ``encode_ordinary(str) -> list[int]``; by
    default the bundled one, loaded on first use. ``encode_ordinary`` treats
    ``<|endoftext|>`` in a tool output as text rather than raising. A large
    request counts its messages in a worker thread (``proxy.context.offload``)
    while the event loop counts others': the cache's single operations are
    atomic under the GIL, and ``_store`` takes a lock for its read-modify-write of the tally.
    """

    def __init__(self, encoding: Any | None = None, *, maxsize: int = 400_000,
                 max_bytes: int = 64 * 1024 * 1024) -> None:
        self._encoding = encoding
        self._maxsize = maxsize
        self._max_bytes = max_bytes
        self._cache: OrderedDict[str, int] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.views = ViewCounts()

    @property
    def bytes(self) -> int:
        """What the cache holds, estimated: its keys and ``ENTRY_BYTES`` per entry."""
        return self._bytes

    def text_tokens(self, text: str) -> int:
        encoding = self._encoding if self._encoding is not None else bundled_encoding()
        if encoding is None:
            return chars_tokens(len(text))
        return sampled(encoding.encode_ordinary, text)

    def _cached(self, key: str) -> int | None:
        value = self._cache.get(key)
        if value is not None:
            with contextlib.suppress(KeyError):  # evicted meanwhile by a count in the pool
                self._cache.move_to_end(key)
        return value

    def _store(self, key: str, value: int) -> int:
        with self._lock:  # a miss only; the byte tally must not lose updates between the loop and the pool
            if key not in self._cache:
                self._bytes += len(key) + ENTRY_BYTES
            self._cache[key] = value
            while self._cache and (len(self._cache) > self._maxsize or self._bytes > self._max_bytes):
                dropped, _ = self._cache.popitem(last=False)
                self._bytes -= len(dropped) + ENTRY_BYTES
        return value

    def message_tokens(self, dialect: ItemModel, message: Message, digest: str | None = None, /) -> int:
        key = dialect.count_key(message, digest if digest is not None else dialect.hash(message))
        cached = self._cached(key)
        return cached if cached is not None else self._count(dialect, message, key, exact=True)[0]

    def count_one(self, dialect: ItemModel, message: Message, digest: str, *, exact: bool) -> tuple[int, int]:
        """``message_tokens`` for a caller with a tokenizing budget of its own: the count and the characters it
        tokenized (0 when cached); unless ``exact``, a message new to the cache is counted as characters ÷ 3, and
        that estimate is not cached (a later look with budget left counts the message exactly)."""
        key = dialect.count_key(message, digest)
        cached = self._cached(key)
        return (cached, 0) if cached is not None else self._count(dialect, message, key, exact=exact, cache=exact)

    def _count(self, dialect: ItemModel, message: Message, key: str, *, exact: bool,
               cache: bool = True) -> tuple[int, int]:
        """Count ``message`` (tokenized, or characters ÷ 3 unless ``exact``), cached under ``key`` with ``cache``;
        the count and the characters tokenized."""
        text, non_text = dialect.text(message)
        tokens = self.text_tokens(text) if exact else chars_tokens(len(text))
        value = tokens + non_text * NON_TEXT_PART_TOKENS + MESSAGE_OVERHEAD_TOKENS
        return self._store(key, value) if cache else value, min(len(text), SAMPLE_CHARS) if exact else 0

    def count_many(self, dialect: ItemModel, messages: Sequence[Message], digests: Sequence[str | None], *,
                   session: Hashable | None = None) -> int:
        """Sum of ``message_tokens`` over a view: the per-request hot loop, so cache hits skip the LRU bookkeeping.

        Hits are not moved to the end of the LRU here; the messages of a live
        session are hit on every request anyway, and eviction only costs a recount.
        Past ``BUDGET_CHARS`` tokenized, a message new to the cache is counted
        as characters ÷ 3 (and cached so): the request's own work stays bounded.
        With ``session``, a view of ``RUNNING_FROM`` messages or more is summed
        from where it parts from that session's last (``ViewCounts``).
        """
        if session is None or len(messages) < RUNNING_FROM:
            return sum(self._counts(dialect, messages, digests))
        last = self.views.get(session)
        start = identical_prefix(last.digests, digests) if last is not None else 0
        base = last.sums[start] if last is not None else 0
        tail = accumulate(self._counts(dialect, messages[start:], digests[start:]), initial=base)
        sums = last.sums[:start] if last is not None else array("q")
        sums.extend(tail)
        # A message without a digest has no identity to be known by: the kept sums end before the first one.
        known = digests.index(None) if None in digests else len(digests)
        self.views.put(session, RunningCount(cast(tuple[str, ...], tuple(digests[:known])), sums[:known + 1]))
        return sums[-1]

    def _counts(self, dialect: ItemModel, messages: Sequence[Message], digests: Sequence[str | None]) -> Iterator[int]:
        """``message_tokens`` of each message, with ``count_many``'s budget."""
        cache = self._cache
        budget = BUDGET_CHARS
        for message, digest in zip(messages, digests, strict=True):
            if digest is None:
                yield self.message_tokens(dialect, message)
                continue
            key = dialect.count_key(message, digest)
            value = cache.get(key)
            if value is None:
                value, spent = self._count(dialect, message, key, exact=budget > 0)
                budget -= spent
            yield value

    def tools_tokens(self, tools: Sequence[Any] | None) -> int:
        if not tools:
            return 0
        payload = orjson.dumps(list(tools), option=orjson.OPT_SORT_KEYS)
        key = "tools:" + hashlib.blake2b(payload, digest_size=16).hexdigest()
        cached = self._cached(key)
        return cached if cached is not None else self._store(key, self.text_tokens(payload.decode()))

    def __len__(self) -> int:
        return len(self._cache)
