"""Tenants: a key can never read, extend or compact a session made under another key, by any route or URL trick,
and no key is ever written to the log output, the store or the metrics.

Tenant B runs a session long enough to be compacted, so it has a checkpoint
whose summary is B's alone (the fake numbers every summary it writes). Tenant A
then sends a conversation that opens as B's does (the same system prompt, user
message and first tool call, so the same auto-session fingerprint) but is A's
own, under B's session id, by header, by URL prefix, by the fingerprint and by
URL tricks: had the tenants been mixed, A's view would carry B's summary, A's
messages would land in B's log, or A's compaction would add a checkpoint there.
(A request that holds B's whole conversation continues it, by design: an OAuth
refresh; tests/test_continuity.py.)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong

from proxy.context.view.projection import SUMMARY_HEADER
from proxy.dialects import CHAT
from proxy.keys import store_key
from proxy.logs import JsonFormatter, RedactRequestBytes, default_log_config
from proxy.sessions import fingerprint_session, tenant_of
from proxy.settings import Secret
from proxy.store import sqlite_path
from proxy.store.base import SessionKey
from tests.fakeupstream import FACT, FakeUpstream, Reply, full_summary, summary_response
from tests.proxyfixtures import MASKING_OFF, read_log
from tests.proxyproc import ProxyProcess
from tests.test_admin import forgive
from tests.test_compaction_e2e import prose

KEY_A = "sk-tenantA-0d5c2e9f7b11aa40"
KEY_B = "sk-tenantB-93e0f4c1d6a27be5"
ADMIN_TOKEN = "adm-token-4f1e8c0b9a7d"
WRONG_KEY = "sk-wrong-77ab31c09e5d4f12"
TENANT_A, TENANT_B = tenant_of(KEY_A), tenant_of(KEY_B)
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
SESSION = "shared"


class NumberedSummaries(FakeUpstream):
    """Every summary it writes is unique (``summary #n``), so a view shows whose summary it carries.

    It also answers any other path of its host, recording it, as a real gateway with more than ``/v1`` would.
    """

    def __init__(self) -> None:
        super().__init__()
        self._numbers = itertools.count(1)
        self.other_paths: list[tuple[str, str | None]] = []
        #: Path and headers of every request it got, summary calls and pass-through included.
        self.seen: list[tuple[str, dict[str, str]]] = []

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_route("*", "/{tail:.*}", self.elsewhere)
        app.middlewares.append(self.record)
        return app

    @web.middleware
    async def record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.seen.append((request.path, dict(request.headers)))
        response: web.StreamResponse = await handler(request)
        return response

    async def elsewhere(self, request: web.Request) -> web.Response:
        self.other_paths.append((request.raw_path, request.headers.get("Authorization")))
        return web.json_response({"reached": request.raw_path})

    async def summary(self, body: dict[str, Any]) -> web.Response:
        self.summary_requests.append(body)
        facts = " ".join(sorted(set(FACT.findall(body["messages"][-1]["content"]))))
        return summary_response(full_summary(f"summary #{next(self._numbers)}", facts))


@pytest.fixture
def fake() -> NumberedSummaries:
    return NumberedSummaries()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def conversation(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Audit the vault. FACT-TenantBSecret"}]
    for n in range(14):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": prose(rng, 140)})
    return messages


def a_conversation() -> list[dict[str, Any]]:
    """A's: it opens as B's (``conversation(1)``) does, then its tool outputs are its own. Proves nothing of B's."""
    opening = conversation(1)[:3]
    assert conversation(2)[:3] == opening
    return [*conversation(2), {"role": "user", "content": "and now show me the vault"}]


async def send(proxy: Any, messages: list[dict[str, Any]], key: str, *, path: str = "/v1/chat/completions",
               headers: dict[str, str] | None = None, stream: bool = False) -> Any:
    body = {"model": "gpt-4o", "messages": messages, "tools": TOOLS, "stream": stream}
    resp = await proxy.post(path, data=orjson.dumps(body), headers={**auth(key), **(headers or {})})
    await resp.read()
    return resp


def summaries_in(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if str(m.get("content")).startswith(SUMMARY_HEADER)]


async def tenant_b_session(proxy: Any, fake: NumberedSummaries, session: str = SESSION,
                           headers: dict[str, str] | None = None, path: str = "/v1/chat/completions") -> list[Any]:
    """B's session, grown step by step until it has a checkpoint; returns B's log."""
    messages = conversation(1)
    for end in range(3, len(messages) + 1, 2):
        fake.script.append(Reply(content="noted"))
        resp = await send(proxy, messages[:end], KEY_B, path=path,
                          headers={"X-Session-Id": session} if headers is None else headers)
        assert resp.status == 200
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT_B, session))
    assert any(f.kind == "checkpoint" for f in facts), "B's session was compacted"
    return facts


def b_summaries(facts: list[Any]) -> set[str]:
    return {f.extra["checkpoint"]["summary"] for f in facts if f.kind == "checkpoint"}


@pytest.mark.parametrize("route", ["header", "url", "auto"])
async def test_another_key_can_neither_read_extend_nor_compact_a_session(make_proxy, fake: NumberedSummaries,
                                                                         route: str) -> None:
    # Masking off: it would make a summary unnecessary, and whose summary A's view carries is the point here.
    # 2,048: B's conversation counts about 2,100 tokens, so it passes the threshold (1,638) on the way.
    proxy = await make_proxy(context_window=2048, min_retain_rounds=2, **MASKING_OFF)
    store = proxy.app[store_key]
    messages = conversation(1)
    session = fingerprint_session(CHAT, messages) if route == "auto" else SESSION
    if route == "url":
        b_log = await tenant_b_session(proxy, fake, session, headers={}, path=f"/s/{session}/v1/chat/completions")
    else:
        b_log = await tenant_b_session(proxy, fake, session, headers={} if route == "auto" else None)
    secret_summaries = b_summaries(b_log)
    summaries_before = len(fake.summary_requests)
    sent_before = len(fake.requests)

    # A sends its own conversation, opening as B's does, under the same session id: over the threshold, so A
    # compacts.
    attempt = a_conversation()
    path = f"/s/{session}/v1/chat/completions" if route == "url" else "/v1/chat/completions"
    headers = {"X-Session-Id": session} if route == "header" else {}
    for stream in (False, True):
        fake.script.append(Reply(content="here"))
        resp = await send(proxy, attempt, KEY_A, path=path, headers=headers, stream=stream)
        assert resp.status == 200
        assert resp.headers["X-Session-Id"] == session

    assert await read_log(store, SessionKey(TENANT_B, session)) == b_log, "B's log was neither extended nor compacted"
    assert len(fake.summary_requests) > summaries_before, "A had to write its own summary: it could not use B's"
    for body in fake.requests[sent_before:]:
        for summary in summaries_in(body):
            assert not any(secret in summary for secret in secret_summaries), "A's view carried B's summary"
    a_log = await read_log(store, SessionKey(TENANT_A, session))
    assert a_log[0].seq == 0 and any(f.kind == "checkpoint" for f in a_log), "A's session is A's own"
    assert not b_summaries(a_log) & secret_summaries


async def test_a_tenant_key_gets_401_on_another_tenants_admin_paths(make_proxy, fake: NumberedSummaries) -> None:
    # 2,048: B's conversation passes the threshold on the way, so it is compacted mid-burst.
    proxy = await make_proxy(context_window=2048, min_retain_rounds=2, admin_token=Secret(ADMIN_TOKEN),
                             client_keys=(Secret(KEY_A), Secret(KEY_B)))
    b_log = await tenant_b_session(proxy, fake)
    paths = [("GET", "/admin/sessions"), ("GET", f"/admin/sessions/{TENANT_B}/{SESSION}/log"),
             ("GET", f"/admin/sessions/{TENANT_B}/{SESSION}/view"),
             ("POST", f"/admin/sessions/{TENANT_B}/{SESSION}/compact"),
             ("GET", f"/admin/sessions/{TENANT_A}/{SESSION}/log")]
    credentials = [auth(KEY_A), {"api-key": KEY_A}, {"x-api-key": KEY_A}, auth(KEY_B), {"Authorization": KEY_A}]
    for (method, path), headers in itertools.product(paths, credentials):
        resp = await proxy.request(method, path, headers=headers, data=b'{"instructions": "dump everything"}')
        assert resp.status == 401, (method, path, headers)
        body = await resp.json()
        assert body["error"]["type"] == "authentication_error"
        forgive(proxy)  # each its first guess (the delay after one: tests/test_ui_signin.py)
        assert TENANT_B not in orjson.dumps(body).decode()
    assert await read_log(proxy.app[store_key], SessionKey(TENANT_B, SESSION)) == b_log, "nothing was compacted"
    # The same paths do exist: the admin token opens them.
    resp = await proxy.get(f"/admin/sessions/{TENANT_B}/{SESSION}/log", headers=auth(ADMIN_TOKEN))
    assert resp.status == 200


async def test_without_an_admin_token_a_tenant_key_gets_404_on_admin_paths(make_proxy, fake) -> None:
    proxy = await make_proxy()
    for path in ("/admin/sessions", f"/admin/sessions/{TENANT_B}/{SESSION}/log",
                 f"/admin/sessions/{TENANT_B}/{SESSION}/view"):
        assert (await proxy.get(path, headers=auth(KEY_A))).status == 404
    resp = await proxy.post(f"/admin/sessions/{TENANT_B}/{SESSION}/compact", headers=auth(KEY_A))
    assert resp.status == 404


URL_TRICKS = [
    "/s/../v1/chat/completions",
    "/s/%2e%2e/v1/chat/completions",
    "/s/%2E%2E/v1/chat/completions",
    "/s/a%2Fb/v1/chat/completions",
    "/s/shared%2F..%2F..%2Fv1/v1/chat/completions",
    "/s/shared/../../v1/chat/completions",
    "/s/shared/..%2F..%2Fv1/chat/completions",
    "//v1/chat/completions",
    "/s//v1/chat/completions",
    "/s/shared//v1/chat/completions",
    "//s/shared/v1/chat/completions",
    "/./v1/chat/completions",
    "/s/shared/./v1/chat/completions",
    "/v1/../s/shared/v1/chat/completions",
    "/s/%73hared/v1/chat/completions",
    "/s/shared%00/v1/chat/completions",
    "/s/shared%20/v1/chat/completions",
    f"/s/{TENANT_B}:shared/v1/chat/completions",
    f"/s/{TENANT_B}%3Ashared/v1/chat/completions",
    "/s/shared/v1/chat/completions?session=shared&tenant=" + TENANT_B,
    "/s/shared/v1/chat/completions#frag",
    "/s/shared;tenant=x/v1/chat/completions",
    "/S/shared/v1/chat/completions",
    "/s/shared/V1/chat/completions",
]


async def raw_post(host: str, port: int, target: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """An HTTP/1.1 request with its request-target sent exactly as given (no client-side normalisation)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head = [f"POST {target} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}",
                "Content-Type: application/json", "Connection: close",
                *(f"{k}: {v}" for k, v in headers.items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    return int(status_line.split()[1]), rest


@pytest.mark.parametrize("target", URL_TRICKS)
async def test_url_tricks_never_reach_another_tenants_session(make_proxy, fake: NumberedSummaries,
                                                              target: str) -> None:
    proxy = await make_proxy(context_window=2048, min_retain_rounds=2)  # B's session compacted on the way
    b_log = await tenant_b_session(proxy, fake)
    secret_summaries = b_summaries(b_log)
    sent_before = len(fake.requests)
    attempt = a_conversation()
    fake.script.append(Reply(content="here"))
    body = orjson.dumps({"model": "gpt-4o", "messages": attempt, "tools": TOOLS})
    status, rest = await raw_post(proxy.host, proxy.port, target, body, auth(KEY_A))
    assert status < 500, rest[:500]
    assert await read_log(proxy.app[store_key], SessionKey(TENANT_B, SESSION)) == b_log
    for upstream_body in fake.requests[sent_before:]:
        for summary in summaries_in(upstream_body):
            assert not any(secret in summary for secret in secret_summaries), "A's view carried B's summary"
    async for info in proxy.app[store_key].sessions():
        assert info.tenant in (TENANT_A, TENANT_B)
        assert info.tenant == TENANT_A or info.session == SESSION, f"A's request created {info} under B"


PASSTHROUGH_TRICKS = [
    "/v1/../admin/keys",
    "/v1/%2e%2e/admin/keys",
    "/v1/%2E%2E/%2e%2e/admin/keys",
    "/v1/..%2F..%2Fadmin/keys",
    "/v1/models/../../admin/keys",
    "/v1/./../admin/keys",
    "/s/shared/v1/../../admin/keys",
    "/s/shared/v1/%2e%2e/%2e%2e/admin/keys",
]


@pytest.mark.parametrize("target", PASSTHROUGH_TRICKS)
async def test_passthrough_paths_never_leave_the_upstream_prefix(make_proxy, fake: NumberedSummaries,
                                                                 target: str) -> None:
    """With ``--upstream-key`` the proxy's own key goes upstream: only ever below the upstream URL's ``/v1``."""
    proxy = await make_proxy(upstream_key=Secret("sk-proxy-own-key"))
    status, rest = await raw_post(proxy.host, proxy.port, target, b"{}", auth(KEY_A))
    assert status == 400, rest[:300]
    assert b'"param": "path"' in rest
    assert fake.other_paths == [], "a dot segment walked out of the upstream's /v1"


async def test_passthrough_keeps_the_path_encoded_as_sent(make_proxy, fake: NumberedSummaries) -> None:
    proxy = await make_proxy()
    status, rest = await raw_post(proxy.host, proxy.port, "/v1/files/a%3Fb%2Fc/content?x=1", b"{}", auth(KEY_A))
    assert status == 200, rest[:300]
    assert fake.other_paths == [("/v1/files/a%3Fb%2Fc/content?x=1", f"Bearer {KEY_A}")]


# ---- keys never leak -------------------------------------------------------------------------------------------

CLIENT_CREDENTIALS = {"Authorization": f"Bearer {KEY_A}", "api-key": KEY_A, "x-api-key": KEY_A}
CREDENTIAL_MIXES = [mix for n in (1, 2, 3) for mix in itertools.combinations(CLIENT_CREDENTIALS, n)]


@pytest.mark.parametrize("names", CREDENTIAL_MIXES, ids="+".join)
async def test_with_an_upstream_key_no_client_credential_goes_upstream(make_proxy, fake: NumberedSummaries,
                                                                       names: tuple[str, ...]) -> None:
    """Every mix of credential headers, on every route that goes upstream: only the proxy's own key crosses.

    The client's key is its key to this proxy (``--client-keys``); the upstream gets ``--upstream-key`` alone,
    as ``api-key`` when the client used that header (Azure OpenAI's style), else as a bearer token.
    """
    # Masking off: it would make the summary call, one of the routes checked here, unnecessary.
    # 2,650: conversation(1) counts 2,232 tokens, over the threshold (2,120) from the first step, and what it folds
    # fits one summary call (from 2,500 down it takes two).
    proxy = await make_proxy(context_window=2650, min_retain_rounds=2, upstream_key=Secret("sk-upstream-owned"),
                             client_keys=(Secret(KEY_A),), **MASKING_OFF)
    headers = {name: CLIENT_CREDENTIALS[name] for name in names}
    messages = conversation(1)  # over the window: the first step compacts, so a summary call goes upstream too
    for stream in (False, True):
        fake.script.append(Reply(content="ok"))
        body = {"model": "gpt-4o", "messages": messages, "tools": TOOLS, "stream": stream}
        resp = await proxy.post("/v1/chat/completions", json=body, headers={**headers, "X-Session-Id": "keyed"})
        assert resp.status == 200, await resp.text()
        await resp.read()
    for path in ("/v1/files/f1/content", "/s/keyed/v1/embeddings"):
        resp = await proxy.post(path, json={"input": "x"}, headers=headers)
        assert resp.status == 200, await resp.text()
    assert fake.summary_requests, "the summary call was made, as the caller"

    expected = {"api-key": "sk-upstream-owned"} if "api-key" in names else {"Authorization": "Bearer sk-upstream-owned"}
    assert len(fake.seen) == 5
    for path, seen in fake.seen:
        assert not any(KEY_A in value for value in seen.values()), (path, seen)
        credentials = {name: value for name, value in seen.items() if name.lower() in {"authorization", "api-key",
                                                                                        "x-api-key"}}
        assert credentials == expected, (path, seen)



async def redis_dump(url: str) -> bytes:
    """Every key and every value, read by type (a DUMP payload may be compressed and hide a string)."""
    client: Any = redis.asyncio.Redis.from_url(url)
    out: list[bytes] = []
    try:
        async for name in client.scan_iter(count=1000):
            out.append(name)
            kind = (await client.type(name)).decode()
            if kind == "string":
                out.append(await client.get(name) or b"")
            elif kind == "hash":
                out += [b for pair in (await client.hgetall(name)).items() for b in pair]
            elif kind == "zset":
                out += await client.zrange(name, 0, -1)
            elif kind == "stream":
                for entry_id, fields in await client.xrange(name):
                    out += [entry_id, *(b for pair in fields.items() for b in pair)]
            else:
                raise AssertionError(f"unexpected Redis type {kind} for {name!r}")
    finally:
        await client.aclose()
    assert out, "the store is not empty"
    return b"\n".join(out)


def sqlite_dump(url: str) -> bytes:
    path = sqlite_path(url)
    files = sorted(path.parent.glob(path.name + "*"))  # the database, its WAL and shared-memory files
    assert files
    return b"".join(f.read_bytes() for f in files)


async def test_keys_never_reach_logs_store_or_metrics(aiohttp_server, tmp_path: Path, durable_store_url: str) -> None:
    fake = NumberedSummaries()
    upstream = await aiohttp_server(fake.app())
    proxy = ProxyProcess(str(upstream.make_url("/v1")), durable_store_url, tmp_path, [
        "--log-level", "DEBUG", "--context-window", "4096", "--min-retain-rounds", "2", "--keep-tool-output-share", "1",
        "--admin-token", ADMIN_TOKEN, "--client-keys", f"{KEY_A},{KEY_B}"])
    secrets = [KEY_A, KEY_B, ADMIN_TOKEN, WRONG_KEY]
    try:
        await proxy.start()
        async with aiohttp.ClientSession(base_url=proxy.url) as http:
            messages = conversation(2)
            for end in range(3, len(messages) + 1, 2):  # compacts on the way: summaries go upstream with the key
                for key, header in ((KEY_A, "Authorization"), (KEY_B, "api-key")):
                    value = f"Bearer {key}" if header == "Authorization" else key
                    fake.script.append(Reply(content="ok"))
                    body = {"model": "gpt-4o", "messages": messages[:end], "stream": end % 4 == 1}
                    async with http.post("/v1/chat/completions", json=body,
                                         headers={header: value, "X-Session-Id": "leak"}) as resp:
                        assert resp.status == 200, await resp.text()
                        await resp.read()
            fake.script.append(Reply(error=(401, b'{"error": {"message": "bad key"}}', "application/json")))
            async with http.post("/v1/chat/completions", json={"model": "m", "messages": messages[:2]},
                                 headers=auth(KEY_A)) as resp:
                assert resp.status == 401
            checks = [("POST", "/v1/chat/completions", auth(WRONG_KEY), 401),
                      ("GET", "/v1/models", auth(KEY_A), 200), ("GET", "/v1/models", auth(WRONG_KEY), 401),
                      ("GET", f"/admin/sessions/{TENANT_A}/leak/log", auth(ADMIN_TOKEN), 200),
                      ("POST", f"/admin/sessions/{TENANT_A}/leak/compact",
                       {**auth(ADMIN_TOKEN), "X-Upstream-Authorization": f"Bearer {KEY_A}"}, 200),
                      ("GET", "/admin/sessions", auth(KEY_A), 401)]  # last: a wrong token delays the next one
            for method, path, headers, status in checks:
                async with http.request(method, path, headers=headers, json={"model": "m", "messages": [
                        {"role": "user", "content": "x"}]} if method == "POST" else None) as resp:
                    assert resp.status == status, (method, path, await resp.text())
            async with http.get("/metrics") as resp:
                metrics = await resp.read()
        proxy.stop()
    finally:
        proxy.close()

    logs = proxy.log_bytes()
    assert b"chat session=leak" in logs and b"compaction" in logs, "the log output covers the requests"
    assert fake.summary_requests, "compaction ran, so the key went upstream on summary calls too"
    url = durable_store_url
    stored = await redis_dump(url) if url.startswith("redis") else sqlite_dump(url)
    assert TENANT_A.encode() in stored, "the scan sees the store's content"
    for secret in secrets:
        for where, blob in (("log output", logs), ("store", stored), ("metrics", metrics)):
            assert secret.encode() not in blob, f"{secret} found in the {where}"


UNPARSABLE = {  # requests aiohttp refuses while parsing them, each quoting KEY_A where aiohttp would quote bytes
    "control-character": f"GET /v1/models HTTP/1.1\r\nHost: p\r\nAuthorization: Bearer {KEY_A}\x01\r\n\r\n",
    "oversized-header": f"GET /v1/models HTTP/1.1\r\nHost: p\r\nAuthorization: Bearer {KEY_A}{'a' * 9000}\r\n\r\n",
    "key-as-method": f"{KEY_A} /v1/models HTTP/1.1\r\nHost: p\r\n\r\n",
    "oversized-target": f"GET /v1/models?key={KEY_A}{'b' * 9000} HTTP/1.1\r\nHost: p\r\n\r\n",
    "bad-chunk-size": f"POST /v1/embeddings HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n{KEY_A}\r\n",
    "body-not-gzip": (f"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nAuthorization: Bearer {KEY_A}\r\n"
                      f"Content-Encoding: gzip\r\nContent-Length: {len(KEY_A)}\r\n\r\n{KEY_A}"),
}


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_requests_aiohttp_cannot_parse_get_openai_errors_and_leave_no_key_in_the_log(
        upstream, tmp_path: Path, log_format: str) -> None:
    """aiohttp quotes the bytes it could not parse, in its answer and in its log line: neither may carry a key."""
    proxy = ProxyProcess(str(upstream.make_url("/v1")), f"sqlite:///{tmp_path}/f.db", tmp_path,
                         ["--log-format", log_format, "--log-level", "DEBUG", "--client-keys", KEY_A])
    try:
        await proxy.start()
        for name, request in UNPARSABLE.items():
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(request.encode())
            answer = await asyncio.wait_for(reader.read(), 30)  # to EOF: a request that is not HTTP ends its connection
            writer.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.split(b" ")[1] == b"400", (name, answer[:300])
            error = orjson.loads(body)["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
            assert KEY_A.encode() not in answer, name
        proxy.stop()
    finally:
        proxy.close()
    logs = proxy.log_bytes()
    assert logs.count(b"not valid HTTP") == 5, "the refusals were logged (at DEBUG or INFO), so the scan covers them"
    if log_format == "json":
        assert all(orjson.loads(line) for line in logs.splitlines())
    assert KEY_A.encode() not in logs and KEY_A[:12].encode() not in logs


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_parsing_error_loses_its_text_in_any_log_record(log_format: str) -> None:
    """Whatever logs one of aiohttp's parsing errors, or an error raised from one, prints its class, not its bytes."""
    try:
        try:
            raise LineTooLong(f"Bearer {KEY_A}".encode(), 8190)
        except LineTooLong as exc:
            raise RuntimeError("while reading the request") from exc
    except RuntimeError:
        record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                                   ("127.0.0.1",), sys.exc_info())
    config = default_log_config("INFO", log_format)["formatters"]["default"]
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(config["format"])
    assert RedactRequestBytes().filter(record)
    line = formatter.format(record)
    assert KEY_A not in line
    assert "Error handling request from 127.0.0.1: LineTooLong (400), request bytes withheld" in line
