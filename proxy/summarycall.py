"""The summary call: one request to the upstream, in the request's own API, as the caller.

It carries the caller's credentials (or the configured upstream key), so a
summary is billed and authorised like the request that needed it, and it goes
straight to the upstream, never back through the proxy.

When it is made for a client's request (``ClientRequest``: a front door's turn)
it is that request, reshaped as little as a summary needs (``summary_request``):
an upstream that takes the client's requests takes it too, where a request of
the proxy's own would be refused (the ChatGPT Codex backend wants ``stream:
true`` and refuses ``max_output_tokens``; an Anthropic subscription token is
good only with Claude Code's system prompt; an Azure reasoning deployment with
a custom name refuses ``max_tokens``). Claude Code compacts the same way: its
own request, the instruction as the last user turn. It keeps the client's
model (unless ``--summary-model``), system prompt, tools, headers, query,
streaming choice and every other field, except:

- the conversation is the client's leading system items, then one user turn:
  the summariser's instructions first (so the call is recognisable by its first
  words), then what to summarise, ending with the order to write it;
- the output bound goes in the field the client used, or none is sent
  (``Dialect.summary_fields``);
- a ``tool_choice`` that forces a call is dropped (every API then lets the model
  answer in text), and fields that shape the answer's form or tie it to state
  upstream are dropped (``Dialect.summary_drops``). The tools stay, so the
  request's prefix is the client's and its prompt cache serves it; a reply that
  calls a tool is a failed summary, whatever text comes with the call.

A streamed answer is read with the dialect's ``ReplyReader``. Without a client
request (the admin compact endpoint) the call is the dialect's canonical one
(``Dialect.summary_payload``): non-streaming, the summariser's prompt as system
and user messages. Either way the dialect reads the answer: its text, and
whether it finished normally (a summary cut by its output bound is refused by
the summariser).

The answer is the upstream's to shape, and nothing in it may hurt the proxy:
it is read chunk by chunk, streamed or not, and abandoned past a size cap made
from the call's output bound (``answer_cap``), so a 200 MiB answer or an
endless stream costs the proxy a few MiB, not every tenant's event loop and a
gigabyte of memory; a large body is parsed off the event loop. An abandoned
answer is a failed summary (the model-free tier stands in), logged once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from proxy.context.items import leading_system_count
from proxy.context.summary.callusage import CallUsage
from proxy.context.summary.summarizer import Complete, SummaryAnswer, SummaryInputTooLong
from proxy.dialects.base import Dialect, ParsedRequest, answered_model
from proxy.http.relay import event_data
from proxy.overflow import classify_overflow, classify_sse_event
from proxy.settings import Settings
from proxy.sse import EventTooLarge, SSESplitter, parse_event
from proxy.types import Message
from proxy.upstream import client_timeout, map_upstream_errors, request_headers

logger = logging.getLogger(__name__)

#: What one token of a summary answer may take on the wire, generously: its text is about 4 bytes (up to 12 as
#: JSON escapes), but a stream sends about one event per token, each in an envelope of its own (ids, indices, the
#: model's name: 150 to 300 bytes at OpenAI, Anthropic and Google), and the Responses API repeats the text in its
#: closing events.
ANSWER_BYTES_PER_TOKEN = 512
#: What an answer carries that does not grow with its tokens: usage, a reasoning item's encrypted content, and
#: the Responses API's echo of the request's instructions and tools in its opening and closing events.
ANSWER_ENVELOPE_BYTES = 4 * 1024 * 1024
#: A body this large is parsed in a thread: orjson takes about 1 ms a MiB, time no other tenant should wait.
LARGE_ANSWER_BYTES = 1024 * 1024
#: A stream is read and parsed this much at a time, the event loop given back between slices: parsing its events
#: takes about 8 µs each (a 64 KiB read of small events is 5 ms, and a fast upstream fills the next one at once).
STREAM_SLICE_BYTES = 16 * 1024

#: Added to the summariser's instructions in a call that carries the client's tools.
NO_TOOLS = ("Do not call any tool: the tools above belong to the agent whose history this is. Answer with the "
            "summary as text.")


class SummaryCallFailed(Exception):
    """The upstream answered the summary request with an error or an unusable body."""


class AnswerTooLarge(SummaryCallFailed):
    """The answer went past its size cap (``answer_cap``) and was abandoned unread."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"the summary answer went over {cap} bytes and was abandoned")


def answer_cap(max_tokens: int) -> int:
    """The bytes a summary answer bounded to ``max_tokens`` tokens may take, streamed or not."""
    return max_tokens * ANSWER_BYTES_PER_TOKEN + ANSWER_ENVELOPE_BYTES


@dataclass(frozen=True)
class ClientRequest:
    """The client request a summary is made for: its body, its query string (Azure's ``api-version``), and the
    fields the proxy adds to it upstream (``Dialect.cache_fields``) or that its kind implies."""

    parsed: ParsedRequest
    query: Mapping[str, str] = field(default_factory=dict)
    fields: Mapping[str, Any] = field(default_factory=dict)


def forces_tool(choice: Any) -> bool:
    """Whether a ``tool_choice`` makes the model call a tool: ``required`` (OpenAI), ``any`` (Anthropic), a named
    tool or hosted tool, or an ``allowed_tools`` list in ``required`` mode."""
    if isinstance(choice, str):
        return choice in ("required", "any")
    if isinstance(choice, Mapping):
        if "mode" in choice:
            return choice.get("mode") == "required"
        return choice.get("type") not in ("auto", "none")
    return False


def summary_request(dialect: Dialect, request: ClientRequest, model: str, prompt: str,
                    bound: int) -> dict[str, Any]:
    """``request``'s body turned into a summary call asking for ``prompt`` (see the module's docstring)."""
    payload = request.parsed.payload
    out = {name: value for name, value in payload.items()
           if name not in dialect.summary_drops and name not in dialect.bound_fields}
    if forces_tool(out.get("tool_choice")):
        del out["tool_choice"]
    out.update(request.fields)
    items = request.parsed.items
    out[dialect.items_field] = [*items[:leading_system_count(dialect, items)], dialect.with_summary(None, prompt)]
    if dialect.model_field is not None:
        out[dialect.model_field] = model
    out.update(dialect.summary_fields(payload, model, bound))
    return out


def summary_completer(client: aiohttp.ClientSession, settings: Settings, incoming: Mapping[str, str],
                      model: str, dialect: Dialect, shape: ClientRequest | None = None) -> Complete:
    """The summary call as ``incoming``'s caller: shaped like ``shape`` when given, else the canonical call."""
    headers = request_headers(incoming, settings, identity=True, anthropic=dialect.anthropic, gemini=dialect.gemini)
    for name, value in dialect.required_headers.items():
        headers.setdefault(name, value)
    headers["Content-Type"] = "application/json"
    if shape is None:
        headers.popall("Accept", None)  # the canonical call is never streamed; the client's own Accept goes as sent
    url, query = dialect.summary_target(settings, model, shape.parsed if shape is not None else None,
                                        shape.query if shape is not None else {})

    async def complete(messages: list[Message], max_tokens: int) -> SummaryAnswer:
        system, user = (str(m.get("content") or "") for m in messages)
        if shape is None:
            payload = dialect.summary_payload(model, system, user, max_tokens)
        else:
            payload = summary_request(dialect, shape, model, f"{system}\n\n{NO_TOOLS}\n\n{user}", max_tokens)
        cap = answer_cap(max_tokens)
        async with map_upstream_errors(url, settings), client.post(url, data=orjson.dumps(payload), headers=headers,
                                                                   params=query, timeout=client_timeout(settings)
                                                                   ) as resp:
            try:
                if resp.status == 200 and resp.content_type == "text/event-stream":
                    body = await streamed_body(resp, dialect, settings.max_event_bytes, cap)
                else:
                    body = await whole_body(resp, await capped_read(resp, cap))
            except AnswerTooLarge:
                resp.close()  # the rest is never read: the connection goes, not drained
                logger.warning("summary answer abandoned: over %d bytes (%s, model %s), a failed summary", cap,
                               dialect.name, model)
                raise
        return answer_of(dialect, body)

    return complete


async def capped_read(resp: aiohttp.ClientResponse, cap: int) -> bytes:
    """The whole body, read as it arrives; ``AnswerTooLarge`` as soon as it is longer than ``cap`` bytes (at once
    when its ``Content-Length`` says so), so no more than ``cap`` bytes are ever held."""
    if resp.content_length is not None and resp.content_length > cap:
        raise AnswerTooLarge(cap)
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > cap:
            raise AnswerTooLarge(cap)
        chunks.append(chunk)
    return b"".join(chunks)


async def whole_body(resp: aiohttp.ClientResponse, raw: bytes) -> Mapping[str, Any]:
    """A non-streamed answer's JSON object, parsed in a thread when large; a refusal raised as what it is."""
    if resp.status != 200:
        if classify_overflow(resp.status, raw, resp.headers) is not None:
            raise SummaryInputTooLong(f"summary input refused as too long ({resp.status})")
        raise SummaryCallFailed(f"upstream answered {resp.status} to the summary request")
    try:
        body = await asyncio.to_thread(orjson.loads, raw) if len(raw) > LARGE_ANSWER_BYTES else orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise SummaryCallFailed("summary response is not JSON") from None
    return body if isinstance(body, dict) else {}


async def streamed_body(resp: aiohttp.ClientResponse, dialect: Dialect, limit: int, cap: int) -> Mapping[str, Any]:
    """A streamed answer, assembled by the dialect's reader into what the non-streamed answer would hold; an
    overflow error event is ``SummaryInputTooLong``, as the same refusal in a status would be. Events are parsed
    one by one as they come (each under ``limit`` bytes); ``AnswerTooLarge`` once the stream passed ``cap``."""
    reader = dialect.reader()
    splitter = SSESplitter(min(limit, cap))
    size = 0
    model: str | None = None
    try:
        async for chunk in resp.content.iter_chunked(STREAM_SLICE_BYTES):
            size += len(chunk)
            if size > cap:
                raise AnswerTooLarge(cap)
            for raw in splitter.feed(chunk):
                event = parse_event(raw)
                if event is None or not event.data:
                    continue
                data = event_data(event.data)
                refusal = dialect.refusal_of(data)
                if classify_sse_event(event.data if refusal is data else orjson.dumps(refusal)) is not None:
                    raise SummaryInputTooLong("summary input refused as too long (in the stream)")
                reader.feed(event.event, data)
                model = model or answered_model(data)
            await asyncio.sleep(0)  # from a fast upstream the next slice is there at once: let other tenants in
    except EventTooLarge:
        if limit > cap:
            raise AnswerTooLarge(cap) from None
        raise SummaryCallFailed(f"the summary stream sent an event over {limit} bytes") from None
    if not reader.received:
        raise SummaryCallFailed("the summary stream holds no answer")
    body = reader.body()
    return {**body, "model": model} if model is not None else body


def answer_of(dialect: Dialect, body: Mapping[str, Any]) -> SummaryAnswer:
    """The summary an answer holds, with what the call cost; ``SummaryCallFailed`` for one that calls a tool,
    whatever it also says.

    A call is the model going on with the agent's work, not summing it up: the
    text beside it is a preamble ("Let me look at the files first."), and taken
    as the summary it would stand for the whole compacted range. Every door
    refuses it the same way, before the dialect's finish reason is read (the
    Chat and Messages APIs end such an answer with ``tool_calls``/``tool_use``,
    the Responses and Gemini APIs with a normal finish)."""
    items, usage, _ = dialect.reply_from_body(body)
    calls, _ = dialect.reply_calls(items)
    if calls:
        raise SummaryCallFailed(f"the summary answer calls a tool ({calls[0][1]}) instead of answering")
    try:
        text, finished, reason = dialect.summary_answer(body)
    except ValueError as exc:
        raise SummaryCallFailed(str(exc)) from None
    return SummaryAnswer(text, finished=finished, reason=reason, usage=CallUsage(usage, answered_model(body)))
