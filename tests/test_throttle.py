"""The delay after failed admin tokens: a free burst, then growing per address; a budget over all addresses that
the operator's own address is not held to; cleared by a success, bounded in memory. Then through the HTTP app, from
real source addresses (Linux routes all of 127.0.0.0/8 to loopback)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from proxy.app import create_app
from proxy.keys import throttle_key
from proxy.settings import Secret, Settings
from proxy.throttle import BASE, CAP, FORGET, FREE, GLOBAL_BURST, GLOBAL_RATE, FailureThrottle

TOKEN = "throttle-admin-token-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_failures_is_free_then_each_doubles_the_wait_up_to_the_cap_and_a_success_clears_it() -> None:
    clock = Clock()
    throttle = FailureThrottle(clock=clock)
    assert throttle.wait("a") == 0
    assert [throttle.failed("a") for _ in range(FREE)] == [0.0] * FREE and throttle.wait("a") == 0
    delays = []
    for _ in range(10):
        delays.append(throttle.failed("a"))
        assert throttle.wait("a") == delays[-1] and throttle.wait("b") == 0
        clock.now += delays[-1]
        assert throttle.wait("a") == 0
    assert delays == [BASE * 2**n for n in range(7)] + [CAP] * 3
    throttle.failed("a")
    clock.now += 1
    assert throttle.wait("a") == CAP - 1
    throttle.succeeded("a")
    assert throttle.wait("a") == 0 and throttle.failed("a") == 0


def test_an_address_quiet_for_long_starts_afresh() -> None:
    clock = Clock()
    throttle = FailureThrottle(clock=clock)
    for _ in range(FREE + 5):
        clock.now += throttle.failed("a")
    clock.now += FORGET - 1
    assert throttle.failed("b") == 0 and len(throttle) == 2  # "a" is still remembered
    clock.now += throttle.failed("a")  # and its next failure waits longer again
    assert throttle.wait("a") == 0 and throttle.failed("a") == BASE * 2**6
    clock.now += FORGET + CAP
    assert throttle.failed("c") == 0 and len(throttle) == 1


def test_memory_is_bounded_by_forgetting_the_longest_ago_failure() -> None:
    throttle = FailureThrottle(clock=Clock(), max_addresses=100, free=0, global_burst=10_000)
    for n in range(1000):
        throttle.failed(f"10.0.{n // 256}.{n % 256}")
    throttle.failed("10.0.3.140")  # failed again: now the newest
    assert len(throttle) == 100
    assert throttle.wait("10.0.0.0") == 0 and throttle.wait("10.0.3.231") == BASE
    assert throttle.wait("10.0.3.140") == BASE * 2


def test_one_address_guessing_never_delays_another_however_long_it_goes_on() -> None:
    """The issue's first reproduction, moved to two addresses: a guesser trying again the moment each delay
    runs out, for an hour, leaves the operator's address (never seen before) compared at every turn."""
    clock = Clock()
    throttle = FailureThrottle(clock=clock)
    guesses = 0
    while clock.now < 1000 + 3600:
        assert throttle.wait("10.0.0.66") == 0, f"the operator waited after {guesses} guesses"
        if throttle.wait("10.0.0.99") == 0:
            throttle.failed("10.0.0.99")
            guesses += 1
        clock.now += 0.25
    assert 60 <= guesses <= 80  # the guesser's own delay: about one a minute once past the first few


def test_guesses_from_many_addresses_spend_one_budget_that_the_operators_address_is_not_held_to() -> None:
    clock = Clock()
    throttle = FailureThrottle(clock=clock)
    throttle.succeeded("10.0.0.1")  # the operator signed in from here earlier today
    clock.now += 3600
    compared = 0
    for n in range(200):
        address = f"10.1.{n // 256}.{n % 256}"
        if throttle.wait(address) == 0:
            throttle.failed(address)
            compared += 1
    assert compared == GLOBAL_BURST  # the other 170 were refused uncompared
    assert throttle.wait("10.2.0.1") == pytest.approx(1 / GLOBAL_RATE)  # a fresh address waits too
    assert throttle.wait("10.0.0.1") == 0  # the operator's does not
    clock.now += 1 / GLOBAL_RATE
    assert throttle.wait("10.2.0.1") == 0  # one more guess's worth of budget


# -- through the app, from real source addresses ----------------------------------------------------------------


@pytest.fixture
async def admin_app(aiohttp_client: Any, upstream: Any, store_url: str) -> tuple[Any, Clock]:
    clock = Clock()
    app = create_app(Settings(upstream=str(upstream.make_url("/v1")), store=store_url, admin_token=Secret(TOKEN)))
    app[throttle_key] = FailureThrottle(clock=clock)  # before it starts: time moves only when a test says so
    return await aiohttp_client(app), clock


async def admin_get(proxy: Any, source: str, token: str | None) -> tuple[int, str | None]:
    """``GET /admin/sessions`` from the source address ``source``: its status and ``Retry-After``."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(source, 0))) as session, \
            session.get(proxy.make_url("/admin/sessions"), headers=headers) as resp:
        await resp.read()
        return resp.status, resp.headers.get("Retry-After")


async def test_the_admin_token_is_accepted_while_a_second_address_guesses(admin_app) -> None:
    proxy, clock = admin_app
    statuses = []
    for turn in range(40):
        statuses.append((await admin_get(proxy, "127.0.0.3", f"guess-{turn}"))[0])
        assert (await admin_get(proxy, "127.0.0.2", TOKEN))[0] == 200, f"refused after {turn + 1} guesses"
        clock.now += 0.5
    assert statuses[:FREE] == [401] * FREE and statuses.count(429) > 20  # the guesser is held to its delay


async def test_two_hundred_guesses_from_two_hundred_addresses_are_throttled(admin_app) -> None:
    proxy, _ = admin_app
    assert (await admin_get(proxy, "127.0.0.2", TOKEN))[0] == 200  # the operator, earlier
    answers = [await admin_get(proxy, f"127.0.{1 + n // 250}.{2 + n % 250}", f"guess-{n}") for n in range(3, 203)]
    assert [status for status, _ in answers].count(401) == GLOBAL_BURST
    refused = [retry for status, retry in answers if status == 429]
    assert len(refused) == 200 - GLOBAL_BURST and set(refused) == {str(round(1 / GLOBAL_RATE))}
    assert (await admin_get(proxy, "127.0.0.2", TOKEN))[0] == 200  # the operator's address is still compared
    assert (await admin_get(proxy, "127.0.9.9", TOKEN))[0] == 429  # a fresh one waits the budget out


async def test_requests_without_a_credential_never_bring_a_delay(admin_app) -> None:
    proxy, _ = admin_app
    for n in range(100):
        assert (await admin_get(proxy, f"127.0.0.{2 + n % 2}", None))[0] == 401
    assert (await admin_get(proxy, "127.0.0.3", "")) == (401, None)  # an empty bearer token is no guess either
    assert (await admin_get(proxy, "127.0.0.2", TOKEN))[0] == 200
    assert (await admin_get(proxy, "127.0.0.4", TOKEN))[0] == 200
