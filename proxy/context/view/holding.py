"""A ready background summary held back while the provider's prompt cache is warm (issue 34).

A background compaction records its checkpoint as soon as its summary is in,
usually mid-burst; using it at once changes the prompt prefix right after the
system prompt, and the provider writes the whole view again. So while nothing
forces it, the view keeps standing on the checkpoint the session's previous
view stood on, and the ready one waits for the moment ``proxy.context.view.worth``
calls timely: an idle gap that left the cache cold, the trigger, or, near the
trigger, reads saved worth more than the rewrite. A prompt not cached to its
end (``CacheRates.cached``) holds nothing back: each step read at full price is
a step the summary would have saved. Waiting never costs a change:
the checkpoint is applied then anyway, and no request waits for a summary.

Per process: the checkpoint each session's last view stood on is remembered
here (bounded); a session this process has not served is not held back. And
only back to the checkpoint the ready one was made from, as the log names it
(``made_from``): a compaction made outside the request path in the meantime (an
admin ``/compact``, a client's compaction answered by the proxy, a reactive
retry's, another replica's) that the ready one was made from, or an undo of the
checkpoint the last view stood on, is the newer decision, and the view follows
it at once rather than standing on what it replaced or took back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from proxy.context.checkpoint import Checkpoint
from proxy.context.view.prepared import PreparedView
from proxy.context.view.worth import CacheRates, Moment, timely
from proxy.store.base import SessionKey

#: Sessions whose last view's checkpoint is remembered.
MAX_SESSIONS = 10_000


class ShownCheckpoints:
    """The checkpoint each recent session's last view stood on, the least recently seen dropped first."""

    def __init__(self, size: int = MAX_SESSIONS) -> None:
        self.size = size
        self._shown: OrderedDict[SessionKey, Checkpoint | None] = OrderedDict()

    def remember(self, key: SessionKey, checkpoint: Checkpoint | None) -> None:
        self._shown[key] = checkpoint
        self._shown.move_to_end(key)
        if len(self._shown) > self.size:
            self._shown.popitem(last=False)

    def held(self, key: SessionKey, moment: Moment, ready: PreparedView, hashes: Sequence[str],
             made_from: Checkpoint | None, view_on: Callable[[Checkpoint | None], PreparedView], growth: int,
             rates: CacheRates) -> PreparedView | None:
        """The view on the checkpoint the session's last view stood on (``view_on`` builds it), while ``ready``
        (the view on a checkpoint a background compaction made since, from ``made_from``) waits; None when
        ``ready`` is to be used now. ``growth``: the session's tokens a step."""
        if moment.cold or not rates.cached or key not in self._shown:
            return None
        shown = self._shown[key]
        if _key(shown) != _key(made_from) or (shown is not None and not shown.matches(hashes)):
            return None
        held = view_on(shown)
        if timely(moment, tokens=held.estimate.tokens, threshold=held.threshold, growth=growth,
                  freed=held.estimate.tokens - ready.estimate.tokens,
                  rewritten=lambda: ready.estimate.tokens - ready.unfreed, rates=rates):
            return None
        return held


def _key(checkpoint: Checkpoint | None) -> str | None:
    return checkpoint.view_key if checkpoint is not None else None
