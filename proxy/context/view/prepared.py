"""What the engine hands the front door: the view to send, how it was reduced, and the limits it was planned for.

Its own module so that the engine's parts (``proxy.context.view.batches``) can name it without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.context.checkpoint import Checkpoint
from proxy.context.view.budget import Estimate
from proxy.context.view.projection import NOTHING_FROZEN, FrozenEnds
from proxy.types import Message

#: ``X-Ctxproxy-Compacted``: how this request's view came to be.
Compacted = Literal["none", "proactive", "reactive", "background"]
#: What ``PreparedView.view_key`` adds to a clipped view's base.
CLIPPED = "+clipped"


@dataclass(frozen=True)
class PreparedView:
    """What to send upstream. ``changed`` is False when it is the client's conversation as sent.

    ``threshold`` is where compaction starts, ``limit`` what the upstream would
    refuse; ``clipped`` names the positions of the view whose tool results were cut to get under ``limit``.
    """

    messages: list[Message]
    changed: bool
    estimate: Estimate
    checkpoint: Checkpoint | None
    compacted: Compacted
    threshold: int
    limit: int
    clipped: tuple[int, ...] = ()
    #: Tokens of what no compaction frees (``ContextEngine.unfreed``): the tool definitions and the leading system
    #: messages. Measured once with the view; the thresholds beside it (soft, batch room, kept outputs) read it.
    unfreed: int = 0
    #: Where the view's frozen prefix ends (the summary item, the last masked item): a provider's explicit cache
    #: breakpoints go there (``Dialect.cache_hints``). A recall round appends to the view and leaves them.
    frozen: FrozenEnds = NOTHING_FROZEN

    @property
    def view_key(self) -> str:
        """Names the view's base for a later ``UsageSample``; a clipped view's count fits no other view."""
        key = self.checkpoint.view_key if self.checkpoint is not None else ""
        return f"{key}{CLIPPED}" if self.clipped else key
