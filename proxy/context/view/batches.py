"""Masking in batches, below the compression threshold: the cheap reduction runs before it is needed.

Masking at the threshold alone saves little: the view then still climbs to the
threshold between reductions, as with summaries. Masking once the outputs it
would free reach a batch (``mask_batch_share`` of the window, an eighth by
default, or ``BATCH_STEPS`` of the session's typical outputs when more)
keeps the view near the system prompt, the summary, the masked region
and the last ``--keep-tool-outputs`` outputs, and each batch changes the prompt
once: the system prompt, the summary and the region masked before stay a
cached prefix, and from one batch to the next every view is a byte-identical
prefix of the next. docs/BENCHMARKS.md ("Cost of a long run") measures both.

When a batch that is there to make is made depends on the provider's prompt
cache (``proxy.context.view.worth``): at once when the view passes the trigger,
after an idle gap that left the cache cold when the trigger would come before
the next, and mid-burst only near the trigger when it saves more reads than it
rewrites; far from the trigger a warm prefix stays as it is (at 128k, batches
there rewrote the ten kept outputs every few steps: re-write factor 1.78).

A batch needs no model call and no lock wait: the checkpoint is appended only
if the session's checkpoint for this conversation is still the one the batch
was planned from (``HistoryManager.append_planned``, conditional on the log's
length like every append), so a reduction made meanwhile by another request or
replica is never overwritten, only planned again at the next step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal, Protocol

import orjson

from proxy.context.checkpoint import Checkpoint, CompactionResult, Tier, masking_checkpoint
from proxy.context.items import ItemModel, leading_system_count
from proxy.context.keep.workingset import WorkingSetMaker, refreshed
from proxy.context.log.history import HistoryManager
from proxy.context.log.lineage import ConversationState
from proxy.context.view.applying import ANYONE, Requester
from proxy.context.view.budget import ContextBudgetPolicy
from proxy.context.view.masking import Masker, first_unmasked, mask_end
from proxy.context.view.prepared import PreparedView
from proxy.context.view.worth import CacheRates, Moment, timely
from proxy.errors import StoreError
from proxy.store.base import NewFact, SessionKey
from proxy.types import Message


class MaskingSettings(Protocol):
    @property
    def keep_tool_outputs(self) -> int: ...

    @property
    def mask_batch_share(self) -> float | None: ...


class MaskingEngine(Protocol):
    """What a masking batch needs of the engine (``ContextEngine`` is one). A protocol, so that the engine imports
    this module and this module never imports the engine."""

    clock: Callable[[], float]

    @property
    def settings(self) -> MaskingSettings: ...

    @property
    def masker(self) -> Masker: ...

    @property
    def history(self) -> HistoryManager: ...

    def policy(self, window: int) -> ContextBudgetPolicy: ...

    def keep_tool_tokens(self, window: int, room: int | None = None) -> int | None: ...

    def working_set_of(self, dialect: ItemModel, window: int, key: SessionKey | None = None) -> WorkingSetMaker: ...

    def view(self, messages: Sequence[Message], hashes: Sequence[str], state: ConversationState | None, *,
             dialect: ItemModel, window: int, tools: Sequence[Any] | None, max_output: int | None,
             fit: bool = True, checkpoint: Checkpoint | None = None, requester: Requester = ANYONE) -> PreparedView: ...

    def observe(self, key: SessionKey, trigger: Literal["proactive"], result: CompactionResult,
                started: float) -> CompactionResult: ...

#: A batch frees at most this part of the room beside the tool definitions under the threshold.
BATCH_ROOM_DIVISOR = 4
#: Steps of the session's typical output a batch waits for, room allowing: a batch the size of one output changed
#: the prompt prefix every step (16k window, 2.5k-token outputs: 58 changes in 60 steps).
BATCH_STEPS = 5
#: Recent tool outputs the typical output is the median of.
TYPICAL_OF = 10


def typical_output(dialect: ItemModel, messages: Sequence[Message], size: Callable[[int], int]) -> int:
    """The median size of the last ``TYPICAL_OF`` items holding tool output (0: none yet)."""
    sizes: list[int] = []
    for index in range(len(messages) - 1, -1, -1):
        if dialect.result_paths(messages[index]):
            sizes.append(size(index))
            if len(sizes) >= TYPICAL_OF:
                break
    return sorted(sizes)[len(sizes) // 2] if sizes else 0


def typical_growth(dialect: ItemModel, messages: Sequence[Message], hashes: Sequence[str],
                   count: Callable[[Message, str | None], int]) -> int:
    """Tokens a step of the session adds, on average over its last ``TYPICAL_OF`` steps (an assistant item and
    what follows it: its calls' outputs, the user's words); 0 before its first step."""
    total = steps = 0
    for index in range(len(messages) - 1, -1, -1):
        if dialect.role(messages[index]) == "system":
            break
        total += count(messages[index], hashes[index])
        if dialect.role(messages[index]) == "assistant":
            steps += 1
            if steps >= TYPICAL_OF:
                break
    return total // steps if steps else 0


def checkpoint_fact(checkpoint: Checkpoint, *, tenant: str | None, made_from: int | None, tier: Tier) -> NewFact:
    """The log entry of a checkpoint (``index``: where its verbatim history resumes), naming the tenant that made
    it (None: the session's owner), the checkpoint it was made from (``proxy.context.view.applying``) and the tier
    that made it, which every count of compactions reads (``proxy.context.log.tiers``)."""
    extra: dict[str, Any] = {"checkpoint": orjson.loads(checkpoint.to_json()), "made_from": made_from,
                             "tier": tier}
    if tenant is not None:
        extra["tenant"] = tenant
    return NewFact(kind="checkpoint", index=checkpoint.retain_start_idx, source="proxy", extra=extra)


def _current(state: ConversationState, hashes: Sequence[str], requester: Requester) -> Checkpoint | None:
    payload = state.checkpoint_for(hashes, requester)
    try:
        return Checkpoint.from_json(payload) if payload is not None else None
    except ValueError:
        return None


def maskable(engine: MaskingEngine, messages: Sequence[Message], hashes: Sequence[str], state: ConversationState,
             previous: Checkpoint | None, *, dialect: ItemModel, window: int,
             room: int | None = None) -> tuple[int, int]:
    """Where masking would end now (everything older than the last ``keep_tool_outputs`` outputs, fewer when they
    pass ``ContextEngine.keep_tool_tokens`` of the ``room`` beside the tools) and the tokens it would free.
    Remembered per prefix: a request pays for what is new."""
    start = first_unmasked(dialect, messages, previous.retain_start_idx if previous else None,
                           previous.masked_until if previous else 0)
    count = engine.policy(window).counter_for(dialect)
    end = mask_end(dialect, messages, start, engine.settings.keep_tool_outputs, budget=engine.keep_tool_tokens(
        window, room), size=lambda index: count(messages[index], hashes[index]))
    if end <= start:
        return end, 0
    seqs, keys = state.entries_for(hashes, end)
    return end, engine.masker.freed(dialect, messages, hashes, start, end, seqs, keys, count)


async def mask_batch(engine: MaskingEngine, key: SessionKey, messages: Sequence[Message], hashes: Sequence[str],
                     state: ConversationState | None, prepared: PreparedView, *, dialect: ItemModel, model: str,
                     window: int, tools: Sequence[Any] | None, max_output: int | None,
                     moment: Moment, rates: CacheRates, requester: Requester = ANYONE) -> PreparedView | None:
    """The view after masking a batch, when one is due; None when not (or when the store fails: nothing changes).
    ``requester``: whom the view is for (``proxy.context.view.applying``): the batch is made from its checkpoint.
    ``moment``: the provider's cache as this request finds it (``SessionPace.step``); ``rates``: its prices
    (``proxy.context.view.worth.cache_rates``).

    Due when the outputs older than the last ``keep_tool_outputs`` that are not
    masked yet would free a batch of tokens, and the moment is right for the
    cache (``proxy.context.view.worth.timely``: at the trigger; after an idle gap
    when the trigger would come before the next; mid-burst only near the trigger
    and when it saves more than it rewrites; at once when the prompt is not
    cached to its end). The work before that decision
    grows with those outputs only, which a batch bounds.
    """
    share = engine.settings.mask_batch_share
    if state is None or share is None or state.undone:  # after an undo, only the trigger reduces the view again
        return None
    # A batch is at most a quarter of the room beside the tool definitions (and the leading system messages): with
    # 9k of tools in 16k, an eighth of the window was more than half that room, and summaries came before masking.
    room = prepared.threshold - prepared.unfreed
    batch = max(1, min(int(window * share), room // BATCH_ROOM_DIVISOR))
    # Hysteresis: a batch lasts several steps of the session's typical output, as far as the room beside the kept
    # outputs allows (past it the trigger comes first, and compacts as much).
    count = engine.policy(window).counter_for(dialect)
    typical = typical_output(dialect, messages, lambda index: count(messages[index], hashes[index]))
    kept = engine.keep_tool_tokens(window, room) or 0
    batch = max(batch, min(BATCH_STEPS * typical, room - kept - typical))
    if prepared.estimate.tokens <= batch:
        return None
    previous = prepared.checkpoint
    end, freed = maskable(engine, messages, hashes, state, previous, dialect=dialect, window=window, room=room)
    if freed < batch:
        return None
    start = first_unmasked(dialect, messages, previous.retain_start_idx if previous else None,
                           previous.masked_until if previous else 0)

    def rewritten() -> int:
        """What the provider writes again: the view from the first masked item on, less what masking frees and the
        last step (new on this request: written anyway)."""
        last = next((i for i in range(len(messages) - 1, start - 1, -1) if dialect.role(messages[i]) == "assistant"),
                    start)
        return max(0, sum(count(m, h) for m, h in zip(messages[start:last], hashes[start:last], strict=True)) - freed)

    if not timely(moment, tokens=prepared.estimate.tokens, threshold=prepared.threshold,
                  growth=typical_growth(dialect, messages, hashes, count), freed=freed, rewritten=rewritten,
                  rates=rates):
        return None
    started = time.perf_counter()
    try:
        # The checkpoint must cover logged messages (and its placeholders name log entries): log them first.
        state = await engine.history.sync(key, messages, hashes, extra_client={"dialect": dialect.name})
        candidate = masking_checkpoint(previous, end, hashes, system_end=leading_system_count(dialect, messages),
                                       model=model, created_at=engine.clock(),
                                       tokens_before=prepared.estimate.tokens)
        candidate = refreshed(candidate, engine.working_set_of(dialect, window, key), messages,
                              state.entries_for(hashes, len(hashes))[0])
        after = engine.view(messages, hashes, state, dialect=dialect, window=window, tools=tools,
                            max_output=max_output, fit=False, checkpoint=candidate)
        candidate = replace(candidate, tokens_after=after.estimate.tokens)

        def plan(current: ConversationState) -> list[NewFact]:
            if _current(current, hashes, requester) != previous:
                return []
            made_from = current.checkpoint_seq_for(hashes, requester) if previous is not None else None
            return [checkpoint_fact(candidate, tenant=requester.tenant, made_from=made_from, tier="mask")]

        state = await engine.history.append_planned(key, plan)
    except StoreError:
        return None
    view = engine.view(messages, hashes, state, dialect=dialect, window=window, tools=tools, max_output=max_output,
                       fit=False, requester=requester)
    if view.checkpoint != candidate:
        return view  # another reduction came first: this step goes with it
    engine.observe(key, "proactive", CompactionResult("ok", candidate, prepared.estimate.tokens, view.estimate.tokens,
                                                     f"masked a batch of tool outputs before #{end}", tier="mask"),
                  started)
    return replace(view, compacted="proactive")
