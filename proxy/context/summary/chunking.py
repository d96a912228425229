"""Cutting what a summary folds into chunks for the summary model: balanced, whole messages where they fit.

A chunk is a run of leading blocks (serialised messages) within a token limit,
joined by newlines. Balanced: when what is left needs k chunks, the next one
takes about 1/k of it, so 5,441 tokens with room for 4,500 are two calls of
about 2,700, not 4,500 and 941 (a small last chunk costs a whole call for
little), and 5,441 tokens with room for 6,000 are one. The fold recomputes the
balance before every chunk, since the summary beside it changes size. A message
bigger than the limit is cut into pieces of about equal size; only its last
piece is ``last``, so the fold knows when the message is folded whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

Count = Callable[[str], int]


@dataclass(frozen=True)
class Block:
    """One serialised message, or a piece of one; ``last`` is False for every piece but a message's last."""

    text: str
    tokens: int
    last: bool = True


def plan_chunk(blocks: Sequence[Block], limit: int, count: Count) -> tuple[list[Block], list[Block]]:
    """The next chunk of ``blocks`` (not empty) within ``limit`` tokens, and the blocks left after it."""
    first = blocks[0]
    if first.tokens > limit:
        piece, rest = split_block(first, limit, count)
        return [piece], [rest, *blocks[1:]]
    total = sum(block.tokens for block in blocks) + len(blocks) - 1
    if total <= limit:
        return list(blocks), []
    target = -(-total // -(-total // limit))  # total over the number of chunks it needs, rounded up
    used, end = first.tokens, 1
    while end < len(blocks):
        joined = used + 1 + blocks[end].tokens
        if joined > limit:
            break
        if joined > target:
            if joined - target < target - used:  # take the block that crosses the target when it ends nearer
                end += 1
            break
        used, end = joined, end + 1
    return list(blocks[:end]), list(blocks[end:])


def split_block(block: Block, limit: int, count: Count) -> tuple[Block, Block]:
    """The first of the equal pieces ``block`` needs to fit ``limit``, cut in proportion to length, and the rest."""
    text = block.text
    want = -(-block.tokens // -(-block.tokens // limit))
    size = max(1, len(text) * want // block.tokens)
    tokens = count(text[:size])
    while tokens > limit and size > 1:  # denser than the block's average: shrink until it fits
        size = max(1, size * limit // (tokens + 1))
        tokens = count(text[:size])
    return Block(text[:size], tokens, last=False), Block(text[size:], count(text[size:]), block.last)
