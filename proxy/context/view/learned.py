"""Windows the upstream taught: a model served with a smaller context than the map or the flag says.

An upstream that refuses a prompt as too long may state its window (Chat,
Messages) or not (Responses). A stated one is believed; an unstated one is
inferred from what was refused, and raised again when a larger prompt is
answered. Refusals only ever lower a window. Kept per model in this process
only, bounded: a restart forgets it, and the reactive path learns it again on
the first refusal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["REFUSAL_MARGIN", "LearnedWindows"]

logger = logging.getLogger(__name__)

#: Share taken off a refused prompt's estimate to learn a window from a refusal that states none.
REFUSAL_MARGIN = 0.05
#: The smallest window believed: below it a refusal is taken for something else.
MIN_WINDOW = 1024


class LearnedWindows:
    """Per model, the window learned from the upstream and whether it stated it (else it was inferred)."""

    def __init__(self, configured: Callable[[str | None], int], *, max_models: int = 1024) -> None:
        #: The window without anything learned: the flag, else the model map, else the default.
        self.configured = configured
        self._max_models = max_models
        self._learned: dict[str, tuple[int, bool]] = {}

    def window_for(self, model: str | None) -> int:
        """The window to plan for: what the upstream taught, else the configured one."""
        learned = self._learned.get(model or "")
        return learned[0] if learned is not None else self.configured(model)

    def learn(self, model: str | None, limit: int, *, stated: bool = True) -> None:
        """Believe an upstream whose window is smaller than ours: one it states, or (``stated`` False) one
        inferred from a refusal that states none (``refusal``)."""
        if limit < MIN_WINDOW or limit >= self.window_for(model):
            return
        if len(self._learned) >= self._max_models and (model or "") not in self._learned:
            self._learned.pop(next(iter(self._learned)))
        self._learned[model or ""] = (limit, stated)
        logger.warning("upstream window for model %r is %s %d tokens, smaller than assumed; planning for it", model,
                       "" if stated else "at most", limit)

    def refusal(self, model: str | None, refused_tokens: int) -> None:
        """A too-long refusal that names no window (the Responses API's): the window is below what was refused,
        ``refused_tokens`` (the prompt's estimate plus the answer room the request reserved). The bound learned
        is that less ``REFUSAL_MARGIN`` (the estimate's error), rounded down to 1 Ki tokens."""
        bound = (refused_tokens - int(refused_tokens * REFUSAL_MARGIN)) // 1024 * 1024
        self.learn(model, max(MIN_WINDOW, bound), stated=False)

    def success(self, model: str | None, prompt_tokens: int) -> None:
        """An answer to a prompt larger than a window inferred from refusals: that bound was too low (the refused
        view was overestimated, or the upstream counted a reserve this prompt did not ask for); it is raised to
        just above what succeeded, rounded up to 1 Ki tokens, and dropped once that reaches the configured
        window. A window the upstream stated is its word and stays."""
        key = model or ""
        learned = self._learned.get(key)
        if learned is None or learned[1] or prompt_tokens <= learned[0]:
            return
        raised = -(-prompt_tokens // 1024) * 1024
        configured = self.configured(model)
        if raised >= configured:
            del self._learned[key]
        else:
            self._learned[key] = (raised, False)
        logger.info("model %r answered a %d-token prompt: its window is at least that, raised to %d", model,
                    prompt_tokens, min(raised, configured))
