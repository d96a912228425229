"""The operator's requests are in the access log: the admin reading a tenant's log, the inspector's pages, and
callers without the token, each with the tenant and session the path names; never the query."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from proxy.logs import ACCESS_LOGGER, JsonFormatter
from tests.test_admin import ADMIN, TENANT, admin_proxy, chat, forgive
from tests.test_ui import TOKEN as UI_TOKEN
from tests.test_ui import sign_in, ui_proxy


def lines(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    """The access lines of ``event`` (``admin``, ``ui``) as the JSON log writes them."""
    return [orjson.loads(JsonFormatter().format(r)) for r in caplog.records
            if r.name == ACCESS_LOGGER and getattr(r, "fields", {}).get("event") == event]


async def test_the_admin_reading_a_tenants_log_leaves_an_access_line(make_proxy, caplog) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    proxy = await admin_proxy(make_proxy)
    await chat(proxy, [{"role": "user", "content": "hello"}], "s1")
    assert (await proxy.get(f"/admin/sessions/{TENANT}/s1/log?after=0", headers=ADMIN)).status == 200
    assert (await proxy.get("/admin/sessions", headers={"Authorization": "Bearer wrong-token-31"})).status == 401
    forgive(proxy)

    read, refused = lines(caplog, "admin")
    assert {k: read[k] for k in ("method", "path", "tenant", "session", "status", "remote")} == {
        "method": "GET", "path": f"/admin/sessions/{TENANT}/s1/log", "tenant": TENANT, "session": "s1",
        "status": 200, "remote": "127.0.0.1"}
    assert read["message"].startswith(f"admin GET /admin/sessions/{TENANT}/s1/log tenant={TENANT} session=s1 "
                                      f"status=200 ms=")
    assert (refused["path"], refused["status"], refused["tenant"]) == ("/admin/sessions", 401, None)
    assert "after=" not in caplog.text and "wrong-token-31" not in caplog.text


async def test_the_inspectors_pages_are_in_the_access_log_and_its_polls_only_at_debug(make_proxy, caplog) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    proxy = await ui_proxy(make_proxy)
    await chat(proxy, [{"role": "user", "content": "hello"}], "s1")
    await sign_in(proxy)
    assert (await proxy.get(f"/ui/sessions/{TENANT}/s1")).status == 200
    assert (await proxy.get(f"/ui/sessions/{TENANT}/s1/live?since=0")).status == 200

    seen = [(line["method"], line["path"], line["status"], line["session"]) for line in lines(caplog, "ui")]
    assert seen == [("GET", "/ui/signin", 200, None), ("POST", "/ui/signin", 303, None),
                    ("GET", f"/ui/sessions/{TENANT}/s1", 200, "s1")]
    assert UI_TOKEN not in caplog.text
