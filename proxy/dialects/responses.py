"""The OpenAI Responses API (``POST /v1/responses``), as Codex speaks it.

Items are flat: messages (``developer``/``user``/``assistant``), ``reasoning``
(with ``encrypted_content``), ``function_call`` / ``function_call_output``
paired by ``call_id`` (and the ``custom_tool_call``, ``local_shell_call``,
``computer_call`` families), ``compaction`` items and others. Two rules the
API enforces shape the engine's answers: a reasoning item is rejected without
the item that followed it (``travels_with_next``), and every output needs its
call. The stream has no ``[DONE]``: ``response.completed`` (or ``incomplete`` /
``failed``) is the last word, held back until the reply is logged.

A request that asks the upstream to manage its context itself
(``context_management: [{"type": "compaction", …}]``, or ``truncation: "auto"``)
goes as the client sent it (``upstream_manages``). The ``compaction`` item such
an upstream returns is opaque and stands for everything before it: like a
reasoning item, it travels with the item that follows it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.context.items import Item, Path, Role
from proxy.context.view.projection import FrozenEnds
from proxy.dialects.base import (
    Dialect,
    ReplyReader,
    Verdict,
    positive_int,
    require_items,
    text_of,
)
from proxy.dialects.breakpoints import with_openai_breakpoint
from proxy.dialects.chat import canonical_arguments, prompt_cache_key

CALL_TYPES = frozenset({"function_call", "custom_tool_call", "local_shell_call", "computer_call"})
OUTPUT_TYPES = frozenset(
    {"function_call_output", "custom_tool_call_output", "local_shell_call_output", "computer_call_output"}
)
TEXT_TYPES = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
#: Events sent before the model produced anything: held back, so an overflow that follows can be retried unseen.
PREAMBLE_EVENTS = frozenset({"response.created", "response.in_progress", "response.queued"})
#: Fields that differ between the item the upstream sent and the one the client echoes, without meaning.
_VOLATILE = frozenset({"id", "status"})


def _type(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    if isinstance(kind, str):
        return kind
    return "message" if "role" in item else ""


def _parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content.strip()}]
    if not isinstance(content, list):
        return []
    out: list[Any] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in TEXT_TYPES and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"].strip()})
        else:
            out.append(part)
    return out


class ResponsesDialect(Dialect):
    name = "responses"
    items_field = "input"
    path = "/responses"
    door = "/v1/responses"
    carries_compaction_items = True
    bound_fields = ("max_output_tokens",)
    #: Besides the answer's form: ``previous_response_id`` and ``conversation`` would add the summary call to the
    #: history kept upstream, and a ``background`` response is polled for, not answered.
    summary_drops = frozenset({"previous_response_id", "conversation", "background", "top_logprobs"})
    #: ``instructions`` (Codex's and pi's system prompt), a structured answer's schema (``text.format``) and a
    #: stored ``prompt``'s variables (its template, stored upstream, only the usage figure counts).
    fixed_fields = ("instructions", "text", "prompt")

    def items_of(self, payload: dict[str, Any]) -> list[Item]:
        return require_items(payload, "input", allow_string=True)

    def role(self, item: Item) -> Role:
        kind = _type(item)
        if kind == "message":
            role = item.get("role")
            if role in ("system", "developer"):
                return "system"
            return "user" if role == "user" else "assistant"
        if kind in OUTPUT_TYPES:
            return "tool"
        if kind == "reasoning" or kind in CALL_TYPES or kind.endswith("_call"):
            return "assistant"
        return "other"

    def calls(self, item: Item) -> tuple[str, ...]:
        call_id = item.get("call_id")
        return (call_id,) if _type(item) in CALL_TYPES and isinstance(call_id, str) else ()

    def results(self, item: Item) -> tuple[str, ...]:
        call_id = item.get("call_id")
        return (call_id,) if _type(item) in OUTPUT_TYPES and isinstance(call_id, str) else ()

    def travels_with_next(self, item: Item) -> bool:
        return _type(item) in ("reasoning", "compaction")

    def identity(self, item: Item) -> Any:
        kind = _type(item)
        if kind == "message":
            return {"type": kind, "role": item.get("role"), "content": _parts(item.get("content"))}
        if kind == "function_call":
            return {"type": kind, "call_id": item.get("call_id"), "name": item.get("name"),
                    "arguments": canonical_arguments(item.get("arguments"))}
        if kind == "reasoning" and item.get("encrypted_content"):
            return {"type": kind, "encrypted_content": item.get("encrypted_content")}
        out = {key: value for key, value in item.items() if key not in _VOLATILE and value is not None}
        output = out.get("output")
        if isinstance(output, str):
            out["output"] = output.strip()
        out["type"] = kind
        return out

    def text(self, item: Item) -> tuple[str, int]:
        kind = _type(item)
        if kind == "message":
            texts, non_text = text_of(item.get("content"), TEXT_TYPES)
        elif kind == "reasoning":
            texts, non_text = text_of(item.get("summary"), TEXT_TYPES)
        elif kind in OUTPUT_TYPES:
            texts, non_text = text_of(item.get("output"), TEXT_TYPES)
        else:
            texts = [str(item.get(key)) for key in ("name", "arguments", "input", "action") if item.get(key)]
            non_text = 0
        return "\n".join(texts), non_text

    def with_summary(self, item: Item | None, text: str) -> Item:
        part = {"type": "input_text", "text": text}
        if item is None:
            return {"type": "message", "role": "user", "content": [part]}
        content = item.get("content")
        if isinstance(content, str):
            return {**item, "content": [part, {"type": "input_text", "text": content}]}
        return {**item, "content": [part, *(content if isinstance(content, list) else [])]}

    def result_paths(self, item: Item) -> list[Path]:
        return [("output",)] if _type(item) in OUTPUT_TYPES and "output" in item else []

    def with_output(self, item: Item, path: Path, text: str) -> Item | None:
        """A computer call's output is a screenshot object, which takes no text in its place."""
        return None if _type(item) == "computer_call_output" else {**item, "output": text}

    def call_of(self, item: Item, call_id: str) -> tuple[str, Any] | None:
        kind = _type(item)
        if kind not in CALL_TYPES or item.get("call_id") != call_id:
            return None
        if kind == "function_call":
            return str(item.get("name") or "?"), item.get("arguments")
        if kind == "custom_tool_call":
            return str(item.get("name") or "?"), item.get("input")
        return kind.removesuffix("_call"), item.get("action")

    def max_output(self, payload: Mapping[str, Any]) -> int | None:
        return positive_int(payload, "max_output_tokens")

    def reply_from_body(self, body: Mapping[str, Any]) -> tuple[list[Item], dict[str, Any] | None, bool]:
        output = body.get("output")
        items = [item for item in output if isinstance(item, dict)] if isinstance(output, list) else []
        usage = body.get("usage")
        return items, usage if isinstance(usage, dict) else None, body.get("status") == "completed"

    def reader(self, *, hide_usage: bool = False) -> ReplyReader:
        return ResponsesReader()

    def reply_id(self, body: Mapping[str, Any]) -> str | None:
        value = body.get("id")
        return value if isinstance(value, str) else None

    def prompt_tokens(self, usage: Mapping[str, Any]) -> int | None:
        value = usage.get("input_tokens")
        return value if isinstance(value, int) else None

    def cached_tokens(self, usage: Mapping[str, Any]) -> int | None:
        details = usage.get("input_tokens_details")
        value = details.get("cached_tokens") if isinstance(details, Mapping) else None
        return value if isinstance(value, int) else None

    def output_tokens(self, usage: Mapping[str, Any]) -> int | None:
        value = usage.get("output_tokens")
        return value if isinstance(value, int) else None

    def summary_payload(self, model: str, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        return {"model": model, "instructions": system, "store": False, "stream": False,
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": user}]}],
                "max_output_tokens": max_tokens}

    def summary_fields(self, payload: Mapping[str, Any], model: str, bound: int) -> dict[str, Any]:
        """Also ``text`` without a ``format`` (a JSON schema would shape the summary), its ``verbosity`` kept, and
        ``context_management`` without its compaction: the transcript is what the summary is made of."""
        fields = super().summary_fields(payload, model, bound)
        text = payload.get("text")
        if isinstance(text, Mapping) and "format" in text:
            fields["text"] = {key: value for key, value in text.items() if key != "format"}
        management = payload.get("context_management")
        if isinstance(management, list):
            fields["context_management"] = [entry for entry in management
                                            if not (isinstance(entry, Mapping) and entry.get("type") == "compaction")]
        return fields

    def summary_answer(self, body: Mapping[str, Any]) -> tuple[str, bool, str]:
        items, _, finished = self.reply_from_body(body)
        texts = [text for item in items if _type(item) == "message" for text in text_of(
            item.get("content"), frozenset({"output_text", "text"}))[0]]
        if not texts:
            raise ValueError("the summary answer holds no output text")
        return "".join(texts), finished, str(body.get("status") or "missing")

    def cache_fields(self, payload: Mapping[str, Any], session: str) -> dict[str, Any]:
        return {} if "prompt_cache_key" in payload else {"prompt_cache_key": prompt_cache_key(session)}

    def cache_hints(self, payload: Mapping[str, Any], items: list[Item], frozen: FrozenEnds, *,
                    adds_fields: bool) -> list[Item]:
        """OpenAI's ``prompt_cache_breakpoint`` at the end of the summary item, on the models that take it
        (``proxy.dialects.breakpoints``)."""
        return with_openai_breakpoint(payload, items, frozen, "input_text", adds_fields=adds_fields)

    def tool_definition(self, name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "name": name, "description": description, "parameters": parameters,
                "strict": False}

    def reply_calls(self, items: Sequence[Item]) -> tuple[list[tuple[str, str, Any]], bool]:
        calls, text = [], False
        for item in items:
            kind = _type(item)
            if kind == "message":
                text = text or any(text_of(item.get("content"), TEXT_TYPES)[0])
            elif kind == "function_call":
                calls.append((str(item.get("call_id")), str(item.get("name")), item.get("arguments")))
            elif kind in CALL_TYPES or kind.endswith("_call"):
                calls.append((str(item.get("call_id")), kind, item.get("action", item.get("input"))))
        return calls, text

    def tool_result(self, call_id: str, text: str) -> Item:
        return {"type": "function_call_output", "call_id": call_id, "output": text}

    def may_call_only(self, data: Any, name: str) -> bool:
        kind = data.get("type") if isinstance(data, Mapping) else None
        if kind == "response.output_item.added":
            item = data.get("item")
            item = item if isinstance(item, Mapping) else {}
            return item.get("type") == "reasoning" or (item.get("type") == "function_call" and item.get("name") == name)
        return kind not in ("response.output_text.delta", "response.refusal.delta")

    def upstream_manages(self, payload: Mapping[str, Any]) -> bool:
        management = payload.get("context_management")
        compacts = isinstance(management, list) and any(
            isinstance(entry, Mapping) and entry.get("type") == "compaction" for entry in management)
        return compacts or payload.get("truncation") == "auto"

    def session_hint(self, payload: Mapping[str, Any]) -> str | None:
        """Codex sets ``prompt_cache_key`` to its conversation id."""
        key = payload.get("prompt_cache_key")
        return key if isinstance(key, str) else None

    def commits(self, data: Any) -> bool:
        kind = data.get("type") if isinstance(data, Mapping) else None
        return kind not in PREAMBLE_EVENTS and kind not in ("error", "response.failed")

    def refusal_of(self, data: Any) -> Any:
        """``response.failed`` carries its error one level down; every other event is classified as it is."""
        if isinstance(data, Mapping) and data.get("type") == "response.failed":
            return data.get("response")
        return data


class ResponsesReader(ReplyReader):
    """Collects the final form of each output item (``response.output_item.done``) and the usage."""

    def __init__(self) -> None:
        self._items: dict[int, Item] = {}
        self._final: list[Item] | None = None
        self._status: Any = None

    def feed(self, event: str, data: Any) -> Verdict:
        if not isinstance(data, Mapping):
            return Verdict.RELAY
        kind = data.get("type")
        if kind == "response.output_item.done":
            item, index = data.get("item"), data.get("output_index")
            if isinstance(item, dict):
                self._items[index if isinstance(index, int) else len(self._items)] = item
                self.received = True
        elif kind in TERMINAL_EVENTS:
            response = data.get("response")
            if isinstance(response, Mapping):
                self.reply_id = DIALECT.reply_id(response)
                items, usage, finished = DIALECT.reply_from_body(response)
                self._final, self.usage, self.finished, self._status = items, usage, finished, response.get("status")
                self.received = self.received or bool(items)
            return Verdict.TERMINAL
        return Verdict.RELAY

    def items(self) -> list[Item]:
        if self._items:
            return [self._items[index] for index in sorted(self._items)]
        return list(self._final or [])

    def body(self) -> dict[str, Any]:
        return {"status": self._status, "output": self.items(), "usage": self.usage}


DIALECT = ResponsesDialect()
