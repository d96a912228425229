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

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy import offload
from proxy.clientcompact import CODEX_ENDPOINT, find_boundary, recognise
from proxy.constants import HEADER_TURN_METADATA
from proxy.context.log.lineage import ROOT, ConversationState
from proxy.context.view.applying import Requester
from proxy.context.view.prepared import PreparedView
from proxy.dialects import RESPONSES
from proxy.dialects.base import Dialect, ParsedRequest
from proxy.errors import ProxyError, StoreError
from proxy.http import clientcompaction, continuity, recall, subagents
from proxy.http.body import read_body
from proxy.http.passthrough import passthrough
from proxy.http.recall import RecallCall
from proxy.http.relay import (
    answers_stream,
    read_until_commit,
    read_whole,
    relay_stream,
    relay_whole,
)
from proxy.http.turn import Refusal, Turn
from proxy.keys import client_key, engine_key, history_key, metrics_key, settings_key, tracing_key
from proxy.logs import ACCESS_LOGGER
from proxy.metrics import Metrics
from proxy.overflow import Overflow, classify_overflow
from proxy.sessions import agent_of, credential, explicit_session, fingerprint_session, tenant_of, valid_session
from proxy.store.base import SessionKey
from proxy.upstream import client_timeout, explain_404, map_upstream_errors, request_headers, response_headers

logger = logging.getLogger(__name__)
access_logger = logging.getLogger(ACCESS_LOGGER)
async def _send(turn: Turn, view: PreparedView, started: float) -> web.StreamResponse | Overflow | RecallCall:
    """One upstream attempt: the response to give the client, the upstream's too-long refusal, or a recall call."""
    settings, dialect, request = turn.settings, turn.dialect, turn.request
    headers = request_headers(request.headers, settings, identity=True, anthropic=dialect.anthropic,
                              gemini=dialect.gemini)
    url, query = dialect.upstream_target(settings, turn.parsed, request.rel_url.query)
    body = turn.upstream_body(view, recall.offer(turn, view))
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
    for item in parsed.items:  # what is fingerprinted, checked before it is read: the leading system items and one
        dialect.check(item, parsed.items)
        if dialect.role(item) != "system":
            break
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
    conversation = subagents.conversation(dialect, parsed)
    resolved = await continuity.resolve(request, dialect, parsed, own, conversation)
    sent, (key, parsed, hashes) = parsed, (resolved.key, resolved.parsed, resolved.hashes)
    # The request's items are logged together with the reply (one append per step, after the upstream
    # answered); the view needs only the session's checkpoint, which the cached state has (caught up with the
    # log when the session was quiet for a while: ``HistoryManager.current``).
    state = await session_state(app, key)
    if "/" not in key.session and subagents.separate(dialect, sent, hashes, state):
        key = SessionKey(key.tenant, f"{key.session}/{fingerprint_of(dialect, parsed)}")  # a sub-agent, unnamed
        state = await session_state(app, key)
    metrics.session_seen(key)
    turn = Turn(request, dialect, parsed, key, hashes, state, settings, metrics, app[engine_key], conversation,
                requester=Requester(own.tenant, resolved.proved))
    # Only a request that starts a new lineage: its first message opens none of the log's conversations (one
    # that differs from the head's alone is a run returning to its own after a side call, e.g. a title call).
    if state is not None and state.hashes and hashes and not state.known_prefixes(hashes[:1], 0, ROOT):
        boundary = find_boundary(dialect.name, parsed.items)
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
