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

The checkpoint the session's last view stood on is the one the log names
(each upstream reply's entry names the view it answered, ``view``), so any
replica's: a view another replica over the same store already sent on the
ready checkpoint is not followed by one held back to the older, which would
change the prompt prefix twice more. Where the log names no view on the
request's path (no reply logged yet, or none with ``usage``: an upstream that
reports none, a call that failed), the one this process last sent does
(remembered per session, bounded); a session neither names is not held back,
nor one where either already used the ready checkpoint. And
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
from proxy.context.log.lineage import ConversationState
from proxy.context.view.prepared import CLIPPED, PreparedView
from proxy.context.view.worth import CacheRates, Moment, timely
from proxy.store.base import SessionKey

#: Sessions whose last view's checkpoint is remembered.
MAX_SESSIONS = 10_000


class ShownCheckpoints:
    """The checkpoint each recent session's last view this process sent stood on (its ``view_key``, "" for none),
    the least recently seen dropped first."""

    def __init__(self, size: int = MAX_SESSIONS) -> None:
        self.size = size
        self._shown: OrderedDict[SessionKey, str] = OrderedDict()

    def remember(self, key: SessionKey, checkpoint: Checkpoint | None) -> None:
        self._shown[key] = _key(checkpoint)
        self._shown.move_to_end(key)
        if len(self._shown) > self.size:
            self._shown.popitem(last=False)

    def held(self, key: SessionKey, moment: Moment, ready: PreparedView, hashes: Sequence[str],
             made_from: Checkpoint | None, view_on: Callable[[Checkpoint | None], PreparedView], growth: int,
             rates: CacheRates, logged: str | None) -> PreparedView | None:
        """The view on ``made_from`` (``view_on`` builds it) when the session's last view stood on it, while
        ``ready`` (the view on a checkpoint a background compaction made since, from ``made_from``) waits; None
        when ``ready`` is to be used now. ``logged``: the checkpoint the last view the log names stood on
        (``last_logged``); ``growth``: the session's tokens a step."""
        sent = self._shown.get(key)
        last = logged if logged is not None else sent
        if moment.cold or not rates.cached or last is None or _key(ready.checkpoint) in (logged, sent):
            return None
        if last != _key(made_from) or (made_from is not None and not made_from.matches(hashes)):
            return None
        held = view_on(made_from)
        if timely(moment, tokens=held.estimate.tokens, threshold=held.threshold, growth=growth,
                  freed=held.estimate.tokens - ready.estimate.tokens,
                  rewritten=lambda: ready.estimate.tokens - ready.unfreed, rates=rates):
            return None
        return held


def last_logged(state: ConversationState | None, hashes: Sequence[str]) -> str | None:
    """The ``view_key`` of the checkpoint the newest reply logged on the conversation ``hashes``' path answered
    ("" for none; a clipped view's base), whichever replica sent it; None when the log names none."""
    found = state.usage_for(hashes) if state is not None else None
    key = found.view.get("key") if found is not None and found.view is not None else None
    return key.removesuffix(CLIPPED) if isinstance(key, str) else None


def _key(checkpoint: Checkpoint | None) -> str:
    return checkpoint.view_key if checkpoint is not None else ""
