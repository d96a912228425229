"""Reading and validating a Chat Completions request body.

The body is read at most once, bounded by ``max_body_bytes`` (aiohttp's
``client_max_size`` refuses more with 413 before reading it whole; a
Content-Length over the limit is refused before reading anything) and by
``client_timeout``: a client that trickles its body gets a 408 once that many
seconds have passed, however steadily the bytes come. Parsing is
orjson: invalid UTF-8, bad JSON and nesting deeper than orjson's limit all
become 400s, never 500s.

orjson reads up to 1024 levels of nesting but writes only up to 254, and the
proxy writes what it read (message hashes, the session fingerprint, the log,
the body it forwards). So what could nest is written once here, and what cannot
be written is refused as the client's error, before any of that.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import BadRequest, PayloadTooLarge, RequestTimeout
from proxy.settings import Settings
from proxy.types import Message


@dataclass(frozen=True, slots=True)
class ChatRequest:
    raw: bytes
    payload: dict[str, Any]
    messages: list[Message]

    @property
    def stream(self) -> bool:
        return self.payload.get("stream") is True

    @property
    def model(self) -> str | None:
        model = self.payload.get("model")
        return model if isinstance(model, str) else None


async def read_body(request: web.Request, settings: Settings) -> bytes:
    limit = settings.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"Request body of {request.content_length} bytes is over the limit of {limit}.")
    try:
        async with asyncio.timeout(settings.client_timeout):
            return await request.read()
    except TimeoutError:
        raise RequestTimeout(f"The request body did not arrive within {settings.client_timeout:g} s.") from None
    except web.RequestPayloadError:  # its text quotes the client's bytes: not repeated
        raise BadRequest("The request body does not match its Content-Encoding or Transfer-Encoding.",
                         code="invalid_body") from None


def parse_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None


_FLAT = (str, int, float, bool, type(None))


def parse_chat(raw: bytes) -> ChatRequest:
    payload = parse_json(raw)
    if not isinstance(payload, dict):
        raise BadRequest("Request body must be a JSON object.", code="invalid_json")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array of message objects.", param="messages")
    nested: list[Any] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'.", param=f"messages[{i}]")
        # The engine iterates tool calls (to count, summarise and pair them with results): an array, as OpenAI
        # requires, or nothing.
        calls = message.get("tool_calls")
        if calls is not None and type(calls) is not list:
            raise BadRequest(f"messages[{i}].tool_calls must be an array.", param=f"messages[{i}].tool_calls")
        for value in message.values():  # a plain loop: this runs for every message of every request
            if not isinstance(value, _FLAT):
                nested.append(message)
                break
    _check_writable(payload, nested)
    return ChatRequest(raw=raw, payload=payload, messages=messages)


def _check_writable(payload: dict[str, Any], nested: list[Any]) -> None:
    """Refuse what orjson could read but not write, before anything tries to.

    Only the parts that can nest are written: the payload without its messages,
    and the messages that hold anything but scalars, each wrapped as deep as it
    sits in the payload. Flat messages (most of a long history) cost nothing,
    where writing the whole body cost about 0.7 ms per 100k tokens.
    """
    try:
        orjson.dumps({key: value for key, value in payload.items() if key != "messages"})
        for message in nested:
            orjson.dumps({"messages": [message]})
    except orjson.JSONEncodeError as exc:
        raise BadRequest(f"Request body cannot be processed: {exc} (nested too deeply).", code="invalid_json") from None
