"""The Gemini API's ``key`` query parameter is a credential (issue 35): for the tenant a request belongs to, so two
clients that send their keys that way never share a session (before, both were ``anonymous``), and for
``--client-keys``; and no log line holds it. On both stores."""

from __future__ import annotations

import logging

import pytest

from proxy.constants import HEADER_SESSION
from proxy.keys import store_key
from proxy.sessions import ANONYMOUS_TENANT, tenant_of
from proxy.settings import Secret
from tests.test_scoped_links import GENERATE, proxy_on

KEYS = ("AIza-first-query-key-0c1d", "AIza-second-query-key-77e2")
BODY = {"contents": [{"role": "user", "parts": [{"text": "Say hello."}]}]}


async def test_a_key_in_the_query_is_the_tenant_and_never_logged(aiohttp_server, aiohttp_client, store_url: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    client, *_ = await proxy_on(aiohttp_server, aiohttp_client, store_url)
    caplog.set_level(logging.DEBUG)
    for key in KEYS:
        resp = await client.post(f"{GENERATE}?key={key}", headers={HEADER_SESSION: "shared-id"}, json=BODY)
        assert resp.status == 200, await resp.text()
    tenants = sorted([info.tenant async for info in client.app[store_key].sessions()])
    assert tenants == sorted(tenant_of(key) for key in KEYS), "one session per key, none anonymous"
    assert ANONYMOUS_TENANT not in tenants
    # aiohttp's access lines are the test servers' own (the proxy serves with none: proxy/server.py).
    logged = [r for r in caplog.records if r.name != "aiohttp.access"]
    assert logged and not [r for r in logged if any(key in r.getMessage() for key in KEYS)]


async def test_client_keys_accept_a_key_in_the_query(aiohttp_server, aiohttp_client, store_url: str) -> None:
    client, *_ = await proxy_on(aiohttp_server, aiohttp_client, store_url, client_keys=(Secret(KEYS[0]),))
    allowed = await client.post(f"{GENERATE}?key={KEYS[0]}", json=BODY)
    assert allowed.status == 200, await allowed.text()
    refused = await client.post(f"{GENERATE}?key={KEYS[1]}", json=BODY)
    assert refused.status == 401
    missing = await client.post(GENERATE, json=BODY)
    assert missing.status == 401
