"""The inspector in a real browser: Debian's headless Chromium driven by Selenium, against the proxy in this process.

Selenium's calls block, and the proxy under test runs on this test's event
loop, so every browser call goes through ``Browser.run`` (a worker thread).
The browser and its driver are the system's (``/usr/bin/chromium``,
``/usr/bin/chromedriver``, installed by ``.ci/run``); naming the driver's path
keeps Selenium Manager from looking for, or downloading, anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.settings import Secret
from proxy.store.base import SessionKey
from proxy.ui import timeline
from tests.fakeresponses import FakeResponses
from tests.fakescript import Script
from tests.proxyfixtures import read_log
from tests.scripted import KEY as SCRIPTED_KEY
from tests.scripted import Codex, rig
from tests.test_admin import forgive
from tests.test_demo import serving_demo
from tests.test_ui import POISON, TENANT, TOKEN, agent_session, long_log, session_path, step, ui_proxy
from tests.test_undo import but_compacting_costs, view_of_ui

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: Seconds a wait for the page may take: a poll of the live page is every 2 s.
WAIT = 20

T = TypeVar("T")


class Browser:
    def __init__(self, driver: WebDriver) -> None:
        self.driver = driver

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(call, *args)

    async def open(self, url: str) -> None:
        await self.run(self.driver.get, url)

    async def script(self, source: str, *args: Any) -> Any:
        return await self.run(self.driver.execute_script, source, *args)

    async def count(self, selector: str) -> int:
        return int(await self.script("return document.querySelectorAll(arguments[0]).length", selector))

    async def text(self, selector: str) -> str:
        return str(await self.script("return document.querySelector(arguments[0]).textContent", selector))

    async def until(self, condition: Callable[[WebDriver], Any]) -> Any:
        return await self.run(WebDriverWait(self.driver, WAIT).until, condition)

    async def sign_in(self, base: str, token: str) -> None:
        await self.open(base + "/ui")

        def typed(driver: WebDriver) -> bool:
            """Type the token once the form is the page's own (the browser may still be replacing the document)."""
            try:
                field = driver.find_element(By.ID, "token")
                field.clear()
                field.send_keys(token)
            except WebDriverException:  # a node of the page being replaced: look again
                return False
            return True

        await self.until(typed)
        await self.submit("form.signin button")

    async def find(self, by: str, value: str) -> Any:
        return await self.run(self.driver.find_element, by, value)

    async def submit(self, selector: str) -> None:
        """Click a form's button and wait for the page it leads to."""
        button = await self.find(By.CSS_SELECTOR, selector)
        await self.run(button.click)

        def left(_: WebDriver) -> bool:
            try:
                button.is_enabled()
            except WebDriverException:  # stale, or mid-navigation Chromium's "Node ... does not belong to the document"
                return True
            return False

        await self.until(left)


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture
def browser(driver: WebDriver) -> Browser:
    """The module's browser with no cookies (each test's proxy has its own port, but cookies ignore ports)."""
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.get_log("browser")  # drop what earlier tests logged
    return Browser(driver)


@pytest.fixture(params=["sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """One store is enough here: the stores' part is tested over HTTP in test_ui.py."""
    return f"sqlite:///{tmp_path}/facts.db"


def base_url(proxy: Any) -> str:
    return str(proxy.make_url("")).rstrip("/")


async def test_the_inspector_needs_the_admin_token(make_proxy, browser: Browser) -> None:
    proxy = await ui_proxy(make_proxy)
    base = base_url(proxy)
    await browser.open(base + "/ui")
    assert browser.driver.current_url == base + "/ui/signin?next=%2Fui"
    assert await browser.count("table.sessions") == 0
    await browser.sign_in(base, "not-the-token")
    assert "That is not the admin token." in await browser.text("form.signin")
    forgive(proxy)
    await browser.sign_in(base, TOKEN)
    assert browser.driver.current_url == base + "/ui"
    assert "No sessions yet." in await browser.text("main")
    assert await browser.script("return document.cookie") == ""  # HttpOnly: no script can read it
    await browser.submit("form.signout button")
    await browser.open(base + "/ui")
    assert browser.driver.current_url == base + "/ui/signin?next=%2Fui"


async def test_a_session_page_plots_each_request_and_opens_what_the_model_saw(make_proxy, fake,
                                                                              browser: Browser) -> None:
    # Honest usage: in 4,000 masking alone carries 8 rounds and no summary is made; in 3,000 two masking checkpoints
    # come before a summary, which the last request's view carries.
    proxy = await ui_proxy(make_proxy, context_window=3000, min_retain_rounds=2)
    await agent_session(proxy, fake, "run", 8, poison_round=6)
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "run"))
    replies = [f for f in facts if f.kind == "message" and f.source == "upstream"]
    checkpoints = [f for f in facts if f.kind == "checkpoint"]
    assert len(checkpoints) >= 2
    base = base_url(proxy)
    await browser.sign_in(base, TOKEN)
    await browser.open(base + session_path("run"))

    assert await browser.count("svg.timeline a.point") == len(replies) == 16
    assert await browser.count("svg.timeline g.mark.outcome-ok") == len(checkpoints)
    assert await browser.count("svg.timeline line.window") == await browser.count("svg.timeline line.trigger") == 1

    # The poisoned tool output is text on the page, and none of it ran.
    outputs = await browser.script(
        "return Array.from(document.querySelectorAll('#log li.source-client .result')).map(n => n.textContent)")
    assert sum(POISON in text for text in outputs) == 1
    assert await browser.script("return window.__pwned === undefined && document.querySelectorAll("
                                "'main script, main img').length === 0")

    last = await browser.find(By.CSS_SELECTOR, "svg.timeline a.point:last-of-type")
    await browser.run(last.click)
    await browser.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#request-panel section.request"))
    assert await browser.script("return document.querySelector('#request-panel section').dataset.seq") == str(
        replies[-1].seq)
    assert await browser.count("#request-panel ol.view li.vm.summary") == 1
    assert "summary · stands in for messages 1–" in await browser.text(  # noqa: RUF001
        "#request-panel ol.view li.vm.summary .badge")
    assert await browser.count("#request-panel ol.history li.hm.elided.run") == 1
    assert await browser.count("svg.timeline a.point.selected") == 1
    assert await browser.script("return window.__pwned === undefined")

    logs = await browser.run(browser.driver.get_log, "browser")
    assert not [entry for entry in logs if "Content Security Policy" in entry["message"]], logs


async def test_the_session_page_follows_new_requests(make_proxy, fake, browser: Browser) -> None:
    proxy = await ui_proxy(make_proxy)
    messages = await agent_session(proxy, fake, "live", 1)
    base = base_url(proxy)
    await browser.sign_in(base, TOKEN)
    await browser.open(base + session_path("live"))
    assert await browser.count("svg.timeline a.point") == 2
    entries = await browser.count("#log li.entry")

    messages.append({"role": "user", "content": "And one more thing."})
    await step(proxy, messages, "live")
    await browser.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "svg.timeline a.point")) == 3)
    assert await browser.count("#log li.entry") == entries + 2
    assert "And one more thing." in await browser.text("#log li.entry:nth-last-child(2)")


async def test_a_long_log_fills_in_without_the_viewer_doing_anything(make_proxy, browser: Browser,
                                                                     monkeypatch) -> None:
    """Each look reads a stretch of the log (500 entries here); the page asks for the next at once until whole."""
    monkeypatch.setattr(timeline, "FOLD_SECONDS", 0.0)
    proxy = await ui_proxy(make_proxy)
    await long_log(proxy, "long", 1_700)
    base = base_url(proxy)
    await browser.sign_in(base, TOKEN)
    await browser.open(base + session_path("long"))

    def whole(driver: WebDriver) -> bool:
        """The summary names every entry; the page reloads itself while reading, so a node may go stale."""
        try:
            return "1,700 entries" in driver.find_element(By.ID, "summary").text
        except WebDriverException:  # the node of a page being replaced: look again
            return False

    await browser.until(whole)
    assert "Read so far" not in await browser.text("#summary")
    assert await browser.script("return document.querySelector('svg.timeline').dataset.requests") == "850"
    assert await browser.script("return document.querySelector('main').dataset.reading") == "0"


async def test_the_sessions_table_sorts_and_filters(make_proxy, fake, browser: Browser) -> None:
    proxy = await ui_proxy(make_proxy)
    for name, rounds in (("alpha-run", 1), ("beta-run", 3)):
        await agent_session(proxy, fake, name, rounds)
    base = base_url(proxy)
    await browser.sign_in(base, TOKEN)
    names = "return Array.from(document.querySelectorAll('table.sessions tbody tr')).filter(r => !r.hidden)" \
            ".map(r => r.cells[1].textContent)"
    assert await browser.script(names) == ["beta-run", "alpha-run"]  # most recently active first
    header = await browser.find(By.XPATH, "//th[button='entries']/button")
    await browser.run(header.click)
    assert await browser.script(names) == ["alpha-run", "beta-run"]
    await browser.run(header.click)
    assert await browser.script(names) == ["beta-run", "alpha-run"]
    await browser.run((await browser.find(By.ID, "filter")).send_keys, "ALPHA")
    assert await browser.script(names) == ["alpha-run"]


async def test_the_undo_button_retires_a_compaction_behind_the_sign_in_and_the_form_token(make_proxy, fake,
                                                                                          browser: Browser) -> None:
    proxy = await ui_proxy(make_proxy, min_retain_rounds=1)
    messages = await agent_session(proxy, fake, "undo", 3)
    whole = await view_of_ui(proxy, "undo")
    admin = {"Authorization": f"Bearer {TOKEN}"}
    assert (await (await proxy.post(f"/admin/sessions/{TENANT}/undo/compact", headers=admin)).json())[
        "outcome"] == "ok"
    key = SessionKey(TENANT, "undo")
    seq = (await read_log(proxy.app[store_key], key))[-1].seq
    base = base_url(proxy)
    await browser.open(base + session_path("undo"))
    assert "/ui/signin" in browser.driver.current_url and await browser.count("form.undo") == 0
    await browser.sign_in(base, TOKEN)
    await browser.open(base + session_path("undo"))
    assert await browser.count("svg.timeline g.mark.outcome-ok") == 1
    assert await browser.count(f"#e{seq} form.undo button") == 1

    # A form whose token is not the page's (what another origin would have to forge) is refused.
    await browser.script("document.querySelector('form.undo input[name=csrf_token]').value = 'forged'")
    await browser.submit(f"#e{seq} form.undo button")
    assert "The form is out of date or not from this inspector" in await browser.text("main")
    assert (await read_log(proxy.app[store_key], key))[-1].seq == seq

    await browser.open(base + session_path("undo"))
    await browser.submit(f"#e{seq} form.undo button")
    assert browser.driver.current_url == f"{base}{session_path('undo')}#e{seq + 1}"
    assert "undone by entry" in await browser.text(f"#e{seq}.retired .badge.retired")
    assert await browser.count("form.undo") == 0
    assert await browser.count("svg.timeline g.mark.outcome-retired") == 1
    assert f"the compaction at entry #{seq} is retired" in await browser.text(f"#e{seq + 1}")
    assert but_compacting_costs(await view_of_ui(proxy, "undo")) == but_compacting_costs(whole)

    messages.append({"role": "user", "content": "Where were we?"})
    await step(proxy, messages, "undo")
    assert fake.requests[-1]["messages"] == [*whole["messages"], {"role": "user", "content": "Where were we?"}]
    logs = await browser.run(browser.driver.get_log, "browser")
    assert not [entry for entry in logs if "Content Security Policy" in entry["message"]], logs


async def test_a_page_on_another_port_cannot_sign_you_out(make_proxy, browser: Browser, aiohttp_server) -> None:
    """The attack SameSite lets through (a site ignores ports): a form on another port posting to the inspector."""
    proxy = await ui_proxy(make_proxy)
    base = base_url(proxy)

    async def attacker(request: web.Request) -> web.Response:
        form = (f'<form class="evil" method="post" action="{base}/ui/signout">'
                '<input type="hidden" name="csrf_token" value="guessed"><button type="submit">Win</button></form>')
        return web.Response(text=f"<!doctype html><html><body>{form}</body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/", attacker)
    elsewhere = await aiohttp_server(app)
    await browser.sign_in(base, TOKEN)
    assert browser.driver.current_url == base + "/ui"
    await browser.open(str(elsewhere.make_url("/")))
    await browser.submit("form.evil button")
    assert "Cross-origin form posts are refused." in await browser.text("main")
    await browser.open(base + "/ui")
    assert browser.driver.current_url == base + "/ui", "still signed in"
    await browser.submit("form.signout button")  # the inspector's own form still works
    await browser.open(base + "/ui")
    assert browser.driver.current_url == base + "/ui/signin?next=%2Fui"


async def test_the_demos_link_opens_its_session_with_every_request_and_compaction_on_the_timeline(
        tmp_path: Path, browser: Browser) -> None:
    """``ctxproxy demo`` as a user meets it: the printed link, followed in the browser, is the session's page."""
    async with serving_demo(tmp_path) as (link, figures):
        await browser.open(link)
        path = f"/ui/sessions/{figures['tenant']}/{figures['session']}"
        assert browser.driver.current_url == link.split("/ui/")[0] + path
        await browser.until(lambda d: d.find_elements(By.CSS_SELECTOR, "svg.timeline a.point"))
        assert await browser.count("svg.timeline a.point") == figures["requests"] == 37
        compactions = figures["masking"] + figures["summaries"] + figures["model_free"]
        assert await browser.count("svg.timeline g.mark") == compactions
        await browser.open(link)  # spent: the sign-in form says so
        assert "used already or has expired" in await browser.text("form.signin")


#: What each tier's mark says on the timeline, and what the legend says of it.
TIERS = {"mask": ("outputs shortened", "old tool outputs shortened (no model call)"),
         "summary": ("summarised", "older messages summarised by the model"),
         "fallback": ("left out", "older messages left out: no summary could be made")}
#: Every mark's tooltip and label, and every text on the page.
WORDS = ("return [document.querySelector('main').innerText, ...Array.from(document.querySelectorAll("
         "'svg.timeline g.mark title, svg.timeline g.mark text')).map(n => n.textContent)]")


async def tier_colours(browser: Browser) -> dict[str, tuple[str, str]]:
    """Per tier on the page: its marks' line colour and its legend key's colour, as the browser draws them."""
    return dict(await browser.script(
        "const out = {}; for (const tier of ['mask', 'summary', 'fallback']) {"
        "  const line = document.querySelector(`svg.timeline g.mark.tier-${tier} line`);"
        "  const key = document.querySelector(`.legend .key.mark.tier-${tier}`);"
        "  if (line) out[tier] = [getComputedStyle(line).stroke, getComputedStyle(key).backgroundColor]; }"
        "return Object.entries(out)"))


async def test_each_compaction_tier_has_its_own_words_colour_and_legend(make_proxy, fake, browser: Browser) -> None:
    # In 4,000 with the last output kept whole, masking batches and a summary in 10 rounds (tests/test_ui.py); with
    # every summary failing and masking off, the model-free tier stands in.
    made = await ui_proxy(make_proxy, context_window=4000, min_retain_rounds=2, keep_tool_outputs=1)
    await agent_session(made, fake, "tiers", 10)
    failing = await ui_proxy(make_proxy, context_window=3000, min_retain_rounds=2, keep_tool_output_share=1.0)
    fake.summary_mode = "fail"
    await agent_session(failing, fake, "left", 6)
    colours: dict[str, tuple[str, str]] = {}
    await browser.sign_in(base_url(made), TOKEN)  # the cookie holds for both (one store, one token; ports aside)
    for proxy, session, tiers in ((made, "tiers", ("mask", "summary")), (failing, "left", ("fallback",))):
        await browser.open(base_url(proxy) + session_path(session))
        legend = await browser.text("#timeline .legend")
        assert all(words in legend for _, words in TIERS.values()), legend
        for tier in tiers:
            labels = await browser.script(f"return Array.from(document.querySelectorAll("
                                          f"'svg.timeline g.mark.tier-{tier} text')).map(n => n.textContent)")
            assert labels and all(label.startswith(TIERS[tier][0]) for label in labels), (tier, labels)
        words = await browser.script(WORDS)
        assert not [w for w in words if "–-" in w or "message 0 summarised" in w], words  # noqa: RUF001
        assert not [w for w in words if "model-free" in w], words
        colours.update(await tier_colours(browser))
    assert set(colours) == set(TIERS)
    assert all(line == key for line, key in colours.values()), colours  # each mark is its legend key's colour
    assert len({line for line, _ in colours.values()}) == 3, colours


async def test_a_codex_session_has_one_bar_per_upstream_request(aiohttp_server, aiohttp_client, tmp_path: Path,
                                                                 browser: Browser) -> None:
    """Codex's replies are a reasoning item and a message (or call) each, logged as two entries with one usage:
    one request, one bar. Its instructions are no message, so masking starts at message 0: no range "0 to -1"."""
    fake = FakeResponses(Script(steps=12))
    # In 12,000 masking batches alone carry the 13 steps (in 10,000 a background summary starts at the precompact
    # threshold, since batches now wait for the trigger: issue 34).
    proxy = await rig(aiohttp_server, aiohttp_client, tmp_path, fake, admin_token=Secret(TOKEN),
                      context_window=12000)
    codex = Codex(proxy, session="codex-ui", output=lambda command: command + "\n" + " ".join(
        f"line {i} of {command}" for i in range(200)))
    for _ in range(13):
        await codex.step()
    facts = await read_log(proxy.server.app[store_key], SessionKey(tenant_of(SCRIPTED_KEY), "codex-ui"))
    replies = [f for f in facts if f.kind == "message" and f.source == "upstream"]
    assert len(fake.requests) == 13 and len(replies) == 26, "two entries per reply"
    base = base_url(proxy)
    await browser.sign_in(base, TOKEN)
    await browser.open(base + f"/ui/sessions/{tenant_of(SCRIPTED_KEY)}/codex-ui")
    assert await browser.count("svg.timeline a.point") == len(fake.requests)
    assert "Upstream requests\n13" in await browser.script("return document.querySelector('#summary').innerText")
    masks = await browser.script("return Array.from(document.querySelectorAll('svg.timeline g.mark.tier-mask title'))"
                                 ".map(n => n.textContent)")
    assert masks and "tool outputs of messages 0–" in masks[0], masks  # noqa: RUF001
    words = await browser.script(WORDS)
    assert not [w for w in words if "–-" in w], words  # noqa: RUF001
    assert not [w for w in words[1:] if "summarised" in w], "a masking batch is no summary"


async def test_without_an_admin_token_the_inspector_says_how_to_turn_it_on(make_proxy, browser: Browser) -> None:
    proxy = await make_proxy()
    base = base_url(proxy)
    for path in ("/ui", "/ui/signin", session_path("s1")):
        await browser.open(base + path)
        assert await browser.text("h1") == "The inspector is off"
        text = await browser.text("main")
        assert "--admin-token" in text and "CTXPROXY_ADMIN_TOKEN" in text
        assert await browser.count("form") == 0
    logs = await browser.run(browser.driver.get_log, "browser")
    assert not [entry for entry in logs if "Content Security Policy" in entry["message"]], logs
