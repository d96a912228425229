"""Reading and validating a Chat Completions request body.

The body is read at most once, bounded by ``max_body_bytes`` (aiohttp's
``client_max_size`` refuses more with 413 before reading it whole; a
Content-Length over the limit is refused before reading anything). Parsing is
orjson: invalid UTF-8, bad JSON and nesting deeper than orjson's limit all
become 400s, never 500s.

orjson reads up to 1024 levels of nesting but writes only up to 254, and the
proxy writes what it read (message hashes, the session fingerprint, the log,
the body it forwards). So a chat body is serialised once here: what cannot be
is refused as the client's error, before any of that (about 1 ms per MB).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import BadRequest, PayloadTooLarge
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


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"Request body of {request.content_length} bytes is over the limit of {limit}.")
    return await request.read()


def parse_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None


def parse_chat(raw: bytes) -> ChatRequest:
    payload = parse_json(raw)
    if not isinstance(payload, dict):
        raise BadRequest("Request body must be a JSON object.", code="invalid_json")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array of message objects.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'.", param=f"messages[{i}]")
        # The engine iterates tool calls (to count, summarise and pair them with results): an array, as OpenAI
        # requires, or nothing.
        if not isinstance(message.get("tool_calls"), list | None):
            raise BadRequest(f"messages[{i}].tool_calls must be an array.", param=f"messages[{i}].tool_calls")
    try:
        orjson.dumps(payload)
    except orjson.JSONEncodeError as exc:
        raise BadRequest(f"Request body cannot be processed: {exc} (nested too deeply).", code="invalid_json") from None
    return ChatRequest(raw=raw, payload=payload, messages=messages)
