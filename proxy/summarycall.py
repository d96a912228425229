"""The summary call: one non-streaming Chat Completions request to the upstream, as the caller.

It carries the caller's credentials (or ``--upstream-key``), so a summary is
billed and authorised like the request that needed it, and it goes straight
to the upstream, never back through the proxy. Its answer is bounded: OpenAI's
reasoning models (o1, o3, o4, gpt-5…) refuse ``max_tokens`` and take
``max_completion_tokens``; every other model is sent ``max_tokens``, the field
OpenAI-compatible servers share.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

from proxy.context.summarizer import Complete, SummaryAnswer, SummaryInputTooLong
from proxy.overflow import classify_overflow
from proxy.settings import Settings
from proxy.types import Message
from proxy.upstream import client_timeout, map_upstream_errors, request_headers

#: Finish reasons of an answer that ended on its own: OpenAI's, and Anthropic's for its compatible endpoints.
NORMAL_FINISH = frozenset({"stop", "end_turn"})
_REASONING_MODEL = re.compile(r"(o[1-9]|gpt-5)([-.:_]|$)")


class SummaryCallFailed(Exception):
    """The upstream answered the summary request with an error or an unusable body."""


def output_bound_field(model: str) -> str:
    """The request field that bounds the answer of ``model``, named with or without a provider prefix."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    return "max_completion_tokens" if _REASONING_MODEL.match(name) else "max_tokens"


def _answer(body: Any) -> SummaryAnswer:
    try:
        choice = body["choices"][0]
        content = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise SummaryCallFailed("summary response has no choices[0].message.content") from None
    if not isinstance(content, str):
        raise SummaryCallFailed("summary response content is not text")
    reason = choice.get("finish_reason")
    return SummaryAnswer(content, finished=reason in NORMAL_FINISH, reason=str(reason) if reason else "missing")


def summary_completer(client: aiohttp.ClientSession, settings: Settings, incoming: Mapping[str, str],
                      model: str) -> Complete:
    headers = request_headers(incoming, settings, identity=True)
    headers["Content-Type"] = "application/json"
    headers.popall("Accept", None)
    url = settings.upstream_base + "/chat/completions"
    bound = output_bound_field(model)

    async def complete(messages: list[Message], max_tokens: int) -> SummaryAnswer:
        payload = orjson.dumps({"model": model, "messages": messages, bound: max_tokens})
        async with map_upstream_errors(), client.post(url, data=payload, headers=headers,
                                                      timeout=client_timeout(settings)) as resp:
            raw = await resp.read()
        if resp.status != 200:
            if classify_overflow(resp.status, raw, resp.headers) is not None:
                raise SummaryInputTooLong(f"summary input refused as too long ({resp.status})")
            raise SummaryCallFailed(f"upstream answered {resp.status} to the summary request")
        try:
            return _answer(orjson.loads(raw))
        except orjson.JSONDecodeError:
            raise SummaryCallFailed("summary response is not JSON") from None

    return complete
