"""``ctxproxy check``'s look at each upstream: reachable, answering, and at a path that looks right.

One cheap GET per upstream, the one each API answers without a model call:
``{upstream}/models`` for the OpenAI-style upstream, ``{anthropic}/v1/models``
and ``{gemini}/v1beta/models``. A 404 there is what a base URL with ``/v1``
missing or doubled gets; a 401 or 403 without a configured key is an answer
(serving, the agent's own key goes upstream), with one it is that key refused.
Each line also says where the doors' requests would go, so a user reads the
URL the proxy would call before an agent does.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import aiohttp

from proxy.errors import UpstreamError
from proxy.preflight import Upstream, refusal, suspicion, upstreams
from proxy.settings import Settings
from proxy.upstream import client_timeout, map_upstream_errors, request_headers

#: Seconds a probe may wait for a connection, and again for an answer.
PROBE_SECONDS = 10.0
#: The version the Anthropic API's clients send; its ``/v1/models`` answers 400 without one.
ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class Probed:
    """What probing one upstream found: ``ok`` and a line in words."""

    ok: bool
    line: str


def _plan(upstream: Upstream) -> tuple[str, str]:
    """The URL probed, and what the doors' requests would go to, in words."""
    base = upstream.url.rstrip("/")
    if upstream.flag == "--anthropic-upstream":
        return base + "/v1/models", f"/v1/messages goes to {base}/v1/messages"
    if upstream.flag == "--gemini-upstream":
        return base + "/v1beta/models", f"/v1beta/models/MODEL:generateContent goes to {base}/v1beta/models/…"
    return base + "/models", f"/v1/chat/completions goes to {base}/chat/completions, /v1/responses to {base}/responses"


async def probe(client: aiohttp.ClientSession, settings: Settings, upstream: Upstream) -> Probed:
    """Probe ``upstream`` once: the line ``check`` prints for it."""
    named = f"{upstream.flag} {upstream.url}"
    refused = refusal(upstream)
    if refused is not None:
        return Probed(False, f"{named}: failed: {refused}")
    url, goes = _plan(upstream)
    anthropic, gemini = upstream.flag == "--anthropic-upstream", upstream.flag == "--gemini-upstream"
    headers = request_headers({}, settings, identity=False, anthropic=anthropic, gemini=gemini)
    keyed = "Authorization" in headers or "x-api-key" in headers or "x-goog-api-key" in headers
    if anthropic:
        headers["anthropic-version"] = ANTHROPIC_VERSION
    try:
        async with map_upstream_errors(url, settings), client.get(url, headers=headers,
                                                                   timeout=client_timeout(settings)) as resp:
            status = resp.status
    except UpstreamError as exc:
        return Probed(False, f"{named}: failed: {exc.message}")
    asked = f"GET {url} answered {status}"
    if status == 404:
        return Probed(False, f"{named}: failed: {asked}: the path looks wrong (/v1 missing or doubled?), "
                             f"so {goes}")
    if status in (401, 403) and keyed:
        return Probed(False, f"{named}: failed: {asked}: it refuses the configured key")
    warning = suspicion(upstream)
    tail = f"; warning: {warning}" if warning is not None else ""
    answered = f"{asked} (no key configured: the agent's own goes)" if status in (401, 403) else asked
    return Probed(True, f"{named}: ok: {answered}; {goes}{tail}")


async def probe_all(settings: Settings) -> list[Probed]:
    """Every upstream probed at once, in the order of their flags."""
    quick = dataclasses.replace(settings, connect_timeout=PROBE_SECONDS, upstream_timeout=PROBE_SECONDS)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as client:
        return list(await asyncio.gather(*(probe(client, quick, u) for u in upstreams(quick))))
