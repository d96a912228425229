"""``/ui``: the session inspector, the admin API's view for people with a browser.

Access is the admin API's: with no ``--admin-token`` every ``/ui`` path answers
404, as if it did not exist. Otherwise a page needs the sign-in cookie
(``proxy.ui.cookie``): a page request without one is sent to the sign-in form,
a data request (``/live``) gets 401. Signing in POSTs the admin token, compared
in constant time; the answer sets an HttpOnly, SameSite=Strict cookie on
``Path=/ui`` (Secure when the request came over TLS) that holds a signed expiry,
never the token, and no token ever travels in a URL. Against CSRF: the cookie
is SameSite=Strict and the only state changes (sign in, sign out) are POSTs.

Every response carries a Content-Security-Policy that allows script and style
only from ``/ui/static/`` (no inline script), ``nosniff`` and
``frame-ancestors 'none'``; and everything from the log is escaped. The log is
only read here; nothing under ``/ui`` changes a session.
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal
from urllib.parse import quote, urlsplit

import orjson
from aiohttp import web

from proxy.errors import ProxyError
from proxy.http.clients import open_route
from proxy.http.middleware import error_response
from proxy.keys import compactions_key, engine_key, metrics_key, settings_key, store_key, timelines_key
from proxy.render import session_infos
from proxy.sessions import logged_session_key
from proxy.store.base import FactLog, SessionInfo, SessionKey
from proxy.ui import STATIC_TYPES, cookie, pages, static_file
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
    router.add_post("/ui/signout", guard(signout))
    router.add_get("/ui/static/{name}", guard(static, "open"))
    router.add_get(base, guard(session))
    router.add_get(base + "/live", guard(live, "data"))
    router.add_get(base + "/requests/{seq:[0-9]+}", guard(request_view))
    router.add_get(base + "/entries/{seq:[0-9]+}", guard(entry))
    router.add_route("*", "/ui/{tail:.*}", guard(unknown))


def guard(handler: Handler, access: Access = "page") -> Handler:
    """404 without an admin token; the cookie unless ``open``; security headers; counted as ``route="ui"``."""

    @open_route  # the inspector has its own sign-in; client keys do not apply
    async def guarded(request: web.Request) -> web.StreamResponse:
        status = 500
        response: web.StreamResponse
        try:
            token = request.app[settings_key].admin_token
            if not token:
                raise web.HTTPNotFound()
            if access != "open" and not cookie.valid(request.cookies.get(cookie.NAME), token, time.time()):
                response = _sign_in_first(request, access)
            else:
                response = await handler(request)
            response.headers.update(SECURITY_HEADERS)
            response.headers.setdefault("Cache-Control", "no-store")
            status = response.status
            return response
        except (ProxyError, web.HTTPException) as exc:
            status = exc.status
            raise
        finally:
            request.app[metrics_key].request_served("ui", status)

    return guarded


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _sign_in_first(request: web.Request, access: Access) -> web.Response:
    if access == "data":
        return error_response(401, "Sign in at /ui/signin first.", type="authentication_error")
    if request.method == "GET":
        return _see_other("/ui/signin?next=" + quote(request.path_qs, safe=""))
    return _html(pages.signin_page("/ui", "Sign in first."), status=401)


def _next_path(value: object) -> str:
    """Where to go after signing in: a path under /ui on this origin, else /ui."""
    if (isinstance(value, str) and value.startswith("/ui") and not value.startswith("//") and "\\" not in value
            and value.isprintable() and not urlsplit(value).netloc):
        return value
    return "/ui"


async def signin_form(request: web.Request) -> web.Response:
    return _html(pages.signin_page(_next_path(request.query.get("next"))))


async def signin(request: web.Request) -> web.Response:
    token = request.app[settings_key].admin_token or ""
    form = await request.post()
    presented, target = form.get("token"), _next_path(form.get("next"))
    if not isinstance(presented, str) or not hmac.compare_digest(presented.encode(), token.encode()):
        return _html(pages.signin_page(target, "That is not the admin token."), status=401)
    response = _see_other(target)
    response.set_cookie(cookie.NAME, cookie.issue(token, time.time()), max_age=cookie.LIFETIME, path="/ui",
                        httponly=True, samesite="Strict", secure=request.secure)
    return response


async def signout(request: web.Request) -> web.Response:
    response = _see_other("/ui/signin")
    response.del_cookie(cookie.NAME, path="/ui")
    return response


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC_TYPES:
        raise web.HTTPNotFound()
    return web.Response(body=static_file(name), content_type=STATIC_TYPES[name], headers={"Cache-Control": "no-cache"})


async def unknown(request: web.Request) -> web.Response:
    return _html(pages.message_page("Not found", "There is no such page in the inspector."), status=404)


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
    rows = [pages.SessionRow(info, await _latest_view(store, info),
                             compactions.totals(SessionKey(info.tenant, info.session)))
            for info in infos[:MAX_SESSIONS]]
    window, threshold = _window(request)
    return _html(pages.sessions_page(rows, total=len(infos), window=window, threshold=threshold,
                                     model=request.query.get("model", "")))


def _missing(key: SessionKey) -> web.Response:
    return _html(pages.message_page("No such session", f"No session {key.session!r} under tenant {key.tenant!r}."),
                 status=404)


def _int(value: str | None, default: int) -> int:
    return int(value) if value is not None and value.isdigit() else default


async def session(request: web.Request) -> web.Response:
    app, key = request.app, _key(request)
    store = app[store_key]
    window, threshold = _window(request)
    events = app[compactions_key].events(key)
    async with app[timelines_key].fold(store, key) as t:
        if t.next_seq == 0:
            return _missing(key)
        count = math.ceil(t.next_seq / LOG_PAGE)
        page = min(_int(request.query.get("page"), count - 1), count - 1)
        facts = await store.read(key, after=page * LOG_PAGE - 1, limit=LOG_PAGE)
        return _html(pages.session_page(key, t, events, facts, page=page, pages=count, links=_links(request, key),
                                        window=window, threshold=threshold))


async def live(request: web.Request) -> web.Response:
    """What changed since entry ``since``: the summary and the timeline again, and the new entries for the log."""
    app, key = request.app, _key(request)
    store, links = app[store_key], _links(request, key)
    since = _int(request.query.get("since"), 0)
    window, threshold = _window(request)
    events = app[compactions_key].events(key)
    async with app[timelines_key].fold(store, key) as t:
        body: dict[str, object] = {"since": t.next_seq}
        if t.next_seq > since:
            body["summary"] = pages.summary_html(key, t, events, window, threshold)
            body["timeline"] = pages.timeline_html(t, events, links, window, threshold)
            if request.query.get("tail") == "1":
                facts = await store.read(key, after=since - 1, limit=LOG_PAGE)
                if len(facts) < LOG_PAGE:
                    body["log"] = pages.log_items(facts, t, links)
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
    app, key, seq = request.app, _key(request), int(request.match_info["seq"])
    store, engine, links = app[store_key], app[engine_key], _links(request, key)
    async with app[timelines_key].fold(store, key) as t:
        point = _point(t.points, seq)
        checkpoint = t.checkpoints.get(point.view_key) if point is not None else None
    if point is None:
        return _html(pages.message_page("Not a request", f"Entry #{seq} is not an upstream reply."), status=404)
    found = await rebuild(store, key, point, checkpoint, engine.projection)
    section = request_html(found, engine.counter, entry=links.entry)
    if request.query.get("fragment") == "1":
        return _html(section)
    return _html(pages.request_page(key, seq, section, links))


async def entry(request: web.Request) -> web.Response:
    app, key, seq = request.app, _key(request), int(request.match_info["seq"])
    facts = await app[store_key].read(key, after=seq - 1, limit=1)
    if not facts or facts[0].seq != seq:
        return _html(pages.message_page("No such entry", f"Session {key.session!r} has no entry #{seq}."), status=404)
    return _html(pages.entry_page(key, facts[0], _links(request, key)))
