"""The session inspector over plain HTTP: access, the cookie, headers, escaping, figures, sizes, live updates."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
import time
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.keys import engine_key, store_key, timelines_key
from proxy.sessions import tenant_of
from proxy.settings import Secret
from proxy.store.base import NewFact, SessionKey
from proxy.ui import cookie, timeline
from proxy.ui.plot import short
from proxy.ui.request import rebuild
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import read_log
from tests.test_admin import forgive
from tests.test_compaction_e2e import prose
from tests.test_metrics import scrape, value

TOKEN = "ui-admin-token-0123456789"
KEY = "sk-tenant-ui"
TENANT = tenant_of(KEY)
POISON = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
ROOT = Path(__file__).resolve().parent.parent


async def ui_proxy(make_proxy: Any, **overrides: Any) -> Any:
    return await make_proxy(admin_token=Secret(TOKEN), **overrides)


def form_token(html: str) -> str:
    """The CSRF token in a page's forms."""
    found = re.search(r'<input type="hidden" name="csrf_token" value="([^"]+)">', html)
    assert found is not None, html
    return found[1]


async def post_signin(proxy: Any, token: str = TOKEN, next_path: str = "/ui", **headers: str) -> Any:
    """Sign in as the form does: its page first (the token's ``PRESIGN`` cookie), then the POST."""
    csrf_token = form_token(await page(proxy, "/ui/signin"))
    return await proxy.post("/ui/signin", data={"token": token, "next": next_path, "csrf_token": csrf_token},
                            headers=headers, allow_redirects=False)


async def sign_in(proxy: Any, next_path: str = "/ui", token: str = TOKEN) -> Any:
    resp = await post_signin(proxy, token, next_path)
    assert resp.status == 303, await resp.text()
    return resp


async def sign_out(proxy: Any) -> Any:
    csrf_token = form_token(await page(proxy, "/ui"))
    return await proxy.post("/ui/signout", data={"csrf_token": csrf_token}, allow_redirects=False)


async def step(proxy: Any, messages: list[dict[str, Any]], session: str, model: str = "gpt-4o") -> dict[str, Any]:
    body = {"model": model, "messages": messages, "tools": TOOLS}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={"Authorization": f"Bearer {KEY}", "X-Session-Id": session})
    assert resp.status == 200, await resp.text()
    message: dict[str, Any] = (await resp.json())["choices"][0]["message"]
    return message


async def agent_session(proxy: Any, fake: FakeUpstream, session: str, rounds: int,
                        poison_round: int | None = None, model: str = "gpt-4o") -> list[dict[str, Any]]:
    """An agent's run: per round a user message, a tool call, its (long) output, an answer: two requests."""
    rng = random.Random(5)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for n in range(rounds):
        messages.append({"role": "user", "content": f"Round {n}: " + prose(rng, 120)})
        fake.script.append(Reply(tool_calls=[{"id": f"call_{n}", "type": "function",
                                              "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]))
        messages.append(await step(proxy, messages, session, model))
        output = (f"{POISON}\n" if n == poison_round else "") + prose(rng, 300)
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": output})
        fake.script.append(Reply(content=prose(rng, 60)))
        messages.append(await step(proxy, messages, session, model))
    return messages


def session_path(session: str) -> str:
    return f"/ui/sessions/{TENANT}/{session}"


async def page(proxy: Any, path: str) -> str:
    resp = await proxy.get(path, allow_redirects=False)
    assert resp.status == 200, (path, resp.status)
    return str(await resp.text())


PATHS = [("GET", "/ui"), ("GET", "/ui/"), ("GET", "/ui/signin"), ("POST", "/ui/signin"), ("POST", "/ui/signout"),
         ("GET", "/ui/static/ui.js"), ("GET", session_path("s1")), ("GET", session_path("s1") + "/live"),
         ("GET", session_path("s1") + "/requests/1"), ("GET", session_path("s1") + "/entries/0"),
         ("POST", session_path("s1") + "/uncompact"), ("GET", "/ui/no-such-page")]


async def test_every_ui_path_is_404_without_an_admin_token_and_a_page_says_how_to_turn_it_on(proxy) -> None:
    for method, path in PATHS:
        resp = await proxy.request(method, path, data={"token": ""}, allow_redirects=False)
        assert resp.status == 404, (method, path)
        if method == "GET" and not path.endswith("/live") and not path.startswith("/ui/static/"):
            assert resp.headers["Content-Type"].startswith("text/html") and resp.headers["Content-Security-Policy"]
            html = await resp.text()
            assert "The inspector is off" in html and "--admin-token" in html and "CTXPROXY_ADMIN_TOKEN" in html
            assert "signin" not in html and "csrf_token" not in html, "no sign-in form while there is no token"
        else:
            assert (await resp.json())["error"]["type"] == "not_found_error"


async def test_pages_send_you_to_sign_in_and_data_needs_the_cookie(make_proxy) -> None:
    proxy = await ui_proxy(make_proxy)
    for path in ("/ui", session_path("s1") + "?page=2", "/ui/no-such-page"):
        resp = await proxy.get(path, allow_redirects=False)
        assert resp.status == 303
        assert resp.headers["Location"] == "/ui/signin?next=" + path.replace("/", "%2F").replace("?", "%3F").replace(
            "=", "%3D")
    resp = await proxy.get(session_path("s1") + "/live")
    assert resp.status == 401 and (await resp.json())["error"]["type"] == "authentication_error"
    resp = await proxy.post("/ui/signout", allow_redirects=False)
    assert resp.status == 401 and cookie.NAME not in resp.cookies
    form = await page(proxy, "/ui/signin?next=%2Fui%2Fsessions")
    assert '<input type="hidden" name="next" value="/ui/sessions">' in form
    assert 'name="token"' in form and 'method="post"' in form
    _, samples = await scrape(proxy)
    assert [value(samples, "ctxproxy_requests_total", route="ui", status=s) for s in ("303", "401", "200")] == [
        3, 2, 1]


@pytest.mark.parametrize("value", [
    "", "garbage", cookie.issue("another-token", time.time(), 0),
    cookie.issue(TOKEN, time.time() - cookie.LIFETIME - 1, 0), cookie.issue(TOKEN, time.time(), 0)[:-2] + "AA", TOKEN,
    cookie.issue(TOKEN, time.time(), 1),
], ids=["empty", "garbage", "other-token", "expired", "tampered", "the-token-itself", "another-epoch"])
async def test_a_cookie_not_signed_with_the_admin_token_or_expired_is_refused(make_proxy, value: str) -> None:
    proxy = await ui_proxy(make_proxy)
    resp = await proxy.get("/ui", headers={"Cookie": f"{cookie.NAME}={value}"}, allow_redirects=False)
    assert resp.status == 303 and resp.headers["Location"].startswith("/ui/signin")
    good = cookie.issue(TOKEN, time.time(), 0)
    resp = await proxy.get("/ui", headers={"Cookie": f"{cookie.NAME}={good}"}, allow_redirects=False)
    assert resp.status == 200


async def test_sign_in_sets_a_strict_http_only_cookie_that_is_not_the_token(make_proxy) -> None:
    proxy = await ui_proxy(make_proxy)
    resp = await post_signin(proxy, "wrong")
    assert resp.status == 401 and cookie.NAME not in resp.cookies
    assert "That is not the admin token." in await resp.text()
    forgive(proxy)
    resp = await post_signin(proxy, next_path=f"{session_path('s1')}?page=0")
    assert resp.status == 303 and resp.headers["Location"] == f"{session_path('s1')}?page=0"
    [header] = resp.headers.getall("Set-Cookie")
    morsel = SimpleCookie(header)[cookie.NAME]
    assert (morsel["httponly"], morsel["samesite"], morsel["path"], morsel["max-age"], morsel["secure"]) == (
        True, "Strict", "/ui", str(cookie.LIFETIME), "")
    assert TOKEN not in header and TOKEN not in resp.headers["Location"]
    assert cookie.valid(morsel.value, TOKEN, time.time(), 0)
    assert (await proxy.get("/ui", allow_redirects=False)).status == 200  # the client's jar sends it back

    resp = await sign_out(proxy)
    assert resp.status == 303 and resp.headers["Location"] == "/ui/signin"
    gone = SimpleCookie(resp.headers["Set-Cookie"])[cookie.NAME]
    assert (gone.value, gone["max-age"], gone["path"]) == ("", "0", "/ui")
    assert (await proxy.get("/ui", allow_redirects=False)).status == 303


@pytest.mark.parametrize(("target", "expected"), [
    ("https://evil.example/ui", "/ui"), ("//evil.example/ui", "/ui"), ("/ui\\@evil.example", "/ui"),
    ("/admin/sessions", "/ui"), ("/ui/sessions/a/b?page=1", "/ui/sessions/a/b?page=1"),
])
async def test_after_sign_in_only_inspector_paths_on_this_origin(make_proxy, target: str, expected: str) -> None:
    proxy = await ui_proxy(make_proxy)
    resp = await post_signin(proxy, next_path=target)
    assert resp.headers["Location"] == expected


async def test_every_ui_response_carries_the_security_headers(make_proxy, fake) -> None:
    proxy = await ui_proxy(make_proxy)
    unsigned = [await proxy.get("/ui/signin"), await proxy.get("/ui", allow_redirects=False),
                await proxy.get("/ui/static/ui.css")]
    await sign_in(proxy)
    await agent_session(proxy, fake, "s1", 1)
    signed = [await proxy.get(path) for path in ("/ui", session_path("s1"), session_path("s1") + "/requests/2",
                                                  session_path("s1") + "/entries/0", session_path("s1") + "/live",
                                                  session_path("nobody"))]
    for resp in unsigned + signed:
        assert resp.headers["Content-Security-Policy"] == CSP, resp.url
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["X-Frame-Options"] == "DENY"
    assert [r.status for r in signed] == [200, 200, 200, 200, 200, 404]
    for resp in [unsigned[0], *signed[:4]]:
        html = await resp.text()
        assert "<script>" not in html and " style=" not in html and " on" not in re.sub(r"<pre>.*?</pre>", "", html)
        assert '<script src="/ui/static/ui.js" defer></script>' in html


async def test_static_files_are_served_with_their_types(make_proxy) -> None:
    proxy = await ui_proxy(make_proxy)
    css, js = await proxy.get("/ui/static/ui.css"), await proxy.get("/ui/static/ui.js")
    assert (css.status, css.content_type, js.status, js.content_type) == (200, "text/css", 200, "text/javascript")
    assert (ROOT / "proxy/ui/static/ui.js").read_bytes() == await js.read()
    for name in ("page.html", "..%2Ftemplates%2Fpage.html", "ui.css.map", "__init__.py"):
        resp = await proxy.get(f"/ui/static/{name}", allow_redirects=False)
        assert resp.status == 404, name
        assert "<html" not in await resp.text()


def test_the_package_build_ships_the_templates_and_static_files(tmp_path: Path) -> None:
    """What ``pip install .`` copies, by setuptools' own build step on a copy of the tree (no network)."""
    for name in ("proxy", "pyproject.toml", "README.md"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, tmp_path / name)
    subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py",
                    "--build-lib", str(tmp_path / "out")], cwd=tmp_path, check=True, capture_output=True)
    shipped = {p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out/proxy/ui").rglob("*.*")}
    assert {"proxy/ui/templates/page.html", "proxy/ui/templates/signin.html", "proxy/ui/static/ui.css",
            "proxy/ui/static/ui.js"} <= shipped


async def test_the_log_is_escaped_everywhere(make_proxy, fake) -> None:
    proxy = await ui_proxy(make_proxy)
    await sign_in(proxy)
    await agent_session(proxy, fake, "s1", 2, poison_round=1)
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "s1"))
    poisoned = next(f.seq for f in facts if f.message and POISON in str(f.message.get("content")))
    last = next(f.seq for f in reversed(facts) if f.source == "upstream")
    escaped = "&lt;script&gt;window.__pwned = 1&lt;/script&gt;&lt;img src=x onerror=&quot;window.__pwned = 2&quot;&gt;"
    for path in (session_path("s1"), f"{session_path('s1')}/entries/{poisoned}",
                 f"{session_path('s1')}/requests/{last}", f"{session_path('s1')}/requests/{last}?fragment=1"):
        html = await page(proxy, path)
        assert escaped in html, path
        assert "<script>window" not in html and "<img src=x" not in html


async def test_one_point_per_upstream_request_and_one_mark_per_checkpoint(make_proxy, fake) -> None:
    proxy = await ui_proxy(make_proxy, context_window=4000, min_retain_rounds=2, keep_tool_outputs=1)
    await sign_in(proxy)
    await agent_session(proxy, fake, "s1", 10)
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "s1"))
    replies = [f for f in facts if f.kind == "message" and f.source == "upstream"]
    checkpoints = [f for f in facts if f.kind == "checkpoint"]
    assert len(replies) == 20 and len(checkpoints) >= 2
    html = await page(proxy, session_path("s1"))
    assert re.findall(r'<a class="point" href="[^"]+" data-seq="(\d+)">', html) == [str(f.seq) for f in replies]
    marks = re.findall(r'<g class="mark outcome-ok tier-(mask|summary)"><title>([^<]*)</title>.*?<text [^>]*>([^<]*)'
                       r"</text></g>", html)
    assert len(marks) == len(checkpoints)
    assert {tier for tier, _, _ in marks} == {"mask", "summary"}, "both tiers made checkpoints here"
    tiers = [tier for tier, _, _ in marks]
    assert (f"<dt>Compactions by tier</dt><dd>outputs shortened: {tiers.count('mask')}, summarised: "
            f"{tiers.count('summary')}, left out: 0</dd>") in html
    for tier, title, _ in marks:  # each tier in its own words, and no range that runs backwards
        assert re.search(r"tool outputs of messages? \d+(–\d+)? shortened" if tier == "mask"  # noqa: RUF001
                         else r": messages? \d+(–\d+)? summarised", title), title  # noqa: RUF001
    assert "–-" not in html and "message 0 summarised" not in html  # noqa: RUF001
    async with proxy.app[timelines_key].fold(proxy.app[store_key], SessionKey(TENANT, "s1")) as t:
        points, positions = list(t.points), [m.position for m in t.marks]
    for (_, _, label), at in zip(marks, positions, strict=True):  # a mark's figures are the bars beside it
        assert label.endswith(f" {short(points[at - 1].seen)}→{short(points[at].seen)}"), label
    assert f'data-requests="{len(replies)}" data-slots="{len(replies)}"' in html
    assert html.count("proactive compaction in ") == len(checkpoints)  # this process made them: trigger and time
    tool_outputs = [f for f in facts if f.message is not None and f.message.get("role") == "tool"]
    assert len(re.findall(r'<div class="result"><details class="long"><summary>tool output \(call_\d+\): [0-9,]+ '
                          r"characters, 1 lines", html)) == len(tool_outputs) == 10  # long outputs collapsed
    for n, reply in enumerate(replies):  # what the model saw is the upstream's own count
        assert f"request {n + 1} · entry #{reply.seq} · " in html
        assert f"model saw {reply.extra['usage']['prompt_tokens']:,} tokens" in html


async def test_a_rebuilt_request_is_exactly_what_went_upstream(make_proxy, fake) -> None:
    # Honest usage: in 4,000 masking alone keeps the view under the threshold for most of the run, and a masking
    # checkpoint has no summary to show; the summary path, in a window small enough for two summaries in 10 rounds.
    proxy = await ui_proxy(make_proxy, context_window=3000, min_retain_rounds=2, keep_tool_output_share=1.0)
    await sign_in(proxy)
    await agent_session(proxy, fake, "s1", 10)
    store, engine, key = proxy.app[store_key], proxy.app[engine_key], SessionKey(TENANT, "s1")
    async with proxy.app[timelines_key].fold(store, key) as t:
        points, checkpoints = list(t.points), dict(t.checkpoints)
    assert len(points) == len(fake.requests) == 20
    summarised = 0
    for point, sent in zip(points, fake.requests, strict=True):
        found = await rebuild(store, key, point, checkpoints.get(point.view_key), engine.projection)
        assert found.view == sent["messages"]
        assert found.matches()
        summarised += found.checkpoint is not None
        html = await page(proxy, f"{session_path('s1')}/requests/{point.seq}?fragment=1")
        assert html.startswith(f'<section class="request" id="request-view" data-seq="{point.seq}">')
        assert "differs from the logged one" not in html
        assert ('<li class="vm summary">' in html) == ('<li class="hm elided run">' in html) == (
            found.checkpoint is not None)
    assert summarised >= 4


async def test_failed_compactions_are_marked_from_this_process_record(make_proxy, fake) -> None:
    # Past the threshold, far under the hard limit: a failed summary is a failure (over it, the model-free tier
    # would stand in; tests/test_no_run_dies.py).
    proxy = await ui_proxy(make_proxy, context_window=20_000, compression_threshold=0.1, min_retain_rounds=2,
                           keep_tool_output_share=1.0)  # the summary path, not masking
    fake.summary_mode = "fail"
    await sign_in(proxy)
    await agent_session(proxy, fake, "s1", 6)
    html = await page(proxy, session_path("s1"))
    failed = html.count('<g class="mark outcome-failed">')
    assert failed >= 1 and '<g class="mark outcome-ok' not in html
    assert f"proactive failed: {failed}" in html
    table = await page(proxy, "/ui")
    assert f"proactive failed: {failed}" in table


async def test_the_model_free_tier_is_marked_on_the_timeline_and_in_the_log(make_proxy, fake) -> None:
    # Honest usage: masking alone would keep 6 rounds under the threshold of 4,000; the summary path (no masking)
    # in 3,000 reaches it in 6 rounds.
    proxy = await ui_proxy(make_proxy, context_window=3000, min_retain_rounds=2, keep_tool_output_share=1.0)
    fake.summary_mode = "fail"  # every view past the threshold is past the hard limit here: the tier stands in
    await sign_in(proxy)
    await agent_session(proxy, fake, "s1", 6)
    html = await page(proxy, session_path("s1"))
    assert '<g class="mark outcome-fallback tier-fallback">' in html
    assert re.search(r"messages \d+–\d+ left out: no summary could be made", html)  # noqa: RUF001
    assert '<span class="badge warn">no summary could be made: the oldest messages were left out</span>' in html
    assert "model-free" not in html, "the tier is named in words, not jargon"
    assert '<g class="mark outcome-failed">' not in html, "a fallback is no failed attempt on the timeline"


async def test_sessions_table_lists_every_tenant_with_its_latest_view(make_proxy, fake) -> None:
    proxy = await ui_proxy(make_proxy, context_window=8000)
    await sign_in(proxy)
    await agent_session(proxy, fake, "first", 1)
    await proxy.post("/v1/chat/completions", data=orjson.dumps({"model": "m", "messages": [
        {"role": "user", "content": "other"}]}), headers={"Authorization": "Bearer sk-other", "X-Session-Id": "b"})
    html = await page(proxy, "/ui")
    rows = re.findall(r"<tr><td>([^<]+)</td><td><a href=\"([^\"]+)\">([^<]+)</a></td>", html)
    assert sorted(rows) == sorted([(TENANT, session_path("first"), "first"),
                                   (tenant_of("sk-other"), f"/ui/sessions/{tenant_of('sk-other')}/b", "b")])
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "first"))
    prompt = facts[-1].extra["usage"]["prompt_tokens"]
    assert f'<meter min="0" max="8000" value="{prompt}"></meter> {prompt:,} / 8,000' in html
    assert "2 sessions." in html


async def test_live_answers_only_what_changed(make_proxy, fake) -> None:
    proxy = await ui_proxy(make_proxy)
    await sign_in(proxy)
    messages = await agent_session(proxy, fake, "s1", 1)
    html = await page(proxy, session_path("s1"))
    since = int(re.search(r'data-since="(\d+)"', html).group(1))  # type: ignore[union-attr]
    live = f"{session_path('s1')}/live?since={since}&tail=1"
    assert await (await proxy.get(live)).json() == {"since": since, "reading": False}
    messages.append({"role": "user", "content": "one more"})
    await step(proxy, messages, "s1")
    update = await (await proxy.get(live)).json()
    assert set(update) == {"since", "reading", "summary", "timeline", "log"} and update["since"] == since + 2
    assert re.findall(r'<li class="entry kind-message source-(\w+)" id="e(\d+)">', update["log"]) == [
        ("client", str(since)), ("upstream", str(since + 1))]
    assert update["timeline"].count('<a class="point"') == 3


async def test_a_ten_thousand_entry_session_page_stays_small(make_proxy) -> None:
    """Five thousand requests draw 385 slots; the log's last page holds 100 entries, each text clipped."""
    proxy = await ui_proxy(make_proxy)
    await sign_in(proxy)
    store, key = proxy.app[store_key], SessionKey(TENANT, "long")
    for start in range(0, 10_000, 500):
        batch = [NewFact(kind="message", index=i, source="upstream" if i % 2 else "client",
                         message={"role": "assistant" if i % 2 else "tool", "tool_call_id": "c",
                                  "content": f"{i} " + ("y" * 30_000 if i >= 9_900 else "x" * 300)},
                         hash=f"h{i}",
                         extra={"usage": {"prompt_tokens": i}, "view": {"key": "", "length": i}} if i % 2 else {})
                 for i in range(start, start + 500)]
        await store.append(key, start, batch, ts=1_800_000_000.0 + start)
    resp = await proxy.get(session_path("long"))
    html = await resp.read()
    assert len(html) < 500_000, len(html)
    assert b'data-requests="5000" data-slots="385"' in html  # 13 requests a slot
    assert html.count(b'<a class="point"') == 385
    assert html.count(b'<li class="entry ') == 100  # the last page of the log
    assert b'id="e9999"' in html and b'id="e9899"' not in html
    assert b"page 100 of 100" in html
    assert html.count("… 28,005 more characters.".encode()) == 100  # every 30,005-character text clipped to 2,000


async def long_log(proxy: Any, session: str, entries: int) -> SessionKey:
    """``entries`` log entries straight into the store: a user turn, then replies with usage, alternating."""
    store, key = proxy.app[store_key], SessionKey(TENANT, session)
    for start in range(0, entries, 500):
        batch = [NewFact(kind="message", index=i, source="upstream" if i % 2 else "client",
                         message={"role": "assistant" if i % 2 else "user", "content": f"entry {i}"}, hash=f"h{i}",
                         extra={"usage": {"prompt_tokens": i}, "view": {"key": "", "length": i}} if i % 2 else {})
                 for i in range(start, min(start + 500, entries))]
        await store.append(key, start, batch, ts=1_800_000_000.0 + start)
    return key


async def test_a_long_log_is_shown_as_far_as_read_and_the_page_asks_for_the_rest(make_proxy,
                                                                                  monkeypatch) -> None:
    """A look folds for at most ``FOLD_SECONDS`` (0 here: a page of 500 entries a look): the page says how far it
    read and that it is still reading (``data-reading``, which has the page poll again at once); each poll reads on,
    and says when the log is whole."""
    monkeypatch.setattr(timeline, "FOLD_SECONDS", 0.0)
    proxy = await ui_proxy(make_proxy)
    await sign_in(proxy)
    await long_log(proxy, "long", 1_200)
    html = await (await proxy.get(session_path("long"))).text()
    assert "the first 500 entries of the log" in html
    assert 'data-reading="1"' in html and 'data-since="500"' in html
    live = session_path("long") + "/live?since=500"
    assert orjson.loads(await (await proxy.get(live)).read())["reading"] is True  # 1,000 read
    update = orjson.loads(await (await proxy.get(session_path("long") + "/live?since=1000")).read())
    assert update["reading"] is False and update["since"] == 1_200
    assert "Read so far" not in update["summary"] and "1,200 entries" in update["summary"]
    html = await (await proxy.get(session_path("long"))).text()
    assert 'data-reading="0"' in html and "Read so far" not in html


async def test_a_masked_request_is_rebuilt_as_sent_with_its_masked_outputs_marked(make_proxy, fake) -> None:
    proxy = await ui_proxy(make_proxy, context_window=16_000)
    await sign_in(proxy)
    rng = random.Random(9)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    for n in range(16):
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": prose(rng, 500)}]
    fake.script.append(Reply(content="ok"))
    await step(proxy, messages, "m1")
    store, engine, key = proxy.app[store_key], proxy.app[engine_key], SessionKey(TENANT, "m1")
    async with proxy.app[timelines_key].fold(store, key) as t:
        point, checkpoints = t.points[-1], dict(t.checkpoints)
    found = await rebuild(store, key, point, checkpoints.get(point.view_key), engine.projection)
    assert found.view == fake.requests[-1]["messages"] and found.matches()
    masked = [m for m in found.view if str(m.get("content")).startswith("[output of read_file {} elided: ")]
    assert len(masked) >= 4
    html = await page(proxy, f"{session_path('m1')}/requests/{point.seq}?fragment=1")
    assert html.count('<li class="vm masked">') == len(masked)
    assert html.count("masked · a placeholder stands in for the output") == len(masked)
    assert '<li class="vm summary">' not in html, "masking alone: no summary item"


async def test_a_tool_output_clipped_to_fit_is_marked_in_the_request_it_went_out_in(make_proxy, fake) -> None:
    """The rebuilt view shows the output whole; the logged view names it clipped, and the page says so."""
    proxy = await ui_proxy(make_proxy, context_window=4000)
    await sign_in(proxy)
    rng = random.Random(8)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Read the log."}]
    fake.script.append(Reply(tool_calls=[{"id": "call_0", "type": "function",
                                          "function": {"name": "read_file", "arguments": '{"path": "build.log"}'}}]))
    messages.append(await step(proxy, messages, "clip"))
    messages.append({"role": "tool", "tool_call_id": "call_0", "content": prose(rng, 6_000)})  # over the window
    fake.script.append(Reply(content="The build failed."))
    messages.append(await step(proxy, messages, "clip"))
    assert "characters elided by ctxproxy" in fake.requests[-1]["messages"][3]["content"]
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "clip"))
    reply = facts[-1]
    assert reply.extra["view"]["clipped"] == [3]
    html = await page(proxy, f"{session_path('clip')}/requests/{reply.seq}")
    assert html.count('<li class="vm clipped">') == 1
    assert "clipped to fit the window when it went upstream" in html
    assert "differs from the logged one" not in html


async def test_a_rebuilt_view_that_differs_names_what_changed(make_proxy, fake) -> None:
    """Each reply's entry records the window and the view settings; a rebuild that differs names the one that
    changed (a window the upstream taught, a flag), or says the entry is too old to tell."""
    proxy = await ui_proxy(make_proxy, context_window=8000)
    await sign_in(proxy)
    await agent_session(proxy, fake, "live", 1)
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "live"))
    assert facts[-1].extra["view"]["window"] == 8000 and "learned_window" not in facts[-1].extra["view"]
    assert facts[-1].extra["view"]["settings"] == {"summary_placement": "user", "recall_tool": False}

    store, key = proxy.app[store_key], SessionKey(TENANT, "changed")
    views = [{"key": "", "length": 5, "last": "x", "window": 2048, "learned_window": True,
              "settings": {"summary_placement": "system", "recall_tool": False}},
             {"key": "", "length": 5, "last": "x"}]  # logged before entries recorded either
    for n, view in enumerate(views):
        await store.append(key, 2 * n, [
            NewFact("message", 2 * n, "client", {"role": "user", "content": f"q{n}"}, f"q{n}"),
            NewFact("message", 2 * n + 1, "upstream", {"role": "assistant", "content": f"a{n}"}, f"a{n}",
                    {"usage": {"prompt_tokens": 10}, "view": view})], ts=1_800_000_000.0 + n)
    first = await page(proxy, f"{session_path('changed')}/requests/1?fragment=1")
    assert "This rebuilt view differs from the logged one (length 5, rebuilt 1): it went out under a 2,048-token " \
           "window the upstream taught the proxy" in first
    assert "--summary-placement was &#x27;system&#x27; then and is &#x27;user&#x27; now" in first
    second = await page(proxy, f"{session_path('changed')}/requests/3?fragment=1")
    assert "logged before the proxy recorded the settings that shape a view" in second
