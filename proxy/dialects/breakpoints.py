"""Anthropic's ``cache_control`` breakpoints: the client's counted, the proxy's placed at the frozen boundary.

The API takes at most four breakpoints in one request and refuses a fifth ("A maximum of 4 blocks with
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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.context.items import Item
from proxy.context.view.projection import FrozenEnds

#: Anthropic takes at most this many ``cache_control`` breakpoints in one request.
MAX_BREAKPOINTS = 4
#: Content blocks that take a ``cache_control`` (thinking blocks refuse one).
MARKABLE = frozenset({"text", "image", "document", "search_result", "tool_use", "tool_result"})
LONG_TTL = "1h"


def marks(value: Any) -> list[Any]:
    """Every ``cache_control`` inside ``value``, at any depth. Counting one the API would not (a tool's argument
    named so) only costs a breakpoint the proxy then does not add; missing one would cost a refused request."""
    if isinstance(value, dict):
        found = [value["cache_control"]] if "cache_control" in value else []
        for key, inner in value.items():
            if key != "cache_control" and isinstance(inner, dict | list):
                found += marks(inner)
        return found
    if isinstance(value, list):
        return [mark for inner in value if isinstance(inner, dict | list) for mark in marks(inner)]
    return []


def breakpoints(payload: Mapping[str, Any], items: Sequence[Item]) -> int:
    """The breakpoints a request holds: ``payload``'s fields (tools, system, a top-level one) and ``items``, the
    messages that go (the view, not the client's ``messages``)."""
    return len(_fields_marks(payload)) + len(marks(list(items)))


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
                 *marks([payload.get("cache_control")])]
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
        if isinstance(block, dict) and block.get("type") in MARKABLE and (block["type"] != "text" or block.get("text")):
            return None if marks(block) else (index, at)
    return None
