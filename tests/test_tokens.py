from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

from proxy.context.view.tokens import (
    MESSAGE_OVERHEAD_TOKENS,
    NON_TEXT_PART_TOKENS,
    RUNNING_FROM,
    RunningCount,
    TokenCounter,
    ViewCounts,
    bundled_encoding,
    bundled_encoding_name,
    chars_tokens,
    tools_chars,
)
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash


class WordEncoding:
    """One token per whitespace-separated word; counts how often it was asked."""

    def __init__(self) -> None:
        self.calls = 0

    def encode_ordinary(self, text: str) -> list[int]:
        self.calls += 1
        return [0] * len(text.split())


def cache_file(name: str) -> str:
    return hashlib.sha1(f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken".encode()).hexdigest()


def test_chars_tokens_rounds_up() -> None:
    assert [chars_tokens(n) for n in (0, 1, 2, 3, 4, 6, 7)] == [0, 1, 1, 1, 2, 2, 3]


def test_tools_chars() -> None:
    assert tools_chars(None) == 0
    assert tools_chars([]) == 0
    assert tools_chars([{"a": 1}]) == len('[{"a":1}]')


def test_message_text_covers_what_the_model_reads() -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:..."}}],
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}],
        "name": "bot",
    }
    assert CHAT.text(message) == ('look\nread\n{"p": 1}\nbot', 1)


def test_encoding_name_prefers_o200k(tmp_path: Path) -> None:
    assert bundled_encoding_name(tmp_path) is None
    (tmp_path / cache_file("cl100k_base")).write_bytes(b"")
    assert bundled_encoding_name(tmp_path) == "cl100k_base"
    (tmp_path / cache_file("o200k_base")).write_bytes(b"")
    assert bundled_encoding_name(tmp_path) == "o200k_base"


def test_bundled_encoding_is_o200k_and_counts() -> None:
    encoding = bundled_encoding()
    assert encoding is not None
    assert encoding.name == "o200k_base"
    assert TokenCounter().text_tokens("hello world") == 2


def test_bundled_encoding_loads_offline_and_restores_the_environment(tmp_path: Path) -> None:
    code = (
        "import os\n"
        "from proxy.context.view.tokens import bundled_encoding\n"
        "print(bundled_encoding().name, os.environ['TIKTOKEN_CACHE_DIR'])\n"
    )
    env = {
        **os.environ,
        "TIKTOKEN_CACHE_DIR": str(tmp_path),  # empty: a lookup here would have to download
        "HTTPS_PROXY": "http://127.0.0.1:9",  # and any download fails
        "HTTP_PROXY": "http://127.0.0.1:9",
    }
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout == f"o200k_base {tmp_path}\n"
    assert list(tmp_path.iterdir()) == []


def test_message_tokens_add_overhead_and_non_text_parts() -> None:
    counter = TokenCounter(WordEncoding())
    assert counter.message_tokens(CHAT, {"role": "user", "content": "one two three"}) == 3 + MESSAGE_OVERHEAD_TOKENS
    image = {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {}}]}
    assert counter.message_tokens(CHAT, image) == 1 + NON_TEXT_PART_TOKENS + MESSAGE_OVERHEAD_TOKENS


def test_counts_are_cached_per_digest() -> None:
    encoding = WordEncoding()
    counter = TokenCounter(encoding)
    message = {"role": "user", "content": "a b"}
    assert counter.message_tokens(CHAT, message, "d1") == 6
    assert counter.message_tokens(CHAT, message, "d1") == 6
    assert encoding.calls == 1
    # The digest is the key: the caller's hash is trusted, so no hashing on the hot path.
    assert counter.message_tokens(CHAT, {"role": "user", "content": "x y z w"}, "d1") == 6
    # Without a digest the message hash is computed, and equal messages share it.
    assert counter.message_tokens(CHAT, {"role": "user", "content": "a b"}) == 6
    assert counter.message_tokens(CHAT, {"role": "user", "content": " a b "}) == 6
    assert encoding.calls == 2


def test_an_estimate_past_the_budget_is_not_cached_so_a_later_look_counts_exactly() -> None:
    """The inspector's fold estimates past its tokenizing budget; the next look, with budget left, tokenizes."""
    encoding = WordEncoding()
    counter = TokenCounter(encoding)
    message = {"role": "user", "content": "one two three four five six"}
    estimate, spent = counter.count_one(CHAT, message, "d", exact=False)
    assert (estimate, spent, encoding.calls) == (chars_tokens(27) + MESSAGE_OVERHEAD_TOKENS, 0, 0)
    exact, spent = counter.count_one(CHAT, message, "d", exact=True)
    assert (exact, encoding.calls) == (6 + MESSAGE_OVERHEAD_TOKENS, 1) and spent > 0
    assert counter.count_one(CHAT, message, "d", exact=False) == (exact, 0)  # now cached: the count, not a guess


def test_cache_is_a_bounded_lru() -> None:
    encoding = WordEncoding()
    counter = TokenCounter(encoding, maxsize=2)
    for digest in ("a", "b", "a", "c"):
        counter.message_tokens(CHAT, {"role": "user", "content": "w"}, digest)
    assert len(counter) == 2
    assert encoding.calls == 3
    counter.message_tokens(CHAT, {"role": "user", "content": "w"}, "a")  # recently used: kept
    assert encoding.calls == 3
    counter.message_tokens(CHAT, {"role": "user", "content": "w"}, "b")  # least recently used: evicted
    assert encoding.calls == 4


def test_tools_tokens_are_cached() -> None:
    encoding = WordEncoding()
    counter = TokenCounter(encoding)
    tools = [{"type": "function", "function": {"name": "read file", "parameters": {}}}]
    assert counter.tools_tokens(None) == 0
    first = counter.tools_tokens(tools)
    assert counter.tools_tokens(tools) == first
    assert first == 2  # '[{"function":{"name":"read' and 'file","parameters":{}},"type":"function"}]'
    assert encoding.calls == 1


class Watched:
    """A dialect that counts the messages whose count keys a sum looked up."""

    def __init__(self) -> None:
        self.looked = 0

    def count_key(self, item: dict[str, Any], digest: str) -> str:
        self.looked += 1
        return CHAT.count_key(item, digest)

    def __getattr__(self, name: str) -> Any:
        return getattr(CHAT, name)


def fresh(digest: str) -> str:
    """The same hash, as a new string (what hashing a message again gives)."""
    return digest[:1] + digest[1:]


def test_a_sessions_view_is_summed_from_where_it_parts_from_its_last() -> None:
    counter, watched = TokenCounter(WordEncoding()), Watched()
    messages = [{"role": "user" if i % 2 else "assistant", "content": f"step {i} " + "word " * (i % 7)}
                for i in range(RUNNING_FROM + 36)]
    digests = [message_hash(m) for m in messages]

    def running(view: list[dict[str, Any]], hashes: list[str | None]) -> int:
        watched.looked = 0
        total = counter.count_many(watched, view, hashes, session="s")  # type: ignore[arg-type]
        assert total == TokenCounter(WordEncoding()).count_many(CHAT, view, hashes), "the whole view's sum"
        return watched.looked

    assert running(messages, digests) == 100, "the first view: all of it"
    step = [{"role": "assistant", "content": "ran the tests"}, {"role": "user", "content": "now the docs"}]
    grown, grown_digests = messages + step, digests + [message_hash(m) for m in step]
    assert running(grown, grown_digests) == 2, "a step: only what it added"
    edited = [*grown[:50], {"role": "user", "content": "another question"}, *grown[51:]]
    assert running(edited, [*grown_digests[:50], message_hash(edited[50]), *grown_digests[51:]]) == 52
    assert running(grown[:70], grown_digests[:70]) == 20, "back to before the edit: from where the two part"
    assert running(grown[:70], [fresh(d) for d in grown_digests[:70]]) == 70, \
        "equal hashes made again are not known: only the very strings a request reused from the last say so"
    with_reasoning = [{**m, "reasoning_content": "thought it through"} if i == 3 else m for i, m in enumerate(messages)]
    reasoned = [fresh(d) if i == 3 else d for i, d in enumerate(digests)]  # the hash leaves reasoning out
    running(messages, digests)
    assert running(with_reasoning, reasoned) == 97, "a message unlike the last one's counts anew, reasoning too"
    unnamed: list[str | None] = [*digests[:10], None, *digests[11:]]
    running(messages, unnamed)
    assert running(messages, unnamed) == 90, "the sums kept end before a message without a digest"
    assert len(counter.views) == 1
    counter.count_many(CHAT, messages[: RUNNING_FROM - 1], digests[: RUNNING_FROM - 1], session="short")
    assert len(counter.views) == 1, "a short view is summed whole and not kept"


def test_the_sums_kept_are_bounded_by_their_messages_in_all() -> None:
    views = ViewCounts(max_entries=250)
    for name in ("a", "b", "c"):
        views.put(name, RunningCount(tuple("x" * 100), array("q", range(101))))
    assert views.get("a") is None and views.get("b") is not None and len(views) == 2, "the oldest out first"
    views.put("b", RunningCount(tuple("x" * 10), array("q", range(11))))  # replaced: its old size is freed
    views.put("d", RunningCount(tuple("x" * 100), array("q", range(101))))
    assert [views.get(name) is not None for name in "bcd"] == [True, True, True]
