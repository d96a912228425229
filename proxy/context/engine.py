"""ContextEngine: the proactive path of the seed, per request: view, estimate, compact if over, view again,
and clip tool results if even that view is over the window.

It composes the parts (HistoryManager, ContextBudgetPolicy, ContextCompactor,
SummaryGenerator, ProjectionBuilder) and owns what spans requests: the per-model
policies, the shared token cache, the failure backoff, and the store lock that
keeps compaction of a session to one at a time across processes and replicas.
It stays free of HTTP: the summary call is injected as ``complete``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal

from proxy.context.background import BackgroundCompactions
from proxy.context.checkpoint import Checkpoint, CompactionResult, Tier, prefix_hash
from proxy.context.compactor import CompactionBackoff, ContextCompactor, retain_budget_for
from proxy.context.items import ItemModel, leading_system_count
from proxy.context.keep.literals import LITERALS_SHARE, literal_maker
from proxy.context.keep.pins import SHARE as PINS_SHARE
from proxy.context.keep.trail import trail_maker
from proxy.context.keep.workingset import WORKING_SET_SHARE, Tracks, WorkingSetMaker, working_set_maker
from proxy.context.log.history import HistoryManager
from proxy.context.log.lineage import TOOLS, ConversationState
from proxy.context.log.sessionlock import CompactionLock
from proxy.context.summary.callusage import CallUsage
from proxy.context.summary.summarizer import DEFAULT_MAX_OUTPUT_TOKENS, Complete, SummaryGenerator
from proxy.context.view.applying import ANYONE, Requester
from proxy.context.view.batches import checkpoint_fact, mask_batch, maskable, typical_growth
from proxy.context.view.budget import ContextBudgetPolicy, UsageSample
from proxy.context.view.clipping import entry_namer, fit_by_clipping
from proxy.context.view.holding import ShownCheckpoints, last_logged
from proxy.context.view.learned import LearnedWindows
from proxy.context.view.masking import KEEP_OUTPUTS_SHARE, Masker
from proxy.context.view.pace import DEFAULT_CACHE_TTL, SessionPace
from proxy.context.view.prepared import Compacted, PreparedView
from proxy.context.view.projection import ProjectionBuilder, SummaryPlacement, summary_text
from proxy.context.view.tokens import TokenCounter
from proxy.context.view.window import context_window_for
from proxy.context.view.worth import CacheRates, Moment, cache_rates
from proxy.errors import StoreError
from proxy.store.base import NewFact, SessionKey
from proxy.types import Message

logger = logging.getLogger(__name__)

Trigger = Literal["background", "proactive", "reactive", "manual", "client"]
#: Told of every compaction attempt: the session, its trigger, the result and the seconds it took.
CompactionObserver = Callable[[SessionKey, Trigger, CompactionResult, float], None]
DEFAULT_WINDOW = 128_000
#: Why a compaction planned before an undo (``proxy.context.log.undo``) records nothing.
UNDONE = "a compaction was undone since this one was planned"
#: Budget policies kept, one per context window (``ContextEngine.policy``).
MAX_POLICIES = 64
#: The kept outputs take at most this part of the room beside what no compaction frees (``keep_tool_tokens``).
KEEP_ROOM_DIVISOR = 5


@dataclass(frozen=True)
class EngineSettings:
    context_window: int | None = None
    compression_threshold: float = 0.8
    min_retain_rounds: int = 10
    summary_timeout: float = 120.0
    #: None: summaries are written by the request's model.
    summary_model: str | None = None
    summary_max_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
    retain_fraction: float = 0.35
    estimator: str = "tokenizer"
    summary_placement: SummaryPlacement = "user"
    #: Consecutive failed compactions before proactive attempts pause, and for how long.
    max_failures: int = 3
    failure_cooldown: float = 300.0
    #: Share of the window past which a summary starts in the background (at most the trigger).
    precompact_threshold: float = 0.6
    # -- tiers (proxy.context.view.masking, proxy.context.view.batches, proxy.context.keep.userwords) --
    #: Tool outputs never masked: the last N items holding output.
    keep_tool_outputs: int = 10
    #: Share of the window those outputs may take whole: past it, the older of them are masked as well (1: no
    #: token budget, only the count).
    keep_tool_output_share: float = KEEP_OUTPUTS_SHARE
    #: Tokens of user words carried verbatim into the summary; None: 10 % of the window.
    keep_user_words: int | None = None
    #: Placeholders tell the model it may call ``ctxproxy_recall`` (``--recall-tool``) instead of re-running.
    recall_tool: bool = False
    #: Below the threshold, a batch of old outputs is masked once it frees this share of the window (None: only
    #: at the threshold).
    mask_batch_share: float | None = 0.125
    #: Share of the window the artifact trail may take in a summary item (``proxy.context.keep.artifacts``).
    artifact_share: float = 0.10
    #: Share of the window the files in hand may take in a summary item (``proxy.context.keep.workingset``; 0: none).
    working_set_share: float = WORKING_SET_SHARE
    #: Share of the window the exact literals added back may take in a summary item (``proxy.context.keep.literals``).
    literal_share: float = LITERALS_SHARE
    #: Seconds the provider keeps a prompt cache (``--cache-ttl``): when a reduction nothing forces may land
    #: (``proxy.context.view.worth``).
    cache_ttl: float = DEFAULT_CACHE_TTL


def _usage_sample(dialect: ItemModel, state: ConversationState | None, hashes: Sequence[str]) -> UsageSample | None:
    """The upstream's count of the last view on the conversation ``hashes``' path (``ConversationState.usage_for``)."""
    found = state.usage_for(hashes) if state is not None else None
    if found is None:
        return None
    usage, view, tokens = found
    prompt = dialect.prompt_tokens(usage)
    # A shadow view (``--shadow``) was never sent: the usage measured the client's request, not it.
    if not isinstance(view, Mapping) or not isinstance(prompt, int) or view.get("shadow") is True:
        return None
    counted = (tokens or {}).get("view")
    return UsageSample(prompt, str(view.get("key", "")), int(view.get("length", 0)), str(view.get("last", "")),
                       counted if isinstance(counted, int) else None)


def _backoff_key(key: SessionKey) -> str:
    """The failure backoff's name for a session."""
    return f"{key.tenant}:{key.session}"


def _failed(job: asyncio.Task[Any]) -> bool:
    """Whether a background compaction ended without a usable outcome (failed, timed out, cancelled, raised)."""
    if job.cancelled() or job.exception() is not None:
        return True
    result, _ = job.result()
    return bool(result.outcome in ("failed", "timeout"))


def side_call(state: ConversationState | None, hashes: Sequence[str], conversation: str | None) -> bool:
    """Whether a request of ``conversation`` is a side call, not a step of the session's run.

    In a session whose run offers tools (``ConversationState.run_reply``), a
    request that offers none (a title call, a quota probe: the run's first
    message under a system prompt of their own, no reply on their path yet).
    Else one on another conversation's history: the newest reply on its path
    (``ConversationState.usage_for``) answered a request of another
    conversation (Gemini CLI's next-speaker check: the run's history and a
    question, without the run's tools). In a session where no request offered
    tools, a conversation whose path holds no reply yet is nobody's side call:
    it is its own, and small.
    """
    if state is None or conversation is None:
        return False
    if state.run_reply is not None and not conversation.endswith(TOOLS):
        return True
    found = state.usage_for(hashes)
    measured = found.view.get("conversation") if found is not None and found.view is not None else None
    return isinstance(measured, str) and measured != conversation


def step_tokens(policy: ContextBudgetPolicy, dialect: ItemModel, messages: Sequence[Message],
                hashes: Sequence[str]) -> int:
    """The growth of the last step: the tokens from the last assistant item to the end (its call and outputs)."""
    total = 0
    for message, digest in zip(reversed(messages), reversed(hashes), strict=True):
        total += policy.message_tokens(dialect, message, digest)
        if dialect.role(message) == "assistant":
            return total
    return 0


def active_checkpoint(state: ConversationState | None, hashes: Sequence[str] | None = None,
                      requester: Requester = ANYONE) -> Checkpoint | None:
    """The checkpoint that applies to the conversation ``hashes`` (default: the logged lineage) for ``requester``
    (``proxy.context.view.applying``)."""
    if state is None:
        return None
    return _checkpoint(state.checkpoint_for(state.hashes if hashes is None else hashes, requester))


def _checkpoint(payload: Mapping[str, Any] | None) -> Checkpoint | None:
    if payload is None:
        return None
    try:
        return Checkpoint.from_json(payload)
    except ValueError:
        logger.warning("ignoring a malformed checkpoint in the log")
        return None


class ContextEngine:
    def __init__(
        self,
        history: HistoryManager,
        settings: EngineSettings,
        *,
        clock: Callable[[], float] = time.time,
        observer: CompactionObserver | None = None,
        wait_observer: Callable[[float], None] | None = None,
        counter: TokenCounter | None = None,
    ) -> None:
        self.history = history
        self.settings = settings
        self.clock = clock
        self.observer = observer
        #: Told how long each request over the trigger waited on a compaction (0: it did not).
        self.wait_observer = wait_observer
        self.background = BackgroundCompactions()
        #: How fast each session steps and how long its summaries take (how far ahead a background summary starts),
        #: and when the provider's cache is cold. An injected clock (tests, benches) drives it too.
        self.pace = SessionPace(time.monotonic if clock is time.time else clock, ttl=settings.cache_ttl)
        self.lock = CompactionLock(history.log, wait=settings.summary_timeout)
        self.counter = counter if counter is not None else TokenCounter()
        self.backoff = CompactionBackoff(clock=time.monotonic, max_failures=settings.max_failures,
                                         cooldown=settings.failure_cooldown)
        self._policies: dict[int, ContextBudgetPolicy] = {}
        #: The windows upstreams taught, per model (``proxy.context.view.learned``).
        self.windows = LearnedWindows(self._configured_window)
        #: Checkpoints a background compaction made that no request's view has used yet (their view keys).
        self._unannounced: dict[SessionKey, str] = {}
        #: The checkpoint each session's last view stood on: where a ready background summary waits.
        self.shown = ShownCheckpoints()
        self.masker = Masker(self.counter, recall=settings.recall_tool)
        #: Where each session's files in hand were last tracked: the next compaction reads on from there.
        self.tracks = Tracks()

    def window_for(self, model: str | None) -> int:
        """The window to plan for: what the upstream taught us (``windows``), else the flag, else the model map,
        else 128000."""
        return self.windows.window_for(model)

    def _configured_window(self, model: str | None) -> int:
        if self.settings.context_window is not None:
            return self.settings.context_window
        return (context_window_for(model) if model else None) or DEFAULT_WINDOW

    def policy(self, window: int) -> ContextBudgetPolicy:
        """The budget policy of ``window``, one per window, kept for the next request of that window.

        Bounded (``MAX_POLICIES``, the oldest made dropped first): windows come from the model map, the flag and
        what upstreams taught (``LearnedWindows.learn``: any value), and a policy holds nothing a new one would not
        rebuild (the token counts are the shared counter's).
        """
        policy = self._policies.get(window)
        if policy is None:
            policy = ContextBudgetPolicy(window, self.settings.compression_threshold,
                                         estimator=self.settings.estimator, counter=self.counter)
            if len(self._policies) >= MAX_POLICIES:
                self._policies.pop(next(iter(self._policies)))
            self._policies[window] = policy
        return policy

    def projection(self, dialect: ItemModel) -> ProjectionBuilder:
        return ProjectionBuilder(dialect, summary_placement=self.settings.summary_placement, masker=self.masker)

    def view_settings(self) -> dict[str, object]:
        """The settings ``projection`` builds views with, by flag name: logged with each reply, so a view rebuilt
        later under other settings can say which one changed."""
        return {"summary_placement": self.settings.summary_placement, "recall_tool": self.settings.recall_tool}

    def view(self, messages: Sequence[Message], hashes: Sequence[str], state: ConversationState | None, *,
             dialect: ItemModel, window: int, tools: Sequence[Any] | None, max_output: int | None,
             compacted: Compacted = "none", limit: int | None = None, fit: bool = True,
             checkpoint: Checkpoint | None = None, session: SessionKey | None = None,
             requester: Requester = ANYONE, exactly: bool = False) -> PreparedView:
        """Build and estimate the view under the session's active checkpoint (or ``checkpoint``). Read-only.

        With ``fit``, a view over ``limit`` (default: what the upstream would
        refuse) has tool results clipped until it fits (``proxy.context.view.clipping``).
        ``session``: whose routine view this is, so that its count starts where
        the session's last view's parts from it (``TokenCounter.count_many``).
        ``requester``: whom the view is for, which decides the checkpoints it may use (``proxy.context.view.applying``;
        the default, anyone, is a session only one credential uses).
        ``exactly``: ``checkpoint`` as given, None meaning none (not the active one).
        """
        if checkpoint is None and not exactly:
            checkpoint = active_checkpoint(state, hashes, requester)
        seqs, keys = (state.entries_for(hashes, checkpoint.covers) if state is not None and checkpoint is not None
                      and checkpoint.masks else ((), ()))
        view, frozen = self.projection(dialect).layout(messages, checkpoint, seqs=seqs, keys=keys)
        changed = len(view) != len(messages) or any(a is not b for a, b in zip(view, messages, strict=True))
        policy = self.policy(window)
        estimate = policy.estimate(dialect, view, tools=tools, usage=_usage_sample(dialect, state, hashes),
                                   view_key=checkpoint.view_key if checkpoint else "",
                                   source=(view if not changed else messages, hashes), made=self.masker.digests,
                                   session=session)
        limit = policy.hard_limit(max_output) if limit is None else limit
        prepared = PreparedView(view, changed, estimate, checkpoint, compacted, policy.threshold(max_output), limit,
                                unfreed=self.unfreed(window, dialect, messages, hashes, tools), frozen=frozen)
        if not fit or estimate.tokens <= limit:
            return prepared
        # Over the limit after compaction had its chance: rare, so whole-view work is fine here.
        # The entries on the request's own path: a side call since (a title call) left the head on another branch.
        seqs = state.entries_for(hashes, len(hashes))[0] if state is not None else []
        fitted = fit_by_clipping(
            dialect, view, estimate.tokens - limit, limit, policy, entry_namer(messages, seqs),
            lambda clipped: policy.estimate(dialect, clipped, tools=tools, source=(messages, hashes)))
        if fitted is None:
            return prepared
        clipped = tuple(i for i, (cut, whole) in enumerate(zip(fitted[0], view, strict=True)) if cut is not whole)
        return replace(prepared, messages=fitted[0], changed=True, estimate=fitted[1], clipped=clipped,
                       compacted="proactive" if compacted == "none" else compacted)

    async def prepare(self, key: SessionKey, messages: Sequence[Message], hashes: Sequence[str],
                      state: ConversationState | None, *, dialect: ItemModel, model: str,
                      tools: Sequence[Any] | None, max_output: int | None, complete: Complete,
                      requester: Requester = ANYONE, tail_cached: bool = True,
                      conversation: str | None = None) -> PreparedView:
        """The proactive path: summarise ahead in the background, and make a request wait only when it must.

        Past the soft threshold (``precompact_threshold``) a background
        compaction starts; its checkpoint is in the state when it is done, and
        the view uses it once the cache's moment calls for it (``holding``: at a
        cold moment, near the trigger when worth it, at the trigger). Past the
        trigger (``threshold``) with none ready:
        while one runs and the view still fits under the hard limit, the view
        goes as it is; otherwise the request waits for it, or compacts itself. A
        failed compaction sends the view as is (clipped if over the window).

        ``state`` may lag the request (its new messages are logged with the
        reply): a view needs only the checkpoint, and a compaction first logs
        the conversation so that its checkpoint covers logged messages.

        ``tail_cached``: whether the provider reads the prompt from its cache to
        its end (the dialect says, ``caches_tail``); when not, waiting for the
        cache's moment saves nothing (``proxy.context.view.worth``).

        ``conversation``: which of the session's conversations the request is
        (its system prompt and tools, named by the caller). A side call (a
        title call, or one on another conversation's history: ``side_call``)
        leaves the session's
        reductions to that conversation: it goes over the checkpoint that
        serves its history, clipped if over the hard limit, and compacts only
        when even that is over; it starts no summary and no masking batch,
        and steps neither the session's pace nor its shown checkpoint, so the
        run compacts when and as it would without it.
        """
        if side_call(state, hashes, conversation):
            side = self.view(messages, hashes, state, dialect=dialect, window=self.window_for(model), tools=tools,
                             max_output=max_output, requester=requester)
            if side.estimate.tokens <= side.limit:
                return side
        prepared = await self._prepare(key, messages, hashes, state, dialect=dialect, model=model, tools=tools,
                                       max_output=max_output, complete=complete, requester=requester,
                                       rates=cache_rates(model, tail_cached=tail_cached))
        self.shown.remember(key, prepared.checkpoint)
        if prepared.checkpoint is not None and self._unannounced.get(key) == prepared.checkpoint.view_key:
            del self._unannounced[key]  # a request that waited for it used it: nothing waits any more
        return prepared

    async def _prepare(self, key: SessionKey, messages: Sequence[Message], hashes: Sequence[str],
                       state: ConversationState | None, *, dialect: ItemModel, model: str,
                       tools: Sequence[Any] | None, max_output: int | None, complete: Complete,
                       requester: Requester, rates: CacheRates) -> PreparedView:
        window = self.window_for(model)
        moment = self.pace.step(key)
        options: dict[str, Any] = {"dialect": dialect, "window": window, "tools": tools, "max_output": max_output,
                                   "requester": requester}
        prepared = self.view(messages, hashes, state, fit=False, session=key, **options)
        prepared, held = self._ready(key, moment, prepared, messages, hashes, state, rates, options)
        if held:
            return prepared
        # Tier 1 below the threshold (proxy.context.view.batches): a batch of old tool outputs masked, no model call,
        # when the cache's moment makes it worth its write (proxy.context.view.worth).
        prepared = await mask_batch(self, key, messages, hashes, state, prepared, dialect=dialect, model=model,
                                    window=window, tools=tools, max_output=max_output, requester=requester,
                                    moment=moment, rates=rates) or prepared
        allowed = state is not None and self.backoff.allowed(_backoff_key(key))
        soft = self.soft_threshold(key, window, prepared, dialect, messages, hashes)
        # A soft threshold at the trigger (or above) turns background compaction off; and no summary is prepared
        # while masking what is maskable now would bring the view under it (tier 1 comes first, and is free).
        ahead = soft < min(prepared.estimate.tokens, prepared.threshold)
        if ahead and state is not None and self.settings.mask_batch_share is not None:
            _, freed = maskable(self, messages, hashes, state, prepared.checkpoint, dialect=dialect, window=window,
                                room=prepared.threshold - prepared.unfreed)
            ahead = soft < prepared.estimate.tokens - freed
        # After an undo nothing is reduced ahead of need: the view compacts again only once it no longer fits.
        if allowed and ahead and state is not None and not state.undone and self.background.running(key) is None:
            self.background.start(key, self.compact(key, list(messages), list(hashes), trigger="background",
                                                    model=model, complete=complete, threshold=soft, **options))
        if prepared.estimate.tokens <= prepared.threshold:
            return prepared
        started = time.monotonic()
        ask_model = True
        latest = prepared
        job = self.background.running(key)
        if job is not None:
            if prepared.estimate.tokens <= prepared.limit:  # the summary is on its way and the view still fits
                self._waited(0.0)
                return prepared
            await self.background.join(key)
            after = self.view(messages, hashes, state, fit=False, **options)
            if after.estimate.tokens <= after.threshold:
                self._waited(time.monotonic() - started)
                return replace(after, compacted="proactive")
            if _failed(job):  # one summary attempt per request: a failed job is not tried again at once
                ask_model = False
            else:  # it made a checkpoint for an earlier step, or skipped: this request compacts further itself
                allowed = self.backoff.allowed(_backoff_key(key))
            latest = after
        over = latest.estimate.tokens > latest.limit
        if (not allowed or not ask_model) and not (over and state is not None):
            self._waited(time.monotonic() - started)
            return self.view(messages, hashes, state, **options)
        # Over the hard limit, the model-free tier stands in for a summary that cannot be had: the view never goes
        # out over the window because a summary failed (with the backoff open, it answers without a model call).
        compaction = partial(self.compact, key, messages, hashes, trigger="proactive", model=model, complete=complete,
                             threshold=prepared.threshold, model_call=allowed and ask_model, **options)
        result, state = await compaction(over_limit=over, fallback=over)
        if result.detail == UNDONE:
            # An undo landed past the lock (its holder lost the lease to a store outage) and overruled this
            # compaction: made again on what the undo left where that is over the window, never sent over it.
            left = self.view(messages, hashes, state, fit=False, **options)
            if left.estimate.tokens > left.limit:
                result, state = await compaction(over_limit=True, fallback=True)
        self._waited(time.monotonic() - started)
        after = self.view(messages, hashes, state, **options)
        # A checkpoint another request made while this one waited for the lock counts as this one's compaction.
        if result.outcome in ("ok", "fallback") or (after.checkpoint is not None
                                                    and after.checkpoint != prepared.checkpoint):
            return replace(after, compacted="proactive")
        return after

    def _ready(self, key: SessionKey, moment: Moment, prepared: PreparedView, messages: Sequence[Message],
               hashes: Sequence[str], state: ConversationState | None, rates: CacheRates,
               options: dict[str, Any]) -> tuple[PreparedView, bool]:
        """``prepared``, or the view that waits for it (``proxy.context.view.holding``) when it stands on a checkpoint
        a background compaction made since the session's last view; and whether it waits."""
        if prepared.checkpoint is None or self._unannounced.get(key) != prepared.checkpoint.view_key:
            return prepared, False
        dialect: ItemModel = options["dialect"]
        made_from = _checkpoint(state.made_from_for(hashes, options["requester"])) if state is not None else None
        held = self.shown.held(
            key, moment, prepared, hashes, made_from, growth=typical_growth(
                dialect, messages, hashes, self.policy(options["window"]).counter_for(dialect)),
            view_on=lambda shown: self.view(messages, hashes, state, fit=False, session=key, checkpoint=shown,
                                            exactly=True, **options), rates=rates, logged=last_logged(state, hashes))
        if held is not None:
            return held, True
        del self._unannounced[key]  # the first view that uses a background compaction's checkpoint says so
        return replace(prepared, compacted="background"), False

    async def aclose(self) -> None:
        """Cancel the background compactions (shutdown): a cancelled one has written nothing."""
        await self.background.aclose()

    def _unannounce(self, key: SessionKey, view_key: str) -> None:
        self._unannounced.pop(key, None)
        if len(self._unannounced) >= 10_000:  # bounded: the oldest sessions' announcements are dropped
            self._unannounced.pop(next(iter(self._unannounced)))
        self._unannounced[key] = view_key

    def _waited(self, seconds: float) -> None:
        if self.wait_observer is not None:
            self.wait_observer(seconds)

    async def compact(self, key: SessionKey, messages: Sequence[Message], hashes: Sequence[str], *,
                      trigger: Trigger, dialect: ItemModel, model: str, complete: Complete, window: int,
                      level: int = 0,
                      threshold: int | None = None, instructions: str | None = None,
                      tools: Sequence[Any] | None = None, max_output: int | None = None, over_limit: bool = False,
                      fallback: bool = False, model_call: bool = True, requester: Requester = ANYONE,
                      ) -> tuple[CompactionResult, ConversationState | None]:
        """Compact under the session lock and record the checkpoint; the state is returned caught up.

        A request that finds another compaction running waits for it (up to the
        summary timeout) and then, if the view now fits, uses that compaction's
        checkpoint instead of writing a second one. ``tools`` and ``max_output``
        are the request's: every measure counts them. ``over_limit`` (and any
        reactive ``level``) lifts the minimum gain: a view over the window must shrink. ``fallback`` lets the
        model-free tier stand in when no summary can be had (``ContextCompactor.compact``); the failure backoff,
        when open, then skips the summary call altogether. ``requester``: whom it compacts for; the checkpoint
        starts from the one that requester's view uses, and its entry names the requester's tenant as its maker.
        """
        started = time.perf_counter()
        session = _backoff_key(key)
        # With the backoff open the model is not asked (a manual compaction always asks): the model-free tier
        # answers at once where it may stand in, instead of a request waiting out another summary timeout.
        use_model = model_call and (trigger == "manual" or self.backoff.allowed(session))
        if not use_model and not fallback:
            return self.observe(key, trigger, CompactionResult("skipped", None, 0, 0, "failure backoff open"),
                                 started), self.history.cached(key)
        state: ConversationState | None
        try:
            # A checkpoint must cover logged messages: log the conversation first (usually a no-op).
            state = await self.history.sync(key, messages, hashes, extra_client={"dialect": dialect.name})
            async with self.lock.held(key) as taken:
                state = await self.history.state(key, refresh=True)
                planned_at = state.next_seq  # an undo logged from here on overrules this compaction
                if not taken:
                    return self.observe(key, trigger, CompactionResult("skipped", None, 0, 0, "lock busy"),
                                         started), state
                if trigger == "background" and state.undone:  # started before an undo that landed since
                    return self.observe(key, trigger, CompactionResult("skipped", None, 0, 0, UNDONE),
                                         started), state
                previous = active_checkpoint(state, hashes, requester)
                made_from = state.checkpoint_seq_for(hashes, requester) if previous is not None else None
                fresh = self.view(messages, hashes, state, dialect=dialect, window=window, tools=tools,
                                  max_output=max_output, fit=False, requester=requester)
                if (threshold is not None and previous is not None and level == 0
                        and fresh.estimate.tokens <= threshold):  # another request compacted while we waited
                    skipped = CompactionResult("skipped", None, 0, 0, "already compacted")
                    return self.observe(key, trigger, skipped, started), state
                system = leading_system_count(dialect, messages)
                policy = self.policy(window)
                # Room for HEADROOM_STEPS steps below where the next background summary starts (budget.py).
                growth = step_tokens(policy, dialect, messages, hashes)
                soft = self.soft_threshold(key, window, fresh, dialect, messages, hashes)
                budget = policy.tail_budget(
                    dialect, fresh.estimate, fresh.threshold, retain_budget_for(window, self.settings.retain_fraction),
                    head=messages[:system], head_hashes=hashes[:system], tools=tools,
                    summary=summary_text(previous) if previous is not None else None, soft=soft, growth=growth)
                # Tiers (proxy.context.compactor): masking when it reaches the target, else a summary; "manual" and
                # "client" (the client's own compaction) ask for the summary.
                target = None if trigger in ("manual", "client") else policy.reduced_target(
                    fresh.estimate, fresh.threshold, tools, soft=soft, growth=growth,
                    head=self.head_tokens(window, dialect, messages, hashes))
                seqs, keys = state.entries_for(hashes, len(hashes))
                room = fresh.threshold - fresh.unfreed
                result = await self._compactor(complete, window, dialect, room, key).compact(
                    messages, hashes, previous, model=model, level=level, budget=budget, instructions=instructions,
                    min_gain=0.0 if over_limit or level > 0 or trigger == "manual" else None, mask_target=target,
                    seqs=seqs, keys=keys, fallback=fallback, use_model=use_model,
                    fixed=policy.fixed_beside(fresh.estimate, tools, max_output),
                    soft=soft - policy.tools_tokens(tools),
                    lands_after=fresh.threshold - fresh.estimate.tokens)
                if result.checkpoint is not None and result.outcome in ("ok", "fallback"):
                    state, recorded = await self._record(key, result.checkpoint, dialect, (previous, made_from),
                                                         hashes, planned_at, requester,
                                                         tier=result.tier, usage=result.usage)
                    made = active_checkpoint(state, hashes, requester)
                    if not recorded:
                        result = CompactionResult("skipped", None, 0, 0, UNDONE)
                    elif trigger == "background" and made is not None:
                        self._unannounce(key, made.view_key)
        except StoreError:
            result = CompactionResult("failed", None, 0, 0, "store unavailable")
            state = self.history.cached(key)
        if use_model:  # a compaction that never called the model tells the backoff nothing new
            self.backoff.record(session, "failed" if result.summary_error else result.outcome)
        return self.observe(key, trigger, result, started), state

    def _compactor(self, complete: Complete, window: int, dialect: ItemModel,
                   room: int | None = None, key: SessionKey | None = None) -> ContextCompactor:
        """``window`` is the request model's; the summary call is sized for the summary model's own. ``room``:
        what the threshold leaves beside the part no compaction frees (``unfreed``); ``key``: the session (its files
        in hand are tracked on from its last compaction)."""
        policy = self.policy(window)
        summary_model = self.settings.summary_model
        # Chunks are counted with the budget's own text measure (the tokenizer), against the summary model's real
        # room: characters / 3 against half the window sent a 5,441-token fold as two calls where one fits.
        summarizer = SummaryGenerator.for_window(
            complete, window if summary_model is None else self.window_for(summary_model),
            max_output_tokens=self.settings.summary_max_tokens, timeout=self.settings.summary_timeout,
            count_text=policy.text_tokens)
        return ContextCompactor(summarizer, policy.counter_for(dialect), clock=self.clock,
                                projection=self.projection(dialect), min_retain_rounds=self.settings.min_retain_rounds,
                                keep_tool_outputs=self.settings.keep_tool_outputs,
                                keep_tool_tokens=self.keep_tool_tokens(window, room),
                                measure=policy,
                                user_words_budget=self.user_words_budget(window),
                                pins_budget=int(window * PINS_SHARE),
                                trail_of=trail_maker(dialect, int(window * self.settings.artifact_share),
                                                     policy.text_tokens),
                                working_set_of=self.working_set_of(dialect, window, key),
                                literals_of=literal_maker(dialect, int(window * self.settings.literal_share),
                                                          policy.text_tokens,
                                                          lent=int(window * self.settings.working_set_share)),
                                context_window=window)

    def working_set_of(self, dialect: ItemModel, window: int, key: SessionKey | None = None) -> WorkingSetMaker:
        """The files in hand a checkpoint carries (``proxy.context.keep.workingset``), in ``working_set_share`` of
        ``window``: for a summary, and for a masking batch that takes a file's text out of the view; tracked on
        from where ``key``'s last compaction left off."""
        return working_set_maker(dialect, int(window * self.settings.working_set_share),
                                 self.policy(window).text_tokens, self.tracks,
                                 (key, dialect.name) if key is not None else None)

    def keep_tool_tokens(self, window: int, room: int | None = None) -> int | None:
        """Tokens the last ``--keep-tool-outputs`` outputs may take whole: ``keep_tool_output_share`` of ``window``,
        and at most a fifth of the ``room`` beside the tool definitions under the threshold (with 9k of tools in
        16k, a quarter of the window alone is more than that room). None (a share of 1 or more): only their count.

        A fifth, not half (issue 34): the kept outputs follow the first masked one, so every masking batch makes the
        provider write them again, and they set how far below the trigger a reduction lands. At half the room, a
        16k window with 1k-token outputs rewrote two old outputs at every batch (re-write factor 1.40); at a
        fifth, the newest stays alone (written on this request anyway: 1.08), and the batches come no more often
        (docs/BENCHMARKS.md, "Prefix changes and cost at Anthropic's prices"). No floor of two typical outputs
        either: at 16k it rewrote them at every batch and landed reductions shallower (2.5k-token outputs: 20 to 34
        prefix changes, 0.35 to 0.57 of the direct cost; docs/COMPACTION.md)."""
        if self.settings.keep_tool_output_share >= 1:
            return None
        budget = int(window * self.settings.keep_tool_output_share)
        return max(1, min(budget, room // KEEP_ROOM_DIVISOR) if room is not None else budget)

    def unfreed(self, window: int, dialect: ItemModel, messages: Sequence[Message], hashes: Sequence[str],
                tools: Sequence[Any] | None) -> int:
        """Tokens of what no compaction frees: the tool definitions and the leading system messages. Codex sends
        2.2k of tools and 5.8k of developer and environment messages: counted as room to compact, they put the
        soft threshold one step above where a summary left the view, and 9 summaries came in 30 steps."""
        return self.policy(window).tools_tokens(tools) + self.head_tokens(window, dialect, messages, hashes)

    def head_tokens(self, window: int, dialect: ItemModel, messages: Sequence[Message], hashes: Sequence[str]) -> int:
        """Tokens of the leading system messages (counted once per message: the counter caches them by digest)."""
        policy = self.policy(window)
        head = leading_system_count(dialect, messages)
        return sum(policy.message_tokens(dialect, m, h) for m, h in zip(messages[:head], hashes[:head], strict=True))

    def soft_threshold(self, key: SessionKey, window: int, view: PreparedView, dialect: ItemModel,
                       messages: Sequence[Message], hashes: Sequence[str]) -> int:
        """Where a background summary starts for ``view`` (``ContextBudgetPolicy.soft_threshold``): the share
        applied to the room beside what no compaction frees, and as many steps of growth before the trigger as
        the session's summaries take of its steps (``proxy.context.view.pace``), one at least."""
        policy = self.policy(window)
        growth = step_tokens(policy, dialect, messages, hashes) * self.pace.steps_ahead(key)
        return policy.soft_threshold(self.settings.precompact_threshold, view.threshold, view.unfreed, growth)

    def user_words_budget(self, window: int) -> int:
        """Tokens of user words a summary carries (``--keep-user-words``, else 10 % of ``window``)."""
        budget = self.settings.keep_user_words
        return budget if budget is not None else window // 10

    async def _record(self, key: SessionKey, checkpoint: Checkpoint, dialect: ItemModel,
                      previous: tuple[Checkpoint | None, int | None], hashes: Sequence[str], planned_at: int,
                      requester: Requester, *, tier: Tier,
                      usage: CallUsage | None = None) -> tuple[ConversationState, bool]:
        """Append the checkpoint, after the summary item it shows when it has a new summary (a masking checkpoint
        has none to log); the state, and whether it was appended. ``previous``: the checkpoint the compaction
        started from, and its seq (what the new one is made from). The summary entry carries what its calls cost
        (``usage``, as the upstream reported it): what the savings subtract (``proxy.savings``). ``tier``: the tier
        that made the checkpoint, which its entry records.

        Not when an undo (``proxy.context.log.undo``) was logged since the
        compaction read the log (``planned_at``): the undo is the newer
        decision, and a compaction planned before it would adopt again what
        it took back (a background summary folding the retired checkpoint's).

        A masking batch (``proxy.context.view.batches``) takes no lock: when one landed
        while this compaction ran, the checkpoint keeps what the batch masked
        rather than unmasking it (the batch planned from the checkpoint this
        compaction started from, so its region is this one's or reaches further).
        """

        def plan(state: ConversationState) -> list[NewFact]:
            if state.last_retire >= planned_at:
                return []
            current = active_checkpoint(state, hashes, requester)
            final, made_from = checkpoint, previous[1]
            if (current is not None and current != previous[0] and current.masked_until > final.masked_until
                    and current.masked_until > final.retain_start_idx):
                final = replace(final, masked_until=current.masked_until,
                                prefix_hash=prefix_hash(hashes, max(final.retain_start_idx, current.masked_until)))
                made_from = state.checkpoint_seq_for(hashes, requester)  # it carries that batch's masking too
            facts = [checkpoint_fact(final, tenant=requester.tenant, made_from=made_from, tier=tier)]
            if tier != "mask":
                facts.insert(0, NewFact(kind="summary", index=final.retain_start_idx, source="proxy",
                                        message=dialect.with_summary(None, summary_text(final)),
                                        extra={"dialect": dialect.name,
                                               **(usage.to_extra() if usage is not None else {})}))
            return facts

        state = await self.history.append_planned(key, plan)
        return state, state.last_retire < planned_at

    def observe(self, key: SessionKey, trigger: Trigger, result: CompactionResult,
                 started: float) -> CompactionResult:
        elapsed = time.perf_counter() - started
        if result.outcome == "ok" and result.tier == "summary":
            self.pace.summarised(key, elapsed)
        logger.info("compaction session=%s trigger=%s outcome=%s tokens %d -> %d in %.2fs %s", key.session, trigger,
                    result.outcome, result.tokens_before, result.tokens_after, elapsed, result.detail,
                    extra={"fields": {"event": "compaction", "session": key.session, "tenant": key.tenant,
                                      "trigger": trigger, "outcome": result.outcome, "tier": result.tier,
                                      "tokens_before": result.tokens_before, "tokens_after": result.tokens_after,
                                      "seconds": round(elapsed, 3)}})
        if self.observer is not None:
            self.observer(key, trigger, result, elapsed)
        return result
