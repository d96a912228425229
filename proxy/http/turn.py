"""One request's journey through a front door (``Turn``): what the reply sink, the retries and the features built on
a turn (recall, the client's own compaction, token counts) read of it.

A module of its own, below the front door and everything that takes a turn: ``proxy.http.frontdoor`` opens and
sends turns, ``proxy.http.recall`` and ``proxy.http.clientcompaction`` answer from one, and none of them is
imported here, so ``http/`` has no import circle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy import offload
from proxy.constants import HEADER_COMPACTED, HEADER_OVERHEAD, HEADER_SESSION, HEADER_VIEW_TOKENS
from proxy.context.engine import ContextEngine
from proxy.context.items import Item
from proxy.context.log.lineage import ConversationState
from proxy.context.summary.summarizer import SummaryAnswer
from proxy.context.view.applying import ANYONE, Requester
from proxy.context.view.budget import reachable, retry_limit
from proxy.context.view.prepared import PreparedView
from proxy.dialects.base import Dialect, ParsedRequest, with_fields
from proxy.errors import StoreError
from proxy.http import subagents
from proxy.http.relay import (
    RelayTiming,
    ReplySink,
)
from proxy.keys import client_key, history_key, prefixes_key, tracing_key
from proxy.metrics import Metrics
from proxy.overflow import Overflow
from proxy.savings import cache_figures, cache_write_price, dollars_saved, prefix_fields
from proxy.settings import Settings
from proxy.store.base import SessionKey
from proxy.store.codec import check_encodable
from proxy.summarycall import ClientRequest, summary_completer
from proxy.types import Message

logger = logging.getLogger(__name__)

#: Under ``(CLIENT_SUM, key)`` the token sum keeps a session's last whole request, beside its view (``key``).
CLIENT_SUM = "client"


@dataclass
class Refusal:
    """The upstream's first too-long answer, relayed unchanged if no retry rescues the request."""

    status: int
    headers: Any
    body: bytes


@dataclass
class Turn:
    """One request's journey; holds what the reply sink and the retries need."""

    request: web.Request
    dialect: Dialect
    parsed: ParsedRequest
    key: SessionKey
    hashes: list[str]
    state: ConversationState | None
    settings: Settings
    metrics: Metrics
    engine: ContextEngine
    #: Which of the session's conversations this request is (``proxy.http.subagents.conversation``): the run's, or
    #: a side call's.
    conversation: str
    timing: RelayTiming = field(default_factory=RelayTiming)
    status: int = 502
    refusal: Refusal | None = None
    attempts: int = 0
    #: Goes with a rewind this request makes: the client compacted its history itself (its summary leads it).
    rewind_extra: dict[str, Any] | None = None
    #: Recall rounds answered so far (``proxy.http.recall``).
    recalls: int = 0
    #: Fields the summary calls made for this request set besides the client's (``proxy.summarycall``).
    summary_fields: dict[str, Any] = field(default_factory=dict)
    #: Whom the view is for: which of the session's checkpoints it may use (``proxy.context.view.applying``): the
    #: request's own tenant, and when it continues another tenant's session how many of its first items proved it
    #: (``continuity.Resolved.proved``): of checkpoints made under another credential, only those within them.
    requester: Requester = ANYONE
    #: What the upstream's answer reported (its usage, the model that answered) and the proxy's counts of the
    #: client's request and the view (``request_tokens``), once the reply is logged: for the request's span.
    usage: dict[str, Any] | None = None
    answered: str | None = None
    tokens: dict[str, int] | None = None

    @property
    def max_output(self) -> int | None:
        return self.dialect.max_output(self.parsed.payload)

    @property
    def history_upstream(self) -> bool:
        """Whether the conversation's history lives upstream (the Responses API's ``previous_response_id``): the
        request then carries only what is new, and goes as the client sent it."""
        return "previous_response_id" in self.parsed.payload

    @property
    def as_sent(self) -> bool:
        """Whether the conversation goes upstream as the client sent it, never compacted, masked or clipped ahead:
        its history lives upstream (``previous_response_id``), or the upstream was asked to compact or clear it
        itself (``Dialect.upstream_manages``). Its items and the reply are logged all the same."""
        return self.history_upstream or self.dialect.upstream_manages(self.parsed.payload)

    @property
    def asks_usage(self) -> bool:
        """Whether the request goes with usage asked for on the client's behalf (hidden from it in the stream)."""
        return self.settings.adds_fields and self.dialect.usage_request(self.parsed) is not None

    def added_fields(self) -> dict[str, Any]:
        """Fields the client did not send: usage in a stream, the prompt cache's key; only for an upstream known
        to take them (``--add-fields``: Azure OpenAI refuses the whole request over one it does not know).
        Without them a stream's usage is missing and the estimate falls back to the tokenizer."""
        if not self.settings.adds_fields:
            return {}
        return {**(self.dialect.usage_request(self.parsed) or {}),
                **self.dialect.cache_fields(self.parsed.payload, self.key.session)}

    def upstream_body(self, view: PreparedView, offered: Mapping[str, Any] | None = None) -> bytes:
        """The client's bytes when nothing changes (new fields spliced in); otherwise the payload with only what
        must change: the view, the fields ``added_fields`` allows, the prompt cache's hints, and ``offered``: fields a
        feature adds to this attempt (the recall tool, ``proxy.http.recall.offer``)."""
        dialect, payload = self.dialect, self.parsed.payload
        if self.history_upstream or self.settings.shadow:  # --shadow: the view is only logged
            return self.parsed.raw
        extra = {**self.added_fields(), **(offered or {})}
        if not view.changed and not any(name in payload for name in extra):
            return with_fields(self.parsed.raw, extra)
        hinted = dialect.cache_hints(payload, view.messages, view.frozen, adds_fields=self.settings.adds_fields)
        return dialect.render(self.parsed, hinted, extra)

    def view_info(self, view: PreparedView) -> dict[str, Any]:
        """What each reply's log entry says of the view it answered (``view``): the inspector reads it."""
        dialect, items, hashes = self.dialect, self.parsed.items, self.hashes
        last = view.messages[-1]
        view_info: dict[str, Any] = {"key": view.view_key, "length": len(view.messages),
                                     "last": hashes[-1] if last is items[-1] else dialect.hash(last),
                                     "conversation": self.conversation}
        if view.clipped:  # which items went upstream cut to fit (the inspector marks them; the log has them whole)
            view_info["clipped"] = list(view.clipped)
        if self.settings.shadow:  # the view was computed, not sent: the inspector says so
            view_info["shadow"] = True
        # What shaped the view, for the inspector to name when a rebuild differs: the window (and whether the
        # upstream taught it) and the view's settings.
        window = self.engine.window_for(self.parsed.model)
        view_info["window"] = window
        if window != self.engine.windows.configured(self.parsed.model):
            view_info["learned_window"] = True
        view_info["settings"] = self.engine.view_settings()
        return view_info

    def sink_for(self, view: PreparedView) -> ReplySink:
        history = self.request.app[history_key]
        dialect, items, hashes = self.dialect, self.parsed.items, self.hashes
        view_info = self.view_info(view)

        async def sink(reply: list[Item], usage: dict[str, Any] | None, complete: bool, reply_id: str | None,
                       answered: str | None) -> None:
            self.usage, self.answered = usage, answered
            if usage is not None:
                prompt = dialect.prompt_tokens(usage)
                self.metrics.usage_reported(prompt, dialect.cached_tokens(usage))
                if prompt is not None:  # a window inferred from refusals may turn out too low
                    self.engine.windows.success(self.parsed.model, prompt)
            if not reply:
                return
            tokens = self.tokens = self.request_tokens(view)
            if self.settings.shadow:  # what went upstream is what the client sent: nothing was saved
                tokens = {"client": tokens["client"], "view": tokens["client"], "shadow_view": tokens["view"]}
            model = answered or self.parsed.model  # what the upstream bills; the client's name where it gave none
            prefix = self.prefix(view)
            extra: dict[str, Any] = {"dialect": dialect.name, "view": view_info, "tokens": tokens, "model": model,
                                     "prefix": prefix}
            if usage is not None:
                extra["usage"] = usage
            if not complete:
                extra["partial"] = True
            if reply_id is not None:
                extra["response_id"] = reply_id
            previous = self.parsed.payload.get("previous_response_id")
            try:
                for item in reply:  # an unwritable reply is refused here, never kept for a retry
                    check_encodable(item, extra)
                await history.sync(self.key, [*items, *reply], [*hashes, *map(dialect.hash, reply)],
                                   upstream_from=len(items), extra_upstream=extra,
                                   extra_client={"dialect": dialect.name}, extra_rewind=self.rewind_extra,
                                   after_response=previous if isinstance(previous, str) else None,
                                   extra_opening=lambda: {"opening": subagents.opening(dialect, self.parsed)})
                saved = max(0, tokens["client"] - tokens["view"])
                self.metrics.request_saved(saved, dollars_saved(model, saved) if saved else None)
                prompt = dialect.prompt_tokens(usage) if usage is not None else None
                tracker = self.request.app[prefixes_key]
                cache = cache_figures(usage, prompt, tokens["client"], tokens["view"], prefix_fields(prefix),
                                      tracker.ratio(self.key))
                price = cache_write_price(model)
                self.metrics.prefix_seen(prefix["cause"] if prefix["changed"] else None, cache,
                                         cache.caused * price if cache.caused and price is not None else None,
                                         tracker.grow(self.key, cache.context, cache.ratio))
            except StoreError as exc:
                self.metrics.store_errors.inc()
                logger.warning("store error while logging the reply of session %s: %s", self.key.session, exc)

        return sink

    def prefix(self, view: PreparedView) -> dict[str, Any]:
        """How what went upstream compares with its conversation's previous request (``proxy.prefixes``): the reply
        entry's ``prefix``. ``kept_tokens``: the proxy's count of the part shared (0 when the cache had lapsed or the
        conversation had nothing to share yet)."""
        dialect, items, hashes = self.dialect, self.parsed.items, self.hashes
        if self.settings.shadow:  # what went upstream is the client's conversation
            sent, digests, checkpoint = items, list(hashes), None
        else:
            sent = view.messages
            known = reachable((items, hashes), len(sent))
            made = self.engine.masker.digests  # masked outputs: hashed once, when the masker made them
            digests = [known.get(id(message)) or made.get(id(message)) or dialect.hash(message) for message in sent]
            checkpoint = view.checkpoint
        change = self.request.app[prefixes_key].compare(self.key, self.conversation, digests, hashes, checkpoint)
        counter = self.engine.counter
        added = sum(counter.message_tokens(dialect, message, digest)
                    for message, digest in zip(items[change.added:], hashes[change.added:], strict=True))
        if change.cause == "ttl" or (not change.changed and not change.kept):  # lapsed, or the conversation's first
            return change.entry(0, added)
        past = sum(counter.message_tokens(dialect, message, digest)
                   for message, digest in zip(sent[change.kept:], digests[change.kept:], strict=True))
        total = view.estimate.local if not self.settings.shadow else (self.tokens or {}).get("client", 0)
        return change.entry(max(0, total - past), added)

    def request_tokens(self, view: PreparedView) -> dict[str, int]:
        """The proxy's count of what the client sent and of the view sent instead (``proxy.savings``); the
        client's whole request is counted only when the view differs, from where it parts from the session's
        last (``TokenCounter.count_many``, under a name beside the view's: the two part at the summary)."""
        if not view.changed:
            return {"client": view.estimate.local, "view": view.estimate.local}
        policy = self.engine.policy(self.engine.window_for(self.parsed.model or ""))
        whole = policy.estimate(self.dialect, self.parsed.items, tools=self.parsed.fixed,
                                source=(self.parsed.items, self.hashes), session=(CLIENT_SUM, self.key))
        return {"client": whole.local, "view": view.estimate.local}

    def headers(self, view: PreparedView, started: float) -> dict[str, str]:
        overhead = (time.perf_counter() - started - self.timing.upstream) * 1000
        return {HEADER_SESSION: self.key.session, HEADER_COMPACTED: view.compacted,
                HEADER_VIEW_TOKENS: str(view.estimate.tokens), HEADER_OVERHEAD: f"{overhead:.2f}"}

    async def prepare(self) -> PreparedView:
        """The view to send: the proactive trigger, unless the conversation goes as sent (``as_sent``)."""
        tools, model = self.parsed.fixed, self.parsed.model or ""
        if offload.is_large(len(self.parsed.raw)):  # counted in the pool: the view then finds every count cached
            await offload.run(True, self.engine.counter.count_many, self.dialect, self.parsed.items, self.hashes)
        if self.as_sent:
            return self.sent_view()
        return await self.engine.prepare(self.key, self.parsed.items, self.hashes, self.state, dialect=self.dialect,
                                         model=model, tools=tools, max_output=self.max_output,
                                         complete=self.summarise, requester=self.requester,
                                         tail_cached=self.dialect.caches_tail(self.parsed.payload),
                                         conversation=self.conversation)

    def sent_view(self) -> PreparedView:
        """The client's items as they are, estimated: no checkpoint, no clipping."""
        return self.engine.view(self.parsed.items, self.hashes, None, dialect=self.dialect,
                                window=self.engine.window_for(self.parsed.model or ""), tools=self.parsed.fixed,
                                max_output=self.max_output, fit=False)

    async def rescue(self, overflow: Overflow, refused: PreparedView) -> PreparedView | None:
        """Compact harder after a too-long refusal; the new view, or None when nothing can be done.

        Each attempt is one level harder: the compactor halves the retained tail
        and its rounds per level, down to the split-inside-a-round minimum. The
        retry must also come in under what was refused (``retry_limit``), with
        tool results clipped if that is what it takes, so a view that compaction
        cannot shrink (one huge result in the last step) still gets through. When no summary can be had (it
        fails, or the failure backoff is open and none is tried) the model-free tier stands in at once.

        A request the upstream was asked to compact or clear itself is rescued too: a refusal means its own
        context management did not bring the prompt under the window, and a dead run helps no one. The retry
        keeps the client's ``context_management``; only a history kept upstream cannot be rescued.
        """
        self.attempts += 1
        attempt = self.attempts
        if attempt > self.settings.reactive_retries or self.history_upstream or self.settings.shadow:
            return None
        model = self.parsed.model or ""
        if overflow.limit_tokens is not None:
            self.engine.windows.learn(model, overflow.limit_tokens)
        else:  # no figure, but the window is below what was refused: later views are planned under that too
            self.engine.windows.refusal(model, refused.estimate.tokens + (self.max_output or 0))
        window = self.engine.window_for(model)
        items, tools, max_output = self.parsed.items, self.parsed.fixed, self.max_output
        compacted = False
        if self.state is not None:  # without a state the store is down: no compaction, clipping still helps
            result, state = await self.engine.compact(self.key, items, self.hashes, trigger="reactive",
                                                      dialect=self.dialect, model=model, complete=self.summarise,
                                                      window=window, level=attempt, tools=tools,
                                                      max_output=max_output, fallback=True,
                                                      requester=self.requester)
            compacted = result.outcome in ("ok", "fallback")
            self.state = state if state is not None else self.state
        limit = retry_limit(self.engine.policy(window).hard_limit(max_output), refused.estimate.tokens)
        view = self.engine.view(items, self.hashes, self.state, dialect=self.dialect, window=window, tools=tools,
                                max_output=max_output, compacted="reactive", limit=limit, requester=self.requester)
        if not compacted and not view.estimate.tokens < refused.estimate.tokens:
            self.metrics.reactive_retries.labels(outcome="failed").inc()
            return None
        return view

    async def summarise(self, messages: list[Message], max_tokens: int) -> SummaryAnswer:
        """The summary call, as the caller and shaped like its request, with the fields the request goes upstream
        with (the prompt cache's key); its headers are built only when a compaction needs them."""
        cache = self.dialect.cache_fields(self.parsed.payload, self.key.session) if self.settings.adds_fields else {}
        fields = {**cache, **self.summary_fields}
        shape = ClientRequest(self.parsed, self.request.rel_url.query, fields)
        model = self.settings.summary_model or self.parsed.model or ""
        complete = summary_completer(self.request.app[client_key], self.settings, self.request.headers, model,
                                     self.dialect, shape)
        return await self.request.app[tracing_key].summary_calls(complete, self.dialect, model)(messages, max_tokens)
