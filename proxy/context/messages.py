"""Message identity: the normalised form and hash that recognise a message the client echoes back.

Clients rarely send back a message exactly as they received it: openai-python's
``model_dump(exclude_none=True)`` drops ``content: None``; some SDKs turn a
string into a one-part list of text; tool-call arguments get re-serialised with
other spacing; key order changes. The hash must see through all of that, or
every step would look like an edit and the log would fill with rewinds.

What identifies a message: ``role``, ``content``, ``name``, ``tool_call_id``,
``tool_calls`` (id, name, arguments) and the legacy ``function_call``. Fields
that clients may drop when echoing (``reasoning_content``, ``refusal``,
``annotations``, ``audio``…) are kept verbatim in the log but are not part of
the identity. The hash format is versioned by ``HASH_PREFIX``; changing the
normalisation means a new prefix, never a silent change.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from proxy.types import Message

HASH_PREFIX = b"ctxproxy-msg-v1\x00"


def _canonical_arguments(arguments: Any) -> Any:
    """Arguments as parsed JSON, so spacing and key order do not matter; as text when they do not parse.

    orjson reads 1024 levels of nesting but writes 254, and the parsed
    arguments are written three levels down (``{"tool_calls": [{"arguments":
    …}]}``): arguments that could not be written there stay text, or hashing
    them would fail. They are only a string to the API, so that is no reason to
    refuse them (the upstream itself may have written them).
    """
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
            orjson.dumps([[[parsed]]])  # as deep as ``normalise`` places them
        except (orjson.JSONDecodeError, orjson.JSONEncodeError):
            return arguments.strip()
        return parsed
    return arguments


def _normalise_content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        if len(content) == 1 and isinstance(content[0], dict) and content[0].get("type", "text") == "text":
            text = content[0].get("text")
            if isinstance(text, str):
                return text.strip()
        if not content:
            return ""
    return content


def _normalise_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    function = call.get("function") or {}
    if not isinstance(function, dict):
        return call
    return {
        "id": call.get("id"),
        "name": function.get("name"),
        "arguments": _canonical_arguments(function.get("arguments")),
    }


def normalise(message: Message) -> dict[str, Any]:
    """The identity-bearing part of a message, in a form that survives client round trips."""
    out: dict[str, Any] = {"role": message.get("role"), "content": _normalise_content(message.get("content"))}
    for field in ("name", "tool_call_id"):
        value = message.get(field)
        if value:
            out[field] = value
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_normalise_call(c) for c in calls] if isinstance(calls, list) else calls
    legacy = message.get("function_call")
    if legacy:
        out["function_call"] = _normalise_call({"function": legacy})
    return out


def message_hash(message: Message) -> str:
    """A 32-hex-digit digest of ``normalise(message)`` as canonical JSON."""
    role = message.get("role")
    content = message.get("content")
    # Fast path for the common shape ({role, content: str}): no intermediate dict.
    if isinstance(content, str) and isinstance(role, str) and len(message) == 2:
        payload = orjson.dumps({"content": content.strip(), "role": role}, option=orjson.OPT_SORT_KEYS)
    else:
        payload = orjson.dumps(normalise(message), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.blake2b(HASH_PREFIX + payload, digest_size=16).hexdigest()


def chain_hash(previous: str, message_digest: str) -> str:
    """Rolling hash of a conversation prefix: proves which prefix a checkpoint covers."""
    return hashlib.blake2b((previous + message_digest).encode(), digest_size=16).hexdigest()


def text_length(message: Message) -> int:
    """Characters of everything the model may read in a message (content, tool calls, names, reasoning)."""
    total = 0
    content = message.get("content")
    if isinstance(content, str):
        total += len(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                total += len(text) if isinstance(text, str) else len(orjson.dumps(part))
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        total += len(orjson.dumps(calls))
    for field in ("name", "tool_call_id", "reasoning_content", "reasoning"):
        value = message.get(field)
        if isinstance(value, str):
            total += len(value)
    return total
