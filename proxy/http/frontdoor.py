"""The front doors: Chat Completions, the Responses API and Anthropic Messages, one handler each, one engine.

Every door does the same, in its own API's words (``proxy.dialects``): sync
the log, build the view, forward, relay, log the reply. When the upstream
refuses the prompt as too long (recognised by ``proxy.overflow`` in the error
body, or in a stream event before anything reached the client), the turn
compacts harder and retries, at most ``reactive_retries`` times; then the
client gets the upstream's first refusal, status and body unchanged.
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy import offload
from proxy.clientcompact import CODEX_ENDPOINT, find_boundary, recognise
from proxy.constants import HEADER_COMPACTED, HEADER_OVERHEAD, HEADER_SESSION, HEADER_TURN_METADATA, HEADER_VIEW_TOKENS
from proxy.context.applying import ANYONE, Requester
from proxy.context.budget import retry_limit
from proxy.context.engine import ContextEngine
from proxy.context.items import Item, leading_system_count
from proxy.context.lineage import ConversationState
from proxy.context.prepared import PreparedView
from proxy.context.summarizer import SummaryAnswer
from proxy.dialects import RESPONSES
from proxy.dialects.base import Dialect, ParsedRequest, require_string_types, with_fields
from proxy.errors import ProxyError, StoreError
from proxy.http import clientcompaction, continuity, recall, subagents
from proxy.http.body import read_body
from proxy.http.passthrough import passthrough
from proxy.http.recall import RecallCall
from proxy.http.relay import (
    RelayTiming,
    ReplySink,
    answers_stream,
    read_until_commit,
    read_whole,
    relay_stream,
    relay_whole,
)
from proxy.keys import client_key, engine_key, history_key, metrics_key, settings_key, tracing_key
from proxy.logs import ACCESS_LOGGER
from proxy.metrics import Metrics
from proxy.overflow import Overflow, classify_overflow
from proxy.savings import dollars_saved
from proxy.sessions import agent_of, credential, explicit_session, fingerprint_session, tenant_of, valid_session
from proxy.settings import Settings
from proxy.store.base import SessionKey
from proxy.store.codec import check_encodable
from proxy.summarycall import ClientRequest, summary_completer
from proxy.types import Message
from proxy.upstream import client_timeout, explain_404, map_upstream_errors, request_headers, response_headers

logger = logging.getLogger(__name__)
access_logger = logging.getLogger(ACCESS_LOGGER)
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
    #: Whom the view is for: which of the session's checkpoints it may use (``proxy.context.applying``): the
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

    def upstream_body(self, view: PreparedView) -> bytes:
        """The client's bytes when nothing changes (new fields spliced in); otherwise the payload with only what
        must change: the view, the fields ``added_fields`` allows, the prompt cache's hints, the recall tool."""
        dialect, payload = self.dialect, self.parsed.payload
        if self.history_upstream or self.settings.shadow:  # --shadow: the view is only logged
            return self.parsed.raw
        extra = {**self.added_fields(), **(recall.tools_field(self) if recall.offered(self, view) else {})}
        if not view.changed and not any(name in payload for name in extra):
            return with_fields(self.parsed.raw, extra)
        checkpoint = view.checkpoint
        summary_at = (leading_system_count(dialect, view.messages)
                      if checkpoint is not None and checkpoint.summarises else None)
        return dialect.render(self.parsed, dialect.cache_hints(payload, view.messages, summary_at), extra)

    def view_info(self, view: PreparedView) -> dict[str, Any]:
        """What each reply's log entry says of the view it answered (``view``): the inspector reads it."""
        dialect, items, hashes = self.dialect, self.parsed.items, self.hashes
        last = view.messages[-1]
        view_info: dict[str, Any] = {"key": view.view_key, "length": len(view.messages),
                                     "last": hashes[-1] if last is items[-1] else dialect.hash(last)}
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
            extra: dict[str, Any] = {"dialect": dialect.name, "view": view_info, "tokens": tokens, "model": model}
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
                                   extra_opening={"opening": subagents.opening(dialect, self.parsed)})
                saved = max(0, tokens["client"] - tokens["view"])
                self.metrics.request_saved(saved, dollars_saved(model, saved) if saved else None)
            except StoreError as exc:
                self.metrics.store_errors.inc()
                logger.warning("store error while logging the reply of session %s: %s", self.key.session, exc)

        return sink

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
                                         complete=self.summarise, requester=self.requester)

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


async def _send(turn: Turn, view: PreparedView, started: float) -> web.StreamResponse | Overflow | RecallCall:
    """One upstream attempt: the response to give the client, the upstream's too-long refusal, or a recall call."""
    settings, dialect, request = turn.settings, turn.dialect, turn.request
    headers = request_headers(request.headers, settings, identity=True, anthropic=dialect.anthropic,
                              gemini=dialect.gemini)
    url, query = dialect.upstream_target(settings, turn.parsed, request.rel_url.query)
    body = turn.upstream_body(view)
    # aiohttp writes a large bytes payload in one go; as a file it goes in chunks, read off the loop.
    data = io.BytesIO(body) if offload.is_large(len(body)) else body
    async with map_upstream_errors(url, settings), request.app[tracing_key].upstream_call(turn, url):
        turn.timing.wait_started()
        async with request.app[client_key].post(url, data=data, headers=headers,
                                                params=query, timeout=client_timeout(settings)) as resp:
            turn.timing.wait_ended()
            turn.status = resp.status
            if resp.status == 404:
                explain_404(url, anthropic=dialect.anthropic, gemini=dialect.gemini)
            streaming, head = await answers_stream(resp, turn.timing, turn.parsed.stream)
            if streaming:
                prefix, overflow = await read_until_commit(resp, turn.timing, settings.max_event_bytes, dialect,
                                                           head)
                if overflow is None and recall.offered(turn, view):
                    prefix, asked = await recall.hold(resp, prefix, turn.timing, settings.max_event_bytes, dialect)
                    if asked is not None:
                        return asked
                if overflow is None:
                    reader = dialect.reader(hide_usage=turn.asks_usage)
                    return await relay_stream(request, resp, turn.headers(view, started), turn.sink_for(view),
                                              turn.timing, reader=reader, prefix=prefix,
                                              limit=settings.max_event_bytes)
                body = b"".join(prefix) + await read_whole(resp, turn.timing)
            else:
                body = head + await read_whole(resp, turn.timing)
                overflow = classify_overflow(resp.status, body, resp.headers) if resp.status != 200 else None
            if overflow is not None:
                if turn.refusal is None:
                    turn.refusal = Refusal(resp.status, resp.headers.copy(), body)
                return overflow
            asked = recall.from_body(dialect, body) if resp.status == 200 and recall.offered(turn, view) else None
            if asked is not None:
                return asked
            return await relay_whole(resp, body, turn.headers(view, started), turn.sink_for(view), dialect)


def _refuse(turn: Turn, view: PreparedView, started: float) -> web.Response:
    """The upstream's first too-long answer, as it sent it: no retry could rescue the request."""
    if turn.refusal is None:
        raise RuntimeError("no refusal to relay")
    headers = response_headers(turn.refusal.headers, decoded=True)
    headers.update(turn.headers(view, started))
    turn.status = turn.refusal.status
    return web.Response(status=turn.refusal.status, headers=headers, body=turn.refusal.body)


def session_of(request: web.Request, dialect: Dialect, parsed: ParsedRequest) -> str:
    """The URL's or a header's session, else one the client put in the body, else the conversation's fingerprint;
    a sub-agent's requests are the session ``<session>/<agent>``."""
    session = explicit_session(request.match_info.get("session"), request.headers)
    if session is None:
        hint = dialect.session_hint(parsed.payload)
        session = hint if hint is not None and valid_session(hint) else None
    if session is None:
        session = fingerprint_of(dialect, parsed)
    agent = agent_of(request.headers)
    return f"{session}/{agent}" if agent is not None else session


def fingerprint_of(dialect: Dialect, parsed: ParsedRequest) -> str:
    """The session the conversation's opening names: its system prompt, leading system items and first user item."""
    # Gemini's systemInstruction stays out: Gemini CLI's own compression calls send its history under another
    # one, and they belong to the session of that history.
    system = parsed.payload.get("system", parsed.payload.get("instructions"))
    for index in range(min(len(parsed.items), leading_system_count(dialect, parsed.items) + 1)):
        require_string_types(f"{dialect.items_field}[{index}]", parsed.items[index])  # what is fingerprinted
    return fingerprint_session(dialect, parsed.items, system)


async def session_state(app: web.Application, key: SessionKey) -> ConversationState | None:
    """The session's state (a store failure only loses compaction: the checkpoint this process knows still serves)."""
    try:
        return await app[history_key].current(key)
    except StoreError as exc:
        app[metrics_key].store_errors.inc()
        logger.warning("store error while reading session %s: %s", key.session, exc)
        return app[history_key].cached(key)


async def open_turn(request: web.Request, dialect: Dialect) -> Turn:
    """Parse the request, find its session, and read the session's state (a store failure only loses compaction)."""
    app = request.app
    settings, metrics = app[settings_key], app[metrics_key]
    raw = await read_body(request, settings)  # the client key is checked already
    parsed = await offload.run(offload.is_large(len(raw)), dialect.parse, raw, request.match_info)
    own = SessionKey(tenant_of(credential(request.headers, request.query)), session_of(request, dialect, parsed))
    # The session the request continues (under another credential, when it proves it), its references expanded.
    resolved = await continuity.resolve(request, dialect, parsed, own)
    sent, (key, parsed, hashes) = parsed, (resolved.key, resolved.parsed, resolved.hashes)
    # The request's items are logged together with the reply (one append per step, after the upstream
    # answered); the view needs only the session's checkpoint, which the cached state has (caught up with the
    # log when the session was quiet for a while: ``HistoryManager.current``).
    state = await session_state(app, key)
    if "/" not in key.session and subagents.separate(dialect, sent, hashes, state):
        key = SessionKey(key.tenant, f"{key.session}/{fingerprint_of(dialect, parsed)}")  # a sub-agent, unnamed
        state = await session_state(app, key)
    metrics.session_seen(key)
    turn = Turn(request, dialect, parsed, key, hashes, state, settings, metrics, app[engine_key],
                requester=Requester(own.tenant, resolved.proved))
    if state is not None and state.hashes and hashes and state.hashes[0] != hashes[0]:
        boundary = find_boundary(dialect.name, parsed.items)  # only for a request that starts a new lineage
        if boundary is not None:
            turn.rewind_extra = {"client_compaction": boundary.client}
    return turn


def front_door(dialect: Dialect) -> Handler:
    """The handler of ``dialect``'s front door."""

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        metrics = request.app[metrics_key]
        turn: Turn | None = None
        status: int | None = None  # the upstream's, unless the request failed on its own
        view: PreparedView | None = None  # for the access line when the request fails before a view exists
        span = request.app[tracing_key].request(request, dialect)  # current until it ends, with the access line
        try:
            turn = await open_turn(request, dialect)
            compaction = recognise(dialect.name, turn.parsed.payload, request.headers.get(HEADER_TURN_METADATA))
            if compaction is not None and not turn.settings.shadow:  # the client's own compaction: answered from the
                # checkpoint if one can be had (under --shadow it goes upstream as sent)
                answered = await clientcompaction.answer(turn, compaction)
                if answered is not None:
                    return answered
            view = await turn.prepare()
            while True:
                outcome = await _send(turn, view, started)
                if isinstance(outcome, web.StreamResponse):
                    if view.compacted == "reactive":
                        metrics.reactive_retries.labels(outcome="ok").inc()
                    return outcome
                if isinstance(outcome, RecallCall):  # proxy.http.recall: answered from the log, unseen
                    view = await recall.answer(turn, view, outcome)
                    continue
                retry = await turn.rescue(outcome, view)  # the refused response is closed: no connection held
                if retry is None:
                    return _refuse(turn, view, started)
                view = retry
        except ProxyError as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = 499  # the client went away (nginx's convention): not an upstream failure
            raise
        except Exception:
            status = 500
            raise
        finally:
            if status is None:
                status = turn.status if turn is not None else 502
            _account(metrics, dialect.name, turn, status, view, time.perf_counter() - started)
            span.end(turn, status, view)

    return handle


async def compact_endpoint(request: web.Request) -> web.StreamResponse:
    """``POST /v1/responses/compact`` (Codex's remote compaction): one ``compaction`` item, from the checkpoint.

    Never a 404 (Codex ends the turn on one): when the proxy cannot answer, the upstream does.
    """
    started = time.perf_counter()
    span = request.app[tracing_key].request(request, RESPONSES)  # the compaction's spans go under it
    turn: Turn | None = None
    status = 500
    try:
        turn = await open_turn(request, RESPONSES)
        # The body has neither: Codex's turns stream unstored, and the ChatGPT backend takes nothing else.
        turn.summary_fields = {"stream": True, "store": False}
        answered = None if turn.settings.shadow else await clientcompaction.answer(turn, CODEX_ENDPOINT)
        if answered is None:
            response = await passthrough(request)
            status = response.status
            return response
        _account(request.app[metrics_key], RESPONSES.name, turn, answered.status, None,
                 time.perf_counter() - started)
        status = answered.status
        return answered
    except ProxyError as exc:
        status = exc.status
        raise
    finally:
        span.end(turn, status, None)


def _account(metrics: Metrics, route: str, turn: Turn | None, status: int, view: PreparedView | None,
             total: float) -> None:
    if turn is not None and offload.is_large(len(turn.parsed.raw)):
        offload.trim_soon()  # the request's objects are freed by then: the heap goes back to the OS
    upstream = turn.timing.upstream if turn is not None else 0.0
    session = turn.key.session if turn is not None else None
    metrics.request_served(route, status)
    metrics.upstream_seconds.observe(upstream)
    metrics.overhead_seconds.observe(max(total - upstream, 0.0))
    access_logger.info(
        "%s session=%s status=%s upstream_ms=%.1f proxy_ms=%.2f",
        route, session, status, upstream * 1000, (total - upstream) * 1000,
        extra={"fields": {
            "event": route, "session": session, "tenant": turn.key.tenant if turn is not None else None,
            "status": status, "view_tokens": view.estimate.tokens if view is not None else None,
            "compacted": view.compacted if view is not None else None,
            "upstream_ms": round(upstream * 1000, 1), "overhead_ms": round((total - upstream) * 1000, 2),
        }},
    )
