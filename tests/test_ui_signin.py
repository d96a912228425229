"""The inspector's sign-in hardened: the Origin check and the CSRF token on every POST under /ui, sign-out that
revokes, and the delay after a wrong token (shared with the admin API)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.throttle import FREE
from proxy.ui import cookie, csrf
from tests.test_admin import forgive
from tests.test_ui import TOKEN, form_token, page, post_signin, sign_in, sign_out, ui_proxy

ELSEWHERE = [{"Origin": "http://127.0.0.1:9999"}, {"Origin": "null"}, {"Origin": "http://evil.example"},
             {"Sec-Fetch-Site": "same-site"}, {"Sec-Fetch-Site": "cross-site"}]
ELSEWHERE_IDS = ["other-port", "opaque", "other-host", "same-site", "cross-site"]


async def signed_in(proxy: Any) -> bool:
    return bool((await proxy.get("/ui", allow_redirects=False)).status == 200)


@pytest.mark.parametrize("headers", ELSEWHERE, ids=ELSEWHERE_IDS)
async def test_a_sign_in_posted_from_another_origin_is_refused(make_proxy, headers: dict[str, str]) -> None:
    proxy = await ui_proxy(make_proxy)
    resp = await post_signin(proxy, **headers)
    assert resp.status == 403 and cookie.NAME not in resp.cookies
    assert "Cross-origin form posts are refused." in await resp.text()
    assert not await signed_in(proxy)


@pytest.mark.parametrize("headers", ELSEWHERE, ids=ELSEWHERE_IDS)
async def test_a_sign_out_posted_from_another_origin_is_refused(make_proxy, headers: dict[str, str]) -> None:
    proxy = await ui_proxy(make_proxy)
    await sign_in(proxy)
    token = form_token(await page(proxy, "/ui"))
    resp = await proxy.post("/ui/signout", data={"csrf_token": token}, headers=headers, allow_redirects=False)
    assert resp.status == 403 and cookie.NAME not in resp.cookies
    assert await signed_in(proxy)


async def test_the_pages_own_origin_passes(make_proxy) -> None:
    proxy = await ui_proxy(make_proxy)
    origin = str(proxy.make_url("")).rstrip("/")
    resp = await post_signin(proxy, **{"Origin": origin, "Sec-Fetch-Site": "same-origin"})
    assert resp.status == 303 and await signed_in(proxy)


async def test_a_post_without_the_forms_token_is_refused(make_proxy) -> None:
    proxy = await ui_proxy(make_proxy)
    await page(proxy, "/ui/signin")  # the PRESIGN cookie, but a form not from the page
    resp = await proxy.post("/ui/signin", data={"token": TOKEN, "next": "/ui"}, allow_redirects=False)
    assert resp.status == 403 and "reload the page" in await resp.text()
    forged = csrf.token(TOKEN, "a-presign-value-the-attacker-chose")
    resp = await proxy.post("/ui/signin", data={"token": TOKEN, "next": "/ui", "csrf_token": forged},
                            allow_redirects=False)
    assert resp.status == 403 and not await signed_in(proxy)

    await sign_in(proxy)
    for data in ({}, {"csrf_token": "x"}, {"csrf_token": form_token(await page(proxy, "/ui/signin"))}):
        resp = await proxy.post("/ui/signout", data=data, allow_redirects=False)
        assert resp.status == 403, data
    assert await signed_in(proxy)
    assert (await sign_out(proxy)).status == 303 and not await signed_in(proxy)


def test_the_token_is_bound_to_its_cookie_and_the_admin_token() -> None:
    mine = csrf.token(TOKEN, "cookie-a")
    assert mine == csrf.token(TOKEN, "cookie-a")
    assert len({mine, csrf.token(TOKEN, "cookie-b"), csrf.token("other-admin-token", "cookie-a")}) == 3
    ok = {"admin_token": TOKEN, "origin": None, "fetch_site": None, "host": "h:1"}
    assert csrf.check(binding="cookie-a", presented=mine, **ok) is None
    assert csrf.check(binding="cookie-b", presented=mine, **ok) is not None
    assert csrf.check(binding=None, presented=mine, **ok) is not None
    assert csrf.check(binding="cookie-a", presented=["list"], **ok) is not None
    assert csrf.check(binding="cookie-a", presented="\udcff", **ok) is not None
    assert csrf.field('a"b') == '<input type="hidden" name="csrf_token" value="a&quot;b">'


@pytest.mark.parametrize(("origin", "fetch_site", "expected"), [
    ("http://h:1", None, True), ("HTTPS://H:1", "same-origin", True), (None, "none", True), (None, None, True),
    ("http://h:2", None, False), ("http://h", None, False), ("http://[::1", None, False),
    ("null", None, False), ("null", "same-origin", True), ("null", "cross-site", False),
    ("http://h:1", "same-site", False), (None, "cross-site", False),
])
def test_same_origin(origin: str | None, fetch_site: str | None, expected: bool) -> None:
    assert csrf.same_origin(origin, fetch_site, "h:1") is expected


async def test_signing_out_revokes_a_copied_cookie_on_every_process_and_after_a_restart(make_proxy) -> None:
    proxy, other = await ui_proxy(make_proxy), await ui_proxy(make_proxy)  # two workers (or a restart) on one store
    copied = (await sign_in(proxy)).cookies[cookie.NAME].value
    held = {"Cookie": f"{cookie.NAME}={copied}"}
    assert (await other.get("/ui", headers=held, allow_redirects=False)).status == 200
    assert (await sign_out(proxy)).status == 303
    for client in (proxy, other, await ui_proxy(make_proxy)):
        resp = await client.get("/ui", headers=held, allow_redirects=False)
        assert resp.status == 303 and resp.headers["Location"] == "/ui/signin?next=%2Fui"
    await sign_in(other)  # a new sign-in is of the new epoch
    assert await signed_in(other)


async def test_after_a_few_wrong_tokens_the_next_is_not_even_checked_for_a_while(make_proxy) -> None:
    proxy = await ui_proxy(make_proxy)
    for n in range(FREE + 1):  # a few mistakes cost nothing; the one past them starts the delay
        assert (await post_signin(proxy, f"guess-{n}")).status == 401
    for token in ("guess-again", TOKEN):  # from this address the right token is refused too, uncompared
        resp = await post_signin(proxy, token)
        assert resp.status == 429 and resp.headers["Retry-After"] == "1" and cookie.NAME not in resp.cookies
        assert "Too many wrong admin tokens from this address" in await resp.text()
    admin = await proxy.get("/admin/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
    assert (admin.status, admin.headers["Retry-After"]) == (429, "1")
    assert (await admin.json())["error"]["type"] == "rate_limit_error"
    forgive(proxy)  # as when the delay has run out (its growth is tested in test_throttle.py)
    assert (await post_signin(proxy)).status == 303


async def test_wrong_admin_api_tokens_delay_the_sign_in_too(make_proxy) -> None:
    proxy = await ui_proxy(make_proxy)
    for n in range(FREE + 1):
        assert (await proxy.get("/admin/sessions", headers={"Authorization": f"Bearer guess-{n}"})).status == 401
    assert (await proxy.get("/admin/sessions")).status == 401  # no token: no guess, and not refused for waiting
    assert (await post_signin(proxy)).status == 429
    assert (await proxy.get("/admin/sessions", headers={"Authorization": f"Bearer {TOKEN}"})).status == 429


@pytest.mark.parametrize(("content_type", "body"), [
    ("multipart/form-data", b"xx"), ("multipart/form-data; boundary=zz", b"--zz\r\nbad\r\n"),
    ("application/x-www-form-urlencoded", b"%ff%fe=\xff"), ("application/x-www-form-urlencoded; charset=bogus", b"a=b"),
], ids=["no-boundary", "broken-part", "not-utf8", "unknown-charset"])
async def test_a_form_that_cannot_be_read_is_a_400(make_proxy, content_type: str, body: bytes) -> None:
    proxy = await ui_proxy(make_proxy)
    for signed in (False, True):
        if signed:
            await sign_in(proxy)
        path = "/ui/signout" if signed else "/ui/signin"
        resp = await proxy.post(path, data=body, headers={"Content-Type": content_type}, allow_redirects=False)
        assert resp.status == 400, (path, await resp.text())
        assert (await resp.json())["error"]["code"] == "invalid_body"
    assert await signed_in(proxy)
