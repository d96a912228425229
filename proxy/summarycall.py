"""The summary call: one non-streaming request to the upstream, in the request's own API, as the caller.

It carries the caller's credentials (or the configured upstream key), so a
summary is billed and authorised like the request that needed it, and it goes
straight to the upstream, never back through the proxy. The dialect shapes it
(a Chat Completions request, a Responses request with ``instructions``, an
Anthropic Messages request with ``system`` and ``max_tokens``) and reads the
answer: its text, and whether it finished normally (a summary cut by its
output bound is refused by the summariser).
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
import orjson

from proxy.context.summarizer import Complete, SummaryAnswer, SummaryInputTooLong
from proxy.dialects.base import Dialect
from proxy.overflow import classify_overflow
from proxy.settings import Settings
from proxy.types import Message
from proxy.upstream import client_timeout, map_upstream_errors, request_headers


class SummaryCallFailed(Exception):
    """The upstream answered the summary request with an error or an unusable body."""


def summary_completer(client: aiohttp.ClientSession, settings: Settings, incoming: Mapping[str, str],
                      model: str, dialect: Dialect) -> Complete:
    headers = request_headers(incoming, settings, identity=True, anthropic=dialect.anthropic)
    for name, value in dialect.required_headers.items():
        headers.setdefault(name, value)
    headers["Content-Type"] = "application/json"
    headers.popall("Accept", None)
    url = dialect.upstream_url(settings)

    async def complete(messages: list[Message], max_tokens: int) -> SummaryAnswer:
        system, user = (str(m.get("content") or "") for m in messages)
        payload = orjson.dumps(dialect.summary_payload(model, system, user, max_tokens))
        async with map_upstream_errors(), client.post(url, data=payload, headers=headers,
                                                      timeout=client_timeout(settings)) as resp:
            raw = await resp.read()
        if resp.status != 200:
            if classify_overflow(resp.status, raw, resp.headers) is not None:
                raise SummaryInputTooLong(f"summary input refused as too long ({resp.status})")
            raise SummaryCallFailed(f"upstream answered {resp.status} to the summary request")
        try:
            body = orjson.loads(raw)
            text, finished, reason = dialect.summary_answer(body if isinstance(body, dict) else {})
        except orjson.JSONDecodeError:
            raise SummaryCallFailed("summary response is not JSON") from None
        except ValueError as exc:
            raise SummaryCallFailed(str(exc)) from None
        return SummaryAnswer(text, finished=finished, reason=reason)

    return complete
