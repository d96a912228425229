"""``/ui``: the session inspector, the admin API's view for people with a browser.

Access is the admin API's: with no ``--admin-token`` every ``/ui`` path answers
404, a page (``GET``) with a page that says how to turn the inspector on. Otherwise a page needs the sign-in cookie
(``proxy.ui.cookie``): a page request without one is sent to the sign-in form,
a data request (``/live``) gets 401. Signing in POSTs the admin token, compared
in constant time; the answer sets an HttpOnly, SameSite=Strict cookie on
``Path=/ui`` (Secure when the request came over TLS) that holds a signed expiry,
never the token, and the admin token never travels in a URL (a one-time sign-in link,
``proxy.ui.signinlinks``, carries a token of its own, spent on first use). Against CSRF: the cookie
is SameSite=Strict, and every POST under ``/ui`` (sign in, sign out, and any
later form) passes ``proxy.ui.csrf.check`` in ``guard`` before its handler: an
Origin check and a token in the form, bound to the cookie (403 otherwise).
Past a few wrong tokens the caller's address waits before its next one is
compared (``admin_token_matches``, shared with the admin API), and signing out revokes
every cookie issued before (``proxy.ui.cookie``: the store's sign-in epoch).

Every response carries a Content-Security-Policy that allows script and style
only from ``/ui/static/`` (no inline script), ``nosniff`` and
``frame-ancestors 'none'``; and everything from the log is escaped. One form
changes a session: the undo button on a compaction marker (``uncompact``), which
appends a ``retire`` entry (``proxy.context.log.undo``); nothing is ever deleted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal
from urllib.parse import quote, urlsplit

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from proxy.context.log.undo import uncompact
from proxy.errors import BadRequest, NothingToUndo, TooManyAttempts
from proxy.http.admin import admin_token_matches
from proxy.http.clients import open_route
from proxy.http.middleware import error_for, error_response
from proxy.keys import (
    compactions_key,
    engine_key,
    history_key,
    metrics_key,
    savings_key,
    settings_key,
    signin_links_key,
    store_key,
    timelines_key,
)
from proxy.render import session_infos
from proxy.sessions import logged_session_key
from proxy.store.base import FactLog, SessionInfo, SessionKey, parse_seq
from proxy.ui import STATIC_TYPES, cookie, csrf, pages, static_file
from proxy.ui.request import rebuild, request_html
from proxy.ui.timeline import Point, usage_figures

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Access = Literal["open", "page", "data"]

SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
#: Log entries per page of a session's log.
LOG_PAGE = 100
#: Sessions listed (most recently active first), and the log entries read from each one's tail for its latest view.
MAX_SESSIONS = 500
TAIL = 40


def add_routes(router: web.UrlDispatcher) -> None:
    base = "/ui/sessions/{tenant}/{session}"
    router.add_get("/ui", guard(sessions))
    router.add_get("/ui/", guard(sessions))
    router.add_get("/ui/signin", guard(signin_form, "open"))
    router.add_post("/ui/signin", guard(signin, "open"))
    router.add_get("/ui/once/{token}", guard(signin_link, "open"))
    router.add_post("/ui/signout", guard(signout))
    router.add_get("/ui/static/{name}", guard(static, "open"))
    router.add_get(base, guard(session))
    router.add_get(base + "/live", guard(live, "data"))
    router.add_get(base + "/requests/{seq:[0-9]+}", guard(request_view))
    router.add_get(base + "/entries/{seq:[0-9]+}", guard(entry))
    router.add_post(base + "/uncompact", guard(uncompact_form))
    router.add_route("*", "/ui/{tail:.*}", guard(unknown))


def guard(handler: Handler, access: Access = "page") -> Handler:
    """404 without an admin token; the cookie unless ``open``; security headers on every answer, an error's too
    (rendered here, as the middleware would); counted as ``route="ui"``."""

    @open_route  # the inspector has its own sign-in; client keys do not apply
    async def guarded(request: web.Request) -> web.StreamResponse:
        token = request.app[settings_key].admin_token
        if not token:  # off: a page says how to turn it on; data and static paths do not exist
            request.app[metrics_key].requests.labels(route="ui", status="404").inc()
            if access == "data" or request.method != "GET" or request.path.startswith("/ui/static/"):
                raise web.HTTPNotFound()
            off = _html(pages.disabled_page(), status=404)
            off.headers.update(SECURITY_HEADERS)
            return off
        response: web.StreamResponse
        try:
            if access != "open" and not await _signed_in(request, token):
                response = _sign_in_first(request, access)
            elif request.method == "POST" and (refusal := await _forged(request, token, access)):
                response = _html(pages.message_page("Refused", refusal, csrf_token=None), status=403)
            else:
                response = await handler(request)
        except Exception as exc:
            response = await error_for(request, exc)
        response.headers.update(SECURITY_HEADERS)
        response.headers.setdefault("Cache-Control", "no-store")
        request.app[metrics_key].request_served("ui", response.status)
        return response

    return guarded


async def _signed_in(request: web.Request, token: str) -> bool:
    value = request.cookies.get(cookie.NAME)
    return value is not None and cookie.valid(value, token, time.time(), await request.app[store_key].signin_epoch())


async def _forged(request: web.Request, token: str, access: Access) -> str | None:
    """Why this POST is refused as cross-site (``csrf.check``), or None; the sign-in form binds to ``PRESIGN``."""
    try:
        form = await request.post()  # aiohttp keeps it: the handler's own ``post()`` reads the same
    except (ValueError, LookupError, HttpProcessingError):  # no boundary, bad bytes or charset, a broken part
        raise BadRequest("The form cannot be read.", code="invalid_body") from None
    binding = request.cookies.get(csrf.PRESIGN if access == "open" else cookie.NAME)
    return csrf.check(admin_token=token, binding=binding, presented=form.get(csrf.FIELD),
                      origin=request.headers.get("Origin"), fetch_site=request.headers.get("Sec-Fetch-Site"),
                      host=request.host)


def form_token(request: web.Request) -> str:
    """The CSRF token for the forms of a page shown to this signed-in request (``csrf.field`` places it)."""
    return csrf.token(request.app[settings_key].admin_token or "", request.cookies.get(cookie.NAME, ""))


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _sign_in_first(request: web.Request, access: Access) -> web.Response:
    if access == "data":
        return error_response(401, "Sign in at /ui/signin first.", type="authentication_error")
    if request.method == "GET":
        return _see_other("/ui/signin?next=" + quote(request.path_qs, safe=""))
    return _signin_page(request, "/ui", "Sign in first.", status=401)


def _signin_page(request: web.Request, target: str, error: str = "", status: int = 200) -> web.Response:
    """The sign-in form, its token bound to the browser's ``PRESIGN`` cookie (set here when it has none)."""
    presign = request.cookies.get(csrf.PRESIGN) or csrf.presign_value()
    token = csrf.token(request.app[settings_key].admin_token or "", presign)
    response = _html(pages.signin_page(target, token, error), status=status)
    response.set_cookie(csrf.PRESIGN, presign, path="/ui/signin", httponly=True, samesite="Strict",
                        secure=request.secure)
    return response


def _next_path(value: object) -> str:
    """Where to go after signing in: a path under /ui on this origin, else /ui."""
    if (isinstance(value, str) and value.startswith("/ui") and not value.startswith("//") and "\\" not in value
            and value.isprintable() and not urlsplit(value).netloc):
        return value
    return "/ui"


async def signin_form(request: web.Request) -> web.Response:
    return _signin_page(request, _next_path(request.query.get("next")))


async def signin(request: web.Request) -> web.Response:
    """The admin token, checked as the admin API checks it (``admin_token_matches``: a delay after a failure)."""
    form = await request.post()
    presented, target = form.get("token"), _next_path(form.get("next"))
    try:
        matches = admin_token_matches(request, presented if isinstance(presented, str) else "")
    except TooManyAttempts as exc:
        response = _signin_page(request, target, exc.message, status=exc.status)
        response.headers.update(exc.headers)
        return response
    if not matches:
        return _signin_page(request, target, "That is not the admin token.", status=401)
    response = _see_other(target)
    _set_signin_cookie(request, response, await request.app[store_key].signin_epoch())
    return response


async def signin_link(request: web.Request) -> web.Response:
    """A one-time sign-in link (``proxy.ui.signinlinks``): the cookie ``signin`` sets, then the link's page; a
    spent, lapsed or unknown link is sent to the sign-in form."""
    links = request.app.get(signin_links_key)
    target = links.redeem(request.match_info["token"]) if links is not None else None
    if target is None:
        return _signin_page(request, "/ui", "That sign-in link was used already or has expired.", status=403)
    response = _see_other(_next_path(target))
    _set_signin_cookie(request, response, await request.app[store_key].signin_epoch())
    return response


def _set_signin_cookie(request: web.Request, response: web.Response, epoch: int) -> None:
    response.set_cookie(cookie.NAME, cookie.issue(request.app[settings_key].admin_token or "", time.time(), epoch),
                        max_age=cookie.LIFETIME, path="/ui", httponly=True, samesite="Strict", secure=request.secure)


async def signout(request: web.Request) -> web.Response:
    """Revoke every cookie issued so far (``cookie``: the epoch moves on), and delete this browser's."""
    await request.app[store_key].end_signins()
    response = _see_other("/ui/signin")
    response.del_cookie(cookie.NAME, path="/ui")
    return response


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC_TYPES:
        raise web.HTTPNotFound()
    return web.Response(body=static_file(name), content_type=STATIC_TYPES[name], headers={"Cache-Control": "no-cache"})


async def unknown(request: web.Request) -> web.Response:
    return _html(pages.message_page("Not found", "There is no such page in the inspector.",
                                    csrf_token=form_token(request)), status=404)


def _window(request: web.Request) -> tuple[int, int]:
    """The window the figures are set against (``?model=``, as the admin API) and its compaction trigger."""
    engine = request.app[engine_key]
    window = engine.window_for(request.query.get("model") or request.app[settings_key].summary_model or "")
    return window, engine.policy(window).threshold(None)


def _key(request: web.Request) -> SessionKey:
    return logged_session_key(request.match_info["tenant"], request.match_info["session"])


def _links(request: web.Request, key: SessionKey) -> pages.Links:
    return pages.Links(key, request.query.get("model", ""))


async def _latest_view(store: FactLog, info: SessionInfo) -> int | None:
    """The upstream's prompt tokens for the session's last request, if it is in the log's tail."""
    tail = await store.read(SessionKey(info.tenant, info.session), after=max(-1, info.entries - 1 - TAIL), limit=TAIL)
    for fact in reversed(tail):
        usage = fact.extra.get("usage")
        if fact.kind == "message" and fact.source == "upstream" and isinstance(usage, dict):
            prompt, _ = usage_figures(usage)
            if prompt is not None:
                return prompt
    return None


async def sessions(request: web.Request) -> web.Response:
    app = request.app
    store, compactions = app[store_key], app[compactions_key]
    infos = await session_infos(store)
    savings = app[savings_key]
    rows = [pages.SessionRow(info, await _latest_view(store, info),
                             compactions.totals(SessionKey(info.tenant, info.session)), await savings.of(store, info))
            for info in infos[:MAX_SESSIONS]]
    window, threshold = _window(request)
    return _html(pages.sessions_page(rows, total=len(infos), window=window, threshold=threshold,
                                     model=request.query.get("model", ""), csrf_token=form_token(request)))


def _missing(request: web.Request, key: SessionKey) -> web.Response:
    return _html(pages.message_page("No such session", f"No session {key.session!r} under tenant {key.tenant!r}.",
                                    csrf_token=form_token(request)), status=404)


def _query_seq(request: web.Request, name: str, default: int) -> int:
    """``?name=``, a whole number a log can count to (``parse_seq``); 400 for anything else."""
    value = request.query.get(name)
    if value is None:
        return default
    number = parse_seq(value)
    if number is None:
        raise BadRequest(f"'{name}' must be a whole number.", param=name)
    return number


def _seq(request: web.Request) -> int:
    """The entry the path names: a number a log can hold, else the log has no such entry (-1, never one)."""
    seq = parse_seq(request.match_info["seq"])
    return -1 if seq is None else seq


async def session(request: web.Request) -> web.Response:
    app, key = request.app, _key(request)
    store = app[store_key]
    window, threshold = _window(request)
    events = app[compactions_key].events(key)
    async with app[timelines_key].fold(store, key) as t:
        if t.next_seq == 0:
            return _missing(request, key)
        count = math.ceil(t.next_seq / LOG_PAGE)
        page = min(_query_seq(request, "page", count - 1), count - 1)
        facts = await store.read(key, after=page * LOG_PAGE - 1, limit=LOG_PAGE)
        return _html(pages.session_page(key, t, events, facts, page=page, pages=count, links=_links(request, key),
                                        window=window, threshold=threshold, csrf_token=form_token(request)))


async def live(request: web.Request) -> web.Response:
    """What changed since entry ``since``: the summary and the timeline again, and the new entries for the log."""
    app, key = request.app, _key(request)
    store, links = app[store_key], _links(request, key)
    since = _query_seq(request, "since", 0)
    window, threshold = _window(request)
    events = app[compactions_key].events(key)
    async with app[timelines_key].fold(store, key) as t:
        body: dict[str, object] = {"since": t.next_seq, "reading": not t.complete}
        if t.next_seq > since:
            body["summary"] = pages.summary_html(key, t, events, window, threshold)
            body["timeline"] = pages.timeline_html(t, events, links, window, threshold)
            if request.query.get("tail") == "1":
                facts = await store.read(key, after=since - 1, limit=LOG_PAGE)
                if len(facts) < LOG_PAGE:
                    body["log"] = pages.log_items(facts, t, links, form_token(request))
                else:  # too much to append: the page reloads
                    body["reload"] = True
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def _point(points: Sequence[Point], seq: int) -> Point | None:
    lo, hi = 0, len(points)
    while lo < hi:
        mid = (lo + hi) // 2
        if points[mid].seq < seq:
            lo = mid + 1
        else:
            hi = mid
    return points[lo] if lo < len(points) and points[lo].seq == seq else None


async def request_view(request: web.Request) -> web.Response:
    """Upstream request ``seq`` (its reply's entry): the view rebuilt beside the conversation it came from."""
    app, key, seq = request.app, _key(request), _seq(request)
    store, engine, links = app[store_key], app[engine_key], _links(request, key)
    async with app[timelines_key].fold(store, key) as t:
        point = _point(t.points, seq)
        checkpoint = t.checkpoints.get(point.view_key) if point is not None else None
    if point is None:
        text = f"Entry #{request.match_info['seq']} is not an upstream reply."
        return _html(pages.message_page("Not a request", text, csrf_token=form_token(request)), status=404)
    found = await rebuild(store, key, point, checkpoint, engine.projection, engine.view_settings())
    section = request_html(found, engine.counter, entry=links.entry)
    if request.query.get("fragment") == "1":
        return _html(section)
    return _html(pages.request_page(key, seq, section, links, csrf_token=form_token(request)))


async def entry(request: web.Request) -> web.Response:
    app, key, seq = request.app, _key(request), _seq(request)
    facts = await app[store_key].read(key, after=seq - 1, limit=1) if seq >= 0 else []
    if not facts or facts[0].seq != seq:
        text = f"Session {key.session!r} has no entry #{request.match_info['seq']}."
        return _html(pages.message_page("No such entry", text, csrf_token=form_token(request)), status=404)
    return _html(pages.entry_page(key, facts[0], _links(request, key), csrf_token=form_token(request)))


async def uncompact_form(request: web.Request) -> web.Response:
    """The undo button of a compaction marker (``proxy.context.log.undo``); the guard checked the sign-in and the
    CSRF token. Back to the session's page, at the retire entry, or a page saying why nothing was undone."""
    key, form = _key(request), await request.post()
    raw = form.get("checkpoint")
    seq = parse_seq(raw) if isinstance(raw, str) else None
    if seq is None:
        return _html(pages.message_page("Nothing undone", "The form names no checkpoint entry.",
                                        csrf_token=form_token(request)), status=400)
    history = request.app[history_key]
    if (await history.state(key, refresh=True)).next_seq == 0:
        return _missing(request, key)
    try:
        undone = await uncompact(history, key, seq)
    except NothingToUndo as exc:
        return _html(pages.message_page("Nothing undone", exc.message, csrf_token=form_token(request)), status=409)
    return _see_other(f"{_links(request, key).session()}#e{undone.entry}")
