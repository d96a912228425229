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
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from proxy.context.items import Item, Path, Role
from proxy.context.view.projection import FrozenEnds
from proxy.dialects.base import (
    Dialect,
    ParsedRequest,
    Problem,
    ReplyReader,
    Verdict,
    positive_int,
    require_items,
    role_problem,
    text_of,
)
from proxy.dialects.breakpoints import with_openai_breakpoint
from proxy.sse import StreamAssembler, is_usage_only, message_from_completion

#: Finish reasons of an answer that ended on its own: OpenAI's, and Anthropic's for its compatible endpoints.
NORMAL_FINISH = frozenset({"stop", "end_turn"})
_REASONING_MODEL = re.compile(r"(o[1-9]|gpt-5)([-.:_]|$)")
#: Kept from the first release, so logs written before dialects existed still match.
HASH_PREFIX = b"ctxproxy-msg-v1\x00"
_TEXT = frozenset({"text"})
#: Reasoning some providers return beside the content; clients may or may not echo it back.
REASONING_FIELDS = ("reasoning_content", "reasoning")
#: Longest ``prompt_cache_key`` OpenAI takes.
PROMPT_CACHE_KEY_CHARS = 64
_ROLES: dict[str, Role] = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
                           "tool": "tool", "function": "tool"}


def canonical_arguments(arguments: Any) -> Any:
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
    door = "/v1/chat/completions"
    bound_fields = ("max_completion_tokens", "max_tokens")
    summary_drops = frozenset({"n", "stop", "response_format", "logprobs", "top_logprobs", "prediction", "audio",
                               "modalities", "web_search_options"})
    #: The system prompt is a message; besides the tools, the model reads the deprecated ``functions`` and a
    #: structured answer's schema (``response_format``).
    fixed_fields = ("functions", "response_format")

    def items_of(self, payload: dict[str, Any]) -> list[Item]:
        return require_items(payload, "messages")

    def item_problem(self, item: Item) -> Problem | None:
        # The engine iterates tool calls (to count, summarise and pair them): an array, as OpenAI requires.
        calls = item.get("tool_calls")
        if calls is not None and type(calls) is not list:
            return role_problem(item) or (".tool_calls", "must be an array.")
        return role_problem(item)

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
        calls = item.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    texts.extend(str(function.get(key) or "") for key in ("name", "arguments"))
                else:
                    texts.append(orjson.dumps(call).decode())
        for field in ("name", "tool_call_id", *REASONING_FIELDS):
            value = item.get(field)
            if isinstance(value, str):
                texts.append(value)
        return "\n".join(texts), non_text

    def transcript(self, item: Item, clip: Callable[[str], str]) -> str:
        """Content (a tool result's clipped), then each call as ``-> call name arguments (id …)``."""
        content = item.get("content")
        if isinstance(content, list):
            text = "\n".join(p["text"] if isinstance(p, dict) and isinstance(p.get("text"), str) else "[non-text part]"
                             for p in content)
        else:
            text = content if isinstance(content, str) else ""
        lines = [clip(text) if self.role(item) == "tool" else text] if text else []
        for call in item.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                lines.append(f"-> call {orjson.dumps(call).decode()}")
                continue
            lines.append(f"-> call {function.get('name')} {clip(str(function.get('arguments') or ''))} "
                         f"(id {call.get('id')})")
        return "\n".join(lines)

    def count_key(self, item: Item, digest: str) -> str:
        """The hash leaves reasoning out (clients drop it when echoing); the count must not."""
        if "reasoning_content" in item or "reasoning" in item:
            return f"{digest}+r{sum(len(str(item.get(f) or '')) for f in REASONING_FIELDS)}"
        return digest

    def with_summary(self, item: Item | None, text: str) -> Item:
        if item is None:
            return {"role": "user", "content": text}
        content = item.get("content")
        if isinstance(content, list):
            return {**item, "content": [{"type": "text", "text": text}, *content]}
        return {**item, "content": text + content if isinstance(content, str) else text}

    def system_with_summary(self, item: Item | None, text: str) -> Item | None:
        if item is None:
            return {"role": "system", "content": text}
        content = item.get("content")
        if isinstance(content, list):
            return {**item, "content": [*content, {"type": "text", "text": text}]}
        prior = content if isinstance(content, str) else ""
        return {**item, "content": f"{prior}\n\n{text}" if prior else text}

    def result_paths(self, item: Item) -> list[Path]:
        return [("content",)] if item.get("role") in ("tool", "function") and "content" in item else []

    def call_of(self, item: Item, call_id: str) -> tuple[str, Any] | None:
        for call in item.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and call.get("id") == call_id:
                return str(function.get("name") or "?"), function.get("arguments")
        return None

    def user_text(self, item: Item) -> str | None:
        """The content's text: a user message's ``name`` is not something the user wrote."""
        if self.role(item) != "user":
            return None
        return "\n".join(text_of(item.get("content"), _TEXT)[0])

    def max_output(self, payload: Mapping[str, Any]) -> int | None:
        return positive_int(payload, "max_completion_tokens", "max_tokens")

    def usage_request(self, request: ParsedRequest) -> dict[str, Any] | None:
        """Usage in a stream comes only with ``stream_options.include_usage``: asked for on the client's behalf."""
        options = request.payload.get("stream_options")
        if not request.stream or (isinstance(options, dict) and options.get("include_usage") is True):
            return None
        return {"stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}

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

    def output_tokens(self, usage: Mapping[str, Any]) -> int | None:
        value = usage.get("completion_tokens")
        return value if isinstance(value, int) else None

    def cache_fields(self, payload: Mapping[str, Any], session: str) -> dict[str, Any]:
        return {} if "prompt_cache_key" in payload else {"prompt_cache_key": prompt_cache_key(session)}

    def cache_hints(self, payload: Mapping[str, Any], items: list[Item], frozen: FrozenEnds, *,
                    adds_fields: bool) -> list[Item]:
        """OpenAI's ``prompt_cache_breakpoint`` at the end of the summary item, on the models that take it
        (``proxy.dialects.breakpoints``)."""
        return with_openai_breakpoint(payload, items, frozen, "text", adds_fields=adds_fields)

    def tool_definition(self, name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}

    def reply_calls(self, items: Sequence[Item]) -> tuple[list[tuple[str, str, Any]], bool]:
        calls, text = [], False
        for item in items:
            text = text or bool(item.get("content")) or bool(item.get("refusal"))
            for call in item.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                function = function if isinstance(function, dict) else {}
                calls.append((str(call.get("id")), str(function.get("name")), function.get("arguments")))
        return calls, text

    def tool_result(self, call_id: str, text: str) -> Item:
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    def may_call_only(self, data: Any, name: str) -> bool:
        choices = data.get("choices") if isinstance(data, Mapping) else None
        delta = choices[0].get("delta") if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
            else None
        if not isinstance(delta, Mapping):
            return True  # the usage chunk, [DONE]: nothing said
        if delta.get("content") or delta.get("refusal"):
            return False
        for call in delta.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            called = function.get("name") if isinstance(function, dict) else None
            if called is not None and called != name:
                return False
        return True

    def summary_payload(self, model: str, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        field = output_bound_field(model)
        return {"model": model, "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                field: max_tokens}

    def summary_fields(self, payload: Mapping[str, Any], model: str, bound: int) -> dict[str, Any]:
        """The client's bound field; for a ``--summary-model`` other than the client's, the one of that model's
        family (``output_bound_field``), as the client's choice was made for its own model."""
        fields = super().summary_fields(payload, model, bound)
        if fields and model != payload.get("model"):
            return {output_bound_field(model): bound}
        return fields

    def summary_answer(self, body: Mapping[str, Any]) -> tuple[str, bool, str]:
        try:
            choice = body["choices"][0]
            content = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ValueError("the summary answer has no choices[0].message.content") from None
        if not isinstance(content, str):
            raise ValueError("the summary answer's content is not text")
        reason = choice.get("finish_reason")
        return content, reason in NORMAL_FINISH, str(reason) if reason else "missing"


def prompt_cache_key(session: str) -> str:
    """The session as OpenAI's ``prompt_cache_key``, which takes at most 64 characters: a longer one is hashed."""
    if len(session) <= PROMPT_CACHE_KEY_CHARS:
        return session
    return "ctxproxy-" + hashlib.blake2b(session.encode(), digest_size=16).hexdigest()


def output_bound_field(model: str) -> str:
    """The field that bounds the answer of ``model`` (named with or without a provider prefix): OpenAI's
    reasoning models (o1, o3, o4, gpt-5…) refuse ``max_tokens`` and take ``max_completion_tokens``; every other
    model is sent ``max_tokens``, the field OpenAI-compatible servers share."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    return "max_completion_tokens" if _REASONING_MODEL.match(name) else "max_tokens"


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

    def body(self) -> dict[str, Any]:
        choice = {"index": 0, "message": self.assembler.message(), "finish_reason": self.assembler.finish_reason}
        return {"choices": [choice] if self.received else [], "usage": self.usage}


DIALECT = ChatDialect()
#: The chat dialect's item hash, by the name the engine's callers and tests have always used.
message_hash = DIALECT.hash
