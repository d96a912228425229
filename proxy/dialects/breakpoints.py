"""Explicit prompt-cache breakpoints at the frozen boundary: Anthropic's ``cache_control``, OpenAI's
``prompt_cache_breakpoint``.

Anthropic's API takes at most four breakpoints in one request and refuses a fifth ("A maximum of 4 blocks with
cache_control may be provided"): on tool definitions, system blocks and message content blocks (the blocks
inside a ``tool_result`` too), and a top-level ``cache_control`` (automatic caching, put on the last cacheable
block) takes a slot as well. It writes a cache entry at each breakpoint; a request reads the longest entry it
finds at a block boundary up to about 20 blocks before one of its own breakpoints.

What the proxy adds, while the request leaves room, in this order:

1. one on the summary block: the end of the compacted prefix (tools, system, summary), the same on every
   request until the next summary. A masking batch in between changes what follows it, and the prefix up to the
   summary is still read back, since its entry sits exactly at a breakpoint of every request.
2. one on the last block of the last masked item (of the blocks that take one: not thinking, not an empty
   text): the end of the masked region, the stable prefix of a view that masks without a summary. Between
   batches the client's own breakpoint covers it anyway; at a batch the old end is read back when the new end is
   within the API's look-back, and only then, which is why the summary block comes first.

A breakpoint adds no charge where the client has one later (Claude Code's, on the last message): a request pays
the write for what it did not read up to its last breakpoint, whichever lie between. Where the client has none,
the write (1.25 times the input price) pays for itself at the first request that reads it back (0.1 times), and a
frozen prefix is made to hold for several.

The client's own are never moved or removed. The proxy's go on other blocks; every block of the client's that
reaches the view keeps its keys (masking replaces a ``tool_result``'s content and keeps the block's other keys,
clipping keeps a part's). A breakpoint on an item the summary replaced is gone with its item, and one inside an
output masking replaced is gone with that output: neither is moved, and the count is of what is sent.

Off where the client already caches that prefix: when a breakpoint of its own sits on (or inside) the block the
proxy would mark. A later breakpoint of the client's does not cover the boundary: entries are written only at
breakpoints, so once the prefix changes past the boundary, nothing at the boundary is read back unless a
breakpoint put it there. The summary block is the proxy's own text: no client breakpoint is ever on it.

The proxy's breakpoint takes a one-hour TTL when a breakpoint of the client's after it has one (the API wants
longer TTLs before shorter ones), the default five minutes otherwise.

OpenAI takes an explicit breakpoint on GPT-5.6 and later, ``prompt_cache_breakpoint: {"mode": "explicit"}`` on a
text part of a Chat message or a Responses ``input_text`` (openai-python's ``ChatCompletionContentPartTextParam``,
``ResponseInputTextParam``). OpenAI's prompt-caching guide: these models bill cache writes (1.25 times); its
GPT-5.6 upgrade guide (quoted in openai/codex#35300): their implicit breakpoint sits near the latest message, so a
stable prefix under a changed suffix can lose its hits unless an explicit breakpoint marks the stable boundary. The
proxy puts one on the summary item's last text part, only where ``--add-fields`` allows (a field a strict
OpenAI-compatible server does not know is refused), only for a model litellm's map prices as such, and never when
the client set a breakpoint or ``prompt_cache_options`` of its own (it manages its prefixes itself): one explicit
breakpoint beside the implicit one, within the four cache writes a request may make. Not on the masked end:
masked outputs are strings (a tool message's content, a ``function_call_output``'s ``output``) that a breakpoint
would turn into parts, and assistant turns take none.

No ``cache_control`` on Chat requests, though OpenRouter and LiteLLM take it on content parts for Anthropic models:
the Chat door cannot tell such a gateway from an upstream that refuses the field. A client's own rides in its
content parts, whose keys masking and clipping keep. Gemini takes no inline breakpoint (its explicit cache is a
separate ``cachedContents`` resource).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.context.items import Item
from proxy.context.view.projection import FrozenEnds
from proxy.context.view.window import model_entry

#: Anthropic takes at most this many ``cache_control`` breakpoints in one request.
MAX_BREAKPOINTS = 4
#: Content blocks that take a ``cache_control`` (thinking blocks refuse one).
MARKABLE = frozenset({"text", "image", "document", "search_result", "tool_use", "tool_result"})
LONG_TTL = "1h"
#: Blocks before one of a request's breakpoints within which the API finds a cache entry to read.
LOOKBACK = 20
#: OpenAI's explicit breakpoint, on a text part (openai-python's ``ChatCompletionContentPartTextParam`` and
#: ``ResponseInputTextParam``): ``{"mode": "explicit"}``.
OPENAI_FIELD = "prompt_cache_breakpoint"


def marks(value: Any, field: str = "cache_control") -> list[Any]:
    """Every ``field`` (a breakpoint) inside ``value``, at any depth. Counting one the API would not (a tool's
    argument named so) only costs a breakpoint the proxy then does not add; missing one would cost a refused
    request."""
    if isinstance(value, dict):
        found = [value[field]] if field in value else []
        for key, inner in value.items():
            if key != field and isinstance(inner, dict | list):
                found += marks(inner, field)
        return found
    if isinstance(value, list):
        return [mark for inner in value if isinstance(inner, dict | list) for mark in marks(inner, field)]
    return []


def breakpoints(payload: Mapping[str, Any], items: Sequence[Item]) -> int:
    """The breakpoints a request holds: ``payload``'s fields (tools, system, a top-level one) and ``items``, the
    messages that go (the view, not the client's ``messages``)."""
    return len(_fields_marks(payload)) + len(marks(list(items)))


def caches_tail(payload: Mapping[str, Any]) -> bool:
    """Whether Anthropic caches a Messages request to (near) its end: it writes entries at breakpoints only, so a
    client with none among its last ``LOOKBACK`` message blocks and no top-level ``cache_control`` (automatic
    caching, on the last block) pays the full input price for everything after the proxy's breakpoints, on every
    request (``proxy.context.view.worth``: nothing then is saved by waiting to reduce it)."""
    if "cache_control" in payload:
        return True
    messages = payload.get("messages")
    blocks: list[Any] = []
    for message in reversed(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, Mapping) else None
        blocks += reversed(content) if isinstance(content, list) else [content]
        if len(blocks) >= LOOKBACK:
            break
    return bool(marks(blocks[:LOOKBACK]))


def with_breakpoints(payload: Mapping[str, Any], items: list[Item], frozen: FrozenEnds) -> list[Item]:
    """``items`` (a view) with the proxy's breakpoints at its frozen ends, as many as the request has room for
    (see the module docstring); the view's items are not changed in place."""
    held = [marks(item) for item in items]
    room = MAX_BREAKPOINTS - len(_fields_marks(payload)) - sum(map(len, held))
    targets: list[tuple[int, int]] = []
    for target in (_summary_block(items, frozen.summary), _last_markable(items, frozen.masked)):
        if target is not None and target not in targets and len(targets) < room:
            targets.append(target)
    out = list(items)
    for index, block in targets:
        content = out[index]["content"]
        later = [*marks(content[block + 1:]), *(mark for found in held[index + 1:] for mark in found),
                 *([payload["cache_control"]] if "cache_control" in payload else [])]  # on the last block
        long = any(isinstance(mark, Mapping) and mark.get("ttl") == LONG_TTL for mark in later)
        control = {"type": "ephemeral", **({"ttl": LONG_TTL} if long else {})}
        out[index] = {**out[index], "content": [*content[:block], {**content[block], "cache_control": control},
                                                *content[block + 1:]]}
    return out


def _fields_marks(payload: Mapping[str, Any]) -> list[Any]:
    return marks({key: value for key, value in payload.items() if key != "messages"})


def _summary_block(items: Sequence[Item], index: int | None) -> tuple[int, int] | None:
    """The summary's block: the first of the item that carries it."""
    if index is None or index >= len(items):
        return None
    content = items[index].get("content")
    if not isinstance(content, list) or not content or not isinstance(content[0], dict) \
            or content[0].get("type") != "text" or marks(content[0]):
        return None
    return index, 0


def _last_markable(items: Sequence[Item], index: int | None) -> tuple[int, int] | None:
    """The last block of item ``index`` that takes a breakpoint; None when the client's own is on it already."""
    if index is None or index >= len(items):
        return None
    content = items[index].get("content")
    blocks = content if isinstance(content, list) else []
    for at in range(len(blocks) - 1, -1, -1):
        block = blocks[at]
        if _markable(block):
            return None if marks(block) else (index, at)
    return None


def _markable(block: Any) -> bool:
    """Whether the API takes a breakpoint on ``block``: not on thinking, nor on an empty text."""
    return isinstance(block, dict) and block.get("type") in MARKABLE and (
        block["type"] != "text" or bool(str(block.get("text") or "").strip()))


def takes_explicit_breakpoints(model: str) -> bool:
    """Whether an OpenAI model takes ``prompt_cache_breakpoint``: the families that bill cache writes (GPT-5.6 and
    later; OpenAI's prompt-caching guide), which litellm's map prices above uncached input (1.25 times). A model it
    does not know, or one of another provider, takes none."""
    entry = model_entry(model) or {}
    write, read = entry.get("cache_creation_input_token_cost"), entry.get("input_cost_per_token")
    return (entry.get("litellm_provider") == "openai" and isinstance(write, int | float)
            and isinstance(read, int | float) and write > read)


def with_openai_breakpoint(payload: Mapping[str, Any], items: list[Item], frozen: FrozenEnds, part: str,
                           *, adds_fields: bool) -> list[Item]:
    """``items`` (a view) with OpenAI's breakpoint at the end of its summary item (text parts of type ``part``),
    where fields may be added (``--add-fields``) and the model takes one, unless the client set breakpoints or
    ``prompt_cache_options`` of its own: it then manages its prefixes itself. It goes on the item's last text part
    (the whole item is frozen: the summary and the user message it leads); a string content becomes one part."""
    index = frozen.summary
    if not adds_fields or index is None or index >= len(items) or "prompt_cache_options" in payload \
            or not takes_explicit_breakpoints(str(payload.get("model") or "")) or marks(payload, OPENAI_FIELD):
        return items
    item, mark = items[index], {"mode": "explicit"}
    content = item.get("content")
    parts: list[Any] = content if isinstance(content, list) else [{"type": part, "text": content}] \
        if isinstance(content, str) else []
    texts = [at for at, block in enumerate(parts) if isinstance(block, dict) and block.get("type") == part]
    if not texts:
        return items
    parts = [*parts[:texts[-1]], {**parts[texts[-1]], OPENAI_FIELD: mark}, *parts[texts[-1] + 1:]]
    return [*items[:index], {**item, "content": parts}, *items[index + 1:]]
