"""Anthropic Messages (``POST /v1/messages``), as Claude Code speaks it.

Items are messages whose content is a string or a list of blocks: ``text``,
``image``, ``thinking`` (with its ``signature``) / ``redacted_thinking``,
``tool_use`` in assistant turns, ``tool_result`` in user turns, paired by
``tool_use_id``. A user message carrying tool results continues the turn
(role ``tool`` to the engine); only a user message without them opens one.
``system`` is a request field the proxy never touches, but Claude Code also
puts role ``"system"`` entries between turns (e.g. "Today's date is …"): they
stay where they are and open no turn. Thinking blocks ride inside their
message, so they are never separated from their tool use, and the kept tail is
byte-identical, signatures included.

Identity ignores ``cache_control``: Claude Code moves its breakpoints forward
every turn, and a moved breakpoint is not an edit. The proxy adds its own at the
view's frozen ends where the request leaves room (``proxy.dialects.breakpoints``).

The API's own context management (``context_management.edits``, beta
``context-management-2025-06-27`` and ``compact-2026-01-12``): a request whose
edits compact (``compact_20260112``) or clear tool uses
(``clear_tool_uses_20250919``) goes as the client sent it (``upstream_manages``);
``clear_thinking_20251015`` alone (Claude Code sends it on every request) asks
for neither. A ``compaction`` block the API returns (streamed as
``compaction_delta``) stands for everything before it: its message travels with
the one that follows, and its summary text is what the proxy's summariser reads
of it. ``context_management.applied_edits`` and ``usage.iterations`` are in the
answer, which is relayed unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

import orjson

from proxy.context.items import Answer, Item, Path, Role, get_path
from proxy.context.view.projection import FrozenEnds
from proxy.dialects.base import (
    Dialect,
    Problem,
    ReplyReader,
    Verdict,
    positive_int,
    require_items,
    role_problem,
    text_of,
)
from proxy.dialects.breakpoints import caches_tail, with_breakpoints

_TEXT = frozenset({"text"})
#: Events before any content block: held back, so an error that follows can be retried unseen.
PREAMBLE_EVENTS = frozenset({"message_start", "ping"})
FINISHED = frozenset({"end_turn", "stop_sequence"})
#: ``context_management`` edits that make the upstream rewrite the conversation (``compact_20260112``,
#: ``clear_tool_uses_20250919`` and their later versions); ``clear_thinking_…`` only drops old thinking.
UPSTREAM_EDITS = ("compact_", "clear_tool_uses_")


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content.strip()}]
    return [_block(block) for block in content] if isinstance(content, list) else []


def _block(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    out = {key: value for key, value in block.items() if key != "cache_control" and value is not None}
    if out.get("type") == "text" and isinstance(out.get("text"), str):
        out["text"] = out["text"].strip()
    if out.get("type") == "tool_result" and "content" in out:
        out["content"] = _blocks(out["content"])
    return out


def _has(item: Item, block_type: str) -> list[Mapping[str, Any]]:
    content = item.get("content")
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict) and block.get("type") == block_type]


def _rewrites(edit: Any) -> bool:
    """Whether a ``context_management`` edit makes the upstream compact or clear the conversation."""
    return isinstance(edit, Mapping) and isinstance(edit.get("type"), str) and edit["type"].startswith(UPSTREAM_EDITS)


#: Anthropic's error ``type`` for a status (https://docs.claude.com/en/api/errors); other 4xx are
#: ``invalid_request_error``, other 5xx ``api_error``.
_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                413: "request_too_large", 429: "rate_limit_error"}


class MessagesDialect(Dialect):
    name = "messages"
    items_field = "messages"
    path = "/v1/messages"
    door = "/v1/messages"
    anthropic = True
    required_headers: ClassVar[Mapping[str, str]] = MappingProxyType({"anthropic-version": "2023-06-01"})
    bound_fields = ("max_tokens",)
    summary_drops = frozenset({"stop_sequences", "output_format"})
    #: ``system`` (a string or blocks), and a structured answer's schema (``output_config.format``, the beta's
    #: ``output_format``).
    fixed_fields = ("system", "output_config", "output_format")

    def items_of(self, payload: dict[str, Any]) -> list[Item]:
        return require_items(payload, "messages")

    def item_problem(self, item: Item) -> Problem | None:
        content = item.get("content")
        if content is not None and not isinstance(content, str | list):
            return role_problem(item) or (".content", "must be a string or an array.")
        return role_problem(item)

    def error_body(self, status: int, message: str, *, type: str, code: str | None,
                   param: str | None) -> dict[str, Any]:
        # Anthropic's shape, with its error types: its SDKs and Claude Code read ``error.type`` and ``error.message``.
        kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def role(self, item: Item) -> Role:
        role = item.get("role")
        if role == "user":
            return "tool" if _has(item, "tool_result") else "user"
        if role == "assistant":
            return "assistant"
        return "system" if role == "system" else "other"

    def calls(self, item: Item) -> tuple[str, ...]:
        if item.get("role") != "assistant":
            return ()
        return tuple(b["id"] for b in _has(item, "tool_use") if isinstance(b.get("id"), str))

    def results(self, item: Item) -> tuple[str, ...]:
        if item.get("role") != "user":
            return ()
        return tuple(b["tool_use_id"] for b in _has(item, "tool_result") if isinstance(b.get("tool_use_id"), str))

    def travels_with_next(self, item: Item) -> bool:
        """An assistant message holding a ``compaction`` block: what follows it was said in the context the block
        stands for, and a tail that kept it without them (or them without it) would be a different conversation."""
        return item.get("role") == "assistant" and bool(_has(item, "compaction"))

    def identity(self, item: Item) -> Any:
        return {"role": item.get("role"), "content": _blocks(item.get("content"))}

    def text(self, item: Item) -> tuple[str, int]:
        content = item.get("content")
        if not isinstance(content, list):
            return (content if isinstance(content, str) else ""), 0
        texts: list[str] = []
        non_text = 0
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" or kind == "thinking":
                texts.append(str(block.get(kind) or ""))
            elif kind == "compaction" and isinstance(block.get("content"), str):
                texts.append(block["content"])  # the upstream's summary of what came before it
            elif kind in ("tool_use", "server_tool_use"):
                texts.append(f"{block.get('name')} {orjson.dumps(block.get('input')).decode()}")
            elif kind == "tool_result":
                inner, inner_non_text = text_of(block.get("content"), _TEXT)
                texts.extend(inner)
                non_text += inner_non_text
            elif kind != "redacted_thinking":
                non_text += 1
        return "\n".join(texts), non_text

    def with_summary(self, item: Item | None, text: str) -> Item:
        block = {"type": "text", "text": text}
        if item is None:
            return {"role": "user", "content": [block]}
        content = item.get("content")
        if isinstance(content, str):
            return {**item, "content": [block, {"type": "text", "text": content}]}
        return {**item, "content": [block, *(content if isinstance(content, list) else [])]}

    def call_of(self, item: Item, call_id: str) -> tuple[str, Any] | None:
        if item.get("role") != "assistant":
            return None
        for block in _has(item, "tool_use"):
            if block.get("id") == call_id:
                return str(block.get("name") or "?"), block.get("input")
        return None

    def user_text(self, item: Item) -> str | None:
        """The text blocks of a user message, also beside tool results (a user who typed while a tool ran);
        the ``tool_result`` blocks themselves are tool output, not user words."""
        if item.get("role") != "user":
            return None
        content = item.get("content")
        if isinstance(content, str):
            return content
        texts = [str(block.get("text") or "") for block in _has(item, "text")]
        return "\n".join(texts) if texts else None

    def result_paths(self, item: Item) -> list[Path]:
        content = item.get("content")
        if item.get("role") != "user" or not isinstance(content, list):
            return []
        return [("content", i, "content") for i, block in enumerate(content)
                if isinstance(block, dict) and block.get("type") == "tool_result" and "content" in block]

    def answers(self, item: Item) -> tuple[Answer, ...]:
        """Each ``tool_result`` block with its ``tool_use_id``: its ``content``, where it has one."""
        content = item.get("content")
        if item.get("role") != "user" or not isinstance(content, list):
            return ()
        return tuple(Answer(block["tool_use_id"], (("content", i, "content"),) if "content" in block else ())
                     for i, block in enumerate(content) if isinstance(block, dict)
                     and block.get("type") == "tool_result" and isinstance(block.get("tool_use_id"), str))

    def result_failed(self, item: Item, path: Path) -> bool:
        """A ``tool_result`` block flagged ``is_error`` (Claude Code sets it on a call that failed or was refused)."""
        block = get_path(item, path[:-1])
        return isinstance(block, dict) and block.get("is_error") is True

    def max_output(self, payload: Mapping[str, Any]) -> int | None:
        return positive_int(payload, "max_tokens")

    def reply_from_body(self, body: Mapping[str, Any]) -> tuple[list[Item], dict[str, Any] | None, bool]:
        content = body.get("content")
        usage = body.get("usage")
        items = [{"role": "assistant", "content": content}] if isinstance(content, list) else []
        return items, usage if isinstance(usage, dict) else None, body.get("stop_reason") is not None

    def reader(self, *, hide_usage: bool = False) -> ReplyReader:
        return MessagesReader()

    def prompt_tokens(self, usage: Mapping[str, Any]) -> int | None:
        parts = [usage.get(key) for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
        numbers = [part for part in parts if isinstance(part, int)]
        return sum(numbers) if numbers else None

    def cached_tokens(self, usage: Mapping[str, Any]) -> int | None:
        value = usage.get("cache_read_input_tokens")
        return value if isinstance(value, int) else None

    def output_tokens(self, usage: Mapping[str, Any]) -> int | None:
        value = usage.get("output_tokens")
        return value if isinstance(value, int) else None

    def session_hint(self, payload: Mapping[str, Any]) -> str | None:
        """Claude Code's ``metadata.user_id`` is a JSON string holding its ``session_id``."""
        metadata = payload.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
        if not isinstance(user_id, str) or not user_id.startswith("{"):
            return None
        try:
            session = orjson.loads(user_id).get("session_id")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return session if isinstance(session, str) else None

    def upstream_manages(self, payload: Mapping[str, Any]) -> bool:
        management = payload.get("context_management")
        edits = management.get("edits") if isinstance(management, Mapping) else None
        return isinstance(edits, list) and any(_rewrites(edit) for edit in edits)

    def caches_tail(self, payload: Mapping[str, Any]) -> bool:
        """Only where the client sets a breakpoint near the end (``proxy.dialects.breakpoints.caches_tail``)."""
        return caches_tail(payload)

    def cache_hints(self, payload: Mapping[str, Any], items: list[Item], frozen: FrozenEnds, *,
                    adds_fields: bool) -> list[Item]:
        """``cache_control`` breakpoints at the view's frozen ends while the request leaves room
        (``proxy.dialects.breakpoints``): the API's own field, sent whatever ``--add-fields`` says."""
        return with_breakpoints(payload, items, frozen)

    def tool_definition(self, name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "description": description, "input_schema": parameters}

    def reply_calls(self, items: Sequence[Item]) -> tuple[list[tuple[str, str, Any]], bool]:
        calls, text = [], False
        for item in items:
            text = text or any(block.get("text") for block in _has(item, "text"))
            calls += [(str(b.get("id")), str(b.get("name")), b.get("input")) for b in _has(item, "tool_use")]
        return calls, text

    def tool_result(self, call_id: str, text: str) -> Item:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}]}

    def may_call_only(self, data: Any, name: str) -> bool:
        kind = data.get("type") if isinstance(data, Mapping) else None
        if kind != "content_block_start":
            return True
        block = data.get("content_block")
        block = block if isinstance(block, Mapping) else {}
        return block.get("type") in ("thinking", "redacted_thinking") or (
            block.get("type") == "tool_use" and block.get("name") == name)

    def commits(self, data: Any) -> bool:
        kind = data.get("type") if isinstance(data, Mapping) else None
        return kind not in PREAMBLE_EVENTS and kind != "error"

    def summary_payload(self, model: str, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        return {"model": model, "system": system, "max_tokens": max_tokens, "stream": False,
                "messages": [{"role": "user", "content": user}]}

    def summary_fields(self, payload: Mapping[str, Any], model: str, bound: int) -> dict[str, Any]:
        """``max_tokens`` always (the API requires it): ``bound``, or the client's own value when its thinking
        budget does not fit under ``bound`` (the API wants ``max_tokens`` above ``budget_tokens``, and the
        client's value is one its upstream takes beside that budget); and the client's ``context_management``
        without the edits that compact or clear."""
        thinking = payload.get("thinking")
        budget = thinking.get("budget_tokens") if isinstance(thinking, Mapping) else None
        client = positive_int(payload, "max_tokens")
        fields: dict[str, Any] = {"max_tokens": client if isinstance(budget, int) and budget >= bound
                                  and client is not None else bound}
        management = payload.get("context_management")
        if self.upstream_manages(payload) and isinstance(management, Mapping):
            # The transcript is what the summary is made of: not compacted or cleared before the model reads it.
            # The other edits stay (clear_thinking goes with the thinking the call keeps).
            fields["context_management"] = {**management, "edits": [
                edit for edit in management["edits"] if not _rewrites(edit)]}
        return fields

    def summary_answer(self, body: Mapping[str, Any]) -> tuple[str, bool, str]:
        content = body.get("content")
        texts = [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
                 and isinstance(b.get("text"), str)] if isinstance(content, list) else []
        if not texts:
            raise ValueError("the summary answer holds no text block")
        reason = body.get("stop_reason")
        return "".join(texts), reason in FINISHED, str(reason) if reason else "missing"


class MessagesReader(ReplyReader):
    """Rebuilds the assistant message from content-block events, as the non-streamed answer would hold it."""

    def __init__(self) -> None:
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._stop_reason: Any = None

    def feed(self, event: str, data: Any) -> Verdict:
        kind = data.get("type") if isinstance(data, Mapping) else None
        if not isinstance(data, Mapping) or not isinstance(kind, str):
            return Verdict.RELAY
        index = data.get("index")
        if kind == "message_start":
            message = data.get("message")
            usage = message.get("usage") if isinstance(message, Mapping) else None
            self.usage = dict(usage) if isinstance(usage, Mapping) else None
        elif kind == "content_block_start" and isinstance(index, int):
            block = data.get("content_block")
            if isinstance(block, Mapping):
                self._blocks[index] = dict(block)
                self.received = True
        elif kind == "content_block_delta" and isinstance(index, int) and index in self._blocks:
            self._delta(index, data.get("delta"))
        elif kind == "message_delta":
            self._message_delta(data)
        elif kind == "message_stop":
            return Verdict.TERMINAL
        return Verdict.RELAY

    def _delta(self, index: int, delta: Any) -> None:
        if not isinstance(delta, Mapping):
            return
        block = self._blocks[index]
        kind = delta.get("type")
        if kind == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json") or ""))
            return
        field = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}.get(str(kind))
        if field is not None:
            block[field] = str(block.get(field) or "") + str(delta.get(field) or "")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "compaction_delta":  # a null part (a compaction that failed) leaves the field as it was
            for name in ("content", "encrypted_content"):
                if isinstance(delta.get(name), str):
                    block[name] = str(block.get(name) or "") + delta[name]

    def _message_delta(self, data: Mapping[str, Any]) -> None:
        delta = data.get("delta")
        if isinstance(delta, Mapping) and delta.get("stop_reason") is not None:
            self.finished, self._stop_reason = True, delta["stop_reason"]
        usage = data.get("usage")
        if isinstance(usage, Mapping):
            self.usage = {**(self.usage or {}), **{k: v for k, v in usage.items() if v is not None}}

    def items(self) -> list[Item]:
        if not self._blocks:
            return []
        blocks = []
        for index in sorted(self._blocks):
            block = dict(self._blocks[index])
            if index in self._json:
                text = "".join(self._json[index])
                try:
                    block["input"] = orjson.loads(text) if text else {}
                except orjson.JSONDecodeError:
                    block["input"] = text  # a cut stream: keep what arrived
            blocks.append(block)
        return [{"role": "assistant", "content": blocks}]

    def body(self) -> dict[str, Any]:
        items = self.items()
        return {"content": items[0]["content"] if items else [], "stop_reason": self._stop_reason,
                "usage": self.usage}


DIALECT = MessagesDialect()
