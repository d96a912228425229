"""The summary call: one non-streaming Chat Completions request to the upstream, as the caller.

It carries the caller's credentials (or ``--upstream-key``), so a summary is
billed and authorised like the request that needed it, and it goes straight
to the upstream, never back through the proxy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

from proxy.context.summarizer import Complete, SummaryInputTooLong
from proxy.overflow import classify_overflow
from proxy.settings import Settings
from proxy.types import Message
from proxy.upstream import client_timeout, map_upstream_errors, request_headers


class SummaryCallFailed(Exception):
    """The upstream answered the summary request with an error or an unusable body."""


def _content(body: Any) -> str:
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise SummaryCallFailed("summary response has no choices[0].message.content") from None
    if not isinstance(content, str):
        raise SummaryCallFailed("summary response content is not text")
    return content


def summary_completer(client: aiohttp.ClientSession, settings: Settings, incoming: Mapping[str, str],
                      model: str) -> Complete:
    headers = request_headers(incoming, settings, identity=True)
    headers["Content-Type"] = "application/json"
    headers.popall("Accept", None)
    url = settings.upstream_base + "/chat/completions"

    async def complete(messages: list[Message]) -> str:
        payload = orjson.dumps({"model": model, "messages": messages})
        async with map_upstream_errors(), client.post(url, data=payload, headers=headers,
                                                      timeout=client_timeout(settings)) as resp:
            raw = await resp.read()
        if resp.status != 200:
            if classify_overflow(resp.status, raw, resp.headers) is not None:
                raise SummaryInputTooLong(f"summary input refused as too long ({resp.status})")
            raise SummaryCallFailed(f"upstream answered {resp.status} to the summary request")
        try:
            return _content(orjson.loads(raw))
        except orjson.JSONDecodeError:
            raise SummaryCallFailed("summary response is not JSON") from None

    return complete
