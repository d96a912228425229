"""OpenAI Chat Completions (``POST /v1/chat/completions``): the dialect the proxy began with.

Identity: clients rarely send a message back exactly as they received it.
openai-python's ``model_dump(exclude_none=True)`` drops ``content: None``; some
SDKs turn a string into a one-part list of text; tool-call arguments get
re-serialised with other spacing; key order changes. The hash sees through all
of that, or every step would look like an edit and the log would fill with
rewinds. What identifies a message: ``role``, ``content``, ``name``,
``tool_call_id``, ``tool_calls`` (id, name, arguments) and the legacy
``function_call``. Fields that clients may drop when echoing
(``reasoning_content``, ``refusal``, ``annotations``, ``audio``…) are kept
verbatim in the log but are not part of the identity. The hash format is
versioned by ``HASH_PREFIX``; changing the normalisation means a new prefix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.context.items import Item, Role
from proxy.dialects.base import Dialect, ReplyReader, Verdict, positive_int, require_items, text_of
from proxy.errors import BadRequest
from proxy.sse import StreamAssembler, is_usage_only, message_from_completion

#: Kept from the first release, so logs written before dialects existed still match.
HASH_PREFIX = b"ctxproxy-msg-v1\x00"
_TEXT = frozenset({"text"})
_ROLES: dict[str, Role] = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
                           "tool": "tool", "function": "tool"}


def canonical_arguments(arguments: Any) -> Any:
    """Arguments as parsed JSON, so spacing and key order do not matter; as text when they do not parse.

    orjson reads 1024 levels of nesting but writes 254: arguments nested deeper
    than that stay text, or hashing them would fail.
    """
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
            orjson.dumps(parsed)
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
    arguments = canonical_arguments(function.get("arguments"))
    return {"id": call.get("id"), "name": function.get("name"), "arguments": arguments}


def normalise(message: Item) -> dict[str, Any]:
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


class ChatDialect(Dialect):
    name = "chat"
    items_field = "messages"
    path = "/chat/completions"

    def items_of(self, payload: dict[str, Any]) -> list[Item]:
        messages = require_items(payload, "messages")
        for i, message in enumerate(messages):
            if not isinstance(message.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string 'role'.", param=f"messages[{i}]")
            # The engine iterates tool calls (to count, summarise and pair them): an array, as OpenAI requires.
            calls = message.get("tool_calls")
            if calls is not None and type(calls) is not list:
                raise BadRequest(f"messages[{i}].tool_calls must be an array.", param=f"messages[{i}].tool_calls")
        return messages

    def role(self, item: Item) -> Role:
        return _ROLES.get(item.get("role"), "other")  # type: ignore[arg-type]

    def calls(self, item: Item) -> tuple[str, ...]:
        calls = item.get("tool_calls")
        if not isinstance(calls, list):
            return ()
        return tuple(call["id"] for call in calls if isinstance(call, dict) and isinstance(call.get("id"), str))

    def results(self, item: Item) -> tuple[str, ...]:
        call_id = item.get("tool_call_id")
        return (call_id,) if item.get("role") == "tool" and isinstance(call_id, str) else ()

    def identity(self, item: Item) -> Any:
        return normalise(item)

    def hash(self, item: Item) -> str:
        role, content = item.get("role"), item.get("content")
        # Fast path for the common shape ({role, content: str}): no intermediate dict.
        if isinstance(content, str) and isinstance(role, str) and len(item) == 2:
            payload = orjson.dumps({"content": content.strip(), "role": role}, option=orjson.OPT_SORT_KEYS)
        else:
            payload = orjson.dumps(normalise(item), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
        return hashlib.blake2b(HASH_PREFIX + payload, digest_size=16).hexdigest()

    def text(self, item: Item) -> tuple[str, int]:
        texts, non_text = text_of(item.get("content"), _TEXT)
        reasoning = item.get("reasoning_content")
        if isinstance(reasoning, str):
            texts.append(reasoning)
        calls = item.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    texts.extend(str(function.get(key) or "") for key in ("name", "arguments"))
                else:
                    texts.append(orjson.dumps(call).decode())
        for field in ("name", "tool_call_id"):
            value = item.get(field)
            if isinstance(value, str):
                texts.append(value)
        return "\n".join(texts), non_text

    def with_summary(self, item: Item | None, text: str) -> Item:
        if item is None:
            return {"role": "user", "content": text}
        content = item.get("content")
        if isinstance(content, list):
            return {**item, "content": [{"type": "text", "text": text}, *content]}
        return {**item, "content": f"{text}\n\n{content}" if isinstance(content, str) and content else text}

    def max_output(self, payload: Mapping[str, Any]) -> int | None:
        return positive_int(payload, "max_completion_tokens", "max_tokens")

    def reply_from_body(self, body: Mapping[str, Any]) -> tuple[list[Item], dict[str, Any] | None, bool]:
        message, usage = message_from_completion(body)
        return ([message] if message is not None else []), usage, True

    def reader(self, *, hide_usage: bool = False) -> ReplyReader:
        return ChatReader(hide_usage)

    def prompt_tokens(self, usage: Mapping[str, Any]) -> int | None:
        value = usage.get("prompt_tokens")
        return value if isinstance(value, int) else None

    def cached_tokens(self, usage: Mapping[str, Any]) -> int | None:
        details = usage.get("prompt_tokens_details")
        value = details.get("cached_tokens") if isinstance(details, Mapping) else None
        return value if isinstance(value, int) else None

    def summary_payload(self, model: str, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        field = "max_completion_tokens" if uses_completion_tokens(model) else "max_tokens"
        return {"model": model, "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                field: max_tokens}

    def summary_answer(self, body: Mapping[str, Any]) -> tuple[str, bool]:
        try:
            choice = body["choices"][0]
            content = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ValueError("the summary answer has no choices[0].message.content") from None
        if not isinstance(content, str):
            raise ValueError("the summary answer's content is not text")
        return content, choice.get("finish_reason") == "stop"


def uses_completion_tokens(model: str) -> bool:
    """OpenAI's reasoning families take ``max_completion_tokens`` and refuse ``max_tokens``."""
    name = model.rsplit("/", 1)[-1].lower()
    return name.startswith(("o1", "o3", "o4", "gpt-5"))


class ChatReader(ReplyReader):
    """Assembles choice 0 from ``chat.completion.chunk`` events; ``[DONE]`` is the terminal event."""

    def __init__(self, hide_usage: bool) -> None:
        self.hide_usage = hide_usage
        self.assembler = StreamAssembler()

    def feed(self, event: str, data: Any) -> Verdict:
        if data == "[DONE]":
            return Verdict.TERMINAL
        if not isinstance(data, Mapping):
            return Verdict.RELAY
        self.received = self.received or bool(data.get("choices"))
        self.assembler.feed(data)
        self.usage, self.finished = self.assembler.usage, self.assembler.finished
        return Verdict.HIDE if self.hide_usage and is_usage_only(data) else Verdict.RELAY

    def items(self) -> list[Item]:
        return [self.assembler.message()] if self.received else []


DIALECT = ChatDialect()
