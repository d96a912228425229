"""Token counts: the seed's characters ÷ 3, and a real tokenizer as a second opinion.

Characters ÷ 3 undercounts Chinese, dense code and random identifiers, so the
budget can also use tiktoken. The encodings come from the files litellm ships
(tiktoken's cache layout: a file named by the SHA-1 of its download URL), and
``TIKTOKEN_CACHE_DIR`` points there only while the encoding loads, so the proxy
never downloads anything and leaves the process environment as it found it.
When no bundled file exists the counter falls back to characters ÷ 3.

Counting is the hot path of every request, so counts are cached per message
hash in a bounded LRU: a conversation that grows by two messages costs two
tokenisations, not two hundred.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import orjson

from proxy.context.items import ItemModel
from proxy.context.window import litellm_dir
from proxy.types import Message

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN = 3
#: Role marker and separators each message costs in a chat template (OpenAI documents 3 to 4).
MESSAGE_OVERHEAD_TOKENS = 4
#: A flat guess for an image, audio or file part: its bytes say nothing about its token cost.
NON_TEXT_PART_TOKENS = 1024
#: Preferred first: o200k_base is what current OpenAI models use and is closer for CJK.
ENCODING_PREFERENCE = ("o200k_base", "cl100k_base")
TOKENIZERS_SUBDIR = ("litellm_core_utils", "tokenizers")


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


class TokenCounter:
    """Tokenizer counts of messages, cached per message hash in a bounded LRU.

    ``encoding`` is anything with ``encode_ordinary(str) -> list[int]``; by
    default the bundled one, loaded on first use. ``encode_ordinary`` treats
    ``<|endoftext|>`` in a tool output as text rather than raising.
    """

    def __init__(self, encoding: Any | None = None, *, maxsize: int = 50_000) -> None:
        self._encoding = encoding
        self._maxsize = maxsize
        self._cache: OrderedDict[str, int] = OrderedDict()

    def text_tokens(self, text: str) -> int:
        encoding = self._encoding if self._encoding is not None else bundled_encoding()
        if encoding is None:
            return chars_tokens(len(text))
        return len(encoding.encode_ordinary(text))

    def _cached(self, key: str) -> int | None:
        value = self._cache.get(key)
        if value is not None:
            self._cache.move_to_end(key)
        return value

    def _store(self, key: str, value: int) -> int:
        self._cache[key] = value
        if len(self._cache) > self._maxsize:
            self._cache.popitem(last=False)
        return value

    def message_tokens(self, dialect: ItemModel, message: Message, digest: str | None = None, /) -> int:
        key = dialect.count_key(message, digest if digest is not None else dialect.hash(message))
        cached = self._cached(key)
        if cached is not None:
            return cached
        text, non_text = dialect.text(message)
        return self._store(key, self.text_tokens(text) + non_text * NON_TEXT_PART_TOKENS + MESSAGE_OVERHEAD_TOKENS)

    def count_many(self, dialect: ItemModel, messages: Sequence[Message], digests: Sequence[str | None]) -> int:
        """Sum of ``message_tokens`` over a view: the per-request hot loop, so cache hits skip the LRU bookkeeping.

        Hits are not moved to the end of the LRU here; the messages of a live
        session are hit on every request anyway, and eviction only costs a recount.
        """
        cache = self._cache
        total = 0
        for message, digest in zip(messages, digests, strict=True):
            value = cache.get(dialect.count_key(message, digest)) if digest is not None else None
            total += value if value is not None else self.message_tokens(dialect, message, digest)
        return total

    def tools_tokens(self, tools: Sequence[Any] | None) -> int:
        if not tools:
            return 0
        payload = orjson.dumps(list(tools), option=orjson.OPT_SORT_KEYS)
        key = "tools:" + hashlib.blake2b(payload, digest_size=16).hexdigest()
        cached = self._cached(key)
        return cached if cached is not None else self._store(key, self.text_tokens(payload.decode()))

    def __len__(self) -> int:
        return len(self._cache)
