"""Chain hashes: which exact prefix of a conversation a checkpoint (or a lineage position) covers.

An item's own hash is its dialect's business (``ItemModel.hash``); chaining
them is the engine's, and the same for every API.
"""

from __future__ import annotations

import hashlib


def chain_hash(previous: str, message_digest: str) -> str:
    """Rolling hash of a conversation prefix: proves which prefix a checkpoint covers."""
    return hashlib.blake2b((previous + message_digest).encode(), digest_size=16).hexdigest()
