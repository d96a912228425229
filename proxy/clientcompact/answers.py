"""The answer to a client's own compaction, in the shape that client expects, streamed or not.

- Claude Code reads the assistant text of a Messages API answer: ``<analysis>…</analysis>`` (dropped by the
  client) then ``<summary>…</summary>``, the part it keeps. It cuts the summary at the first ``</summary>``, so
  one inside the summary text is escaped.
- Codex local compaction keeps the last assistant message of a Responses API answer as the summary.
- Codex remote compaction needs exactly one output item ``{"type": "compaction", "encrypted_content": …}``,
  in a streamed Responses answer that ends with ``response.completed`` (a ``compaction_trigger`` turn;
  ``codex-rs/core/src/compact_remote_v2.rs`` counts the ``compaction`` items of ``response.output_item.done``
  events and fails the turn unless there is one), or as ``{"output": [item]}`` for ``POST /responses/compact``
  (``codex-rs/codex-api/src/endpoint/compact.rs`` reads ``output`` alone; the other fields mirror OpenAI's
  compacted response object).

- Gemini CLI keeps the text of its second compression call's answer (the first's if that one is empty) as the
  history's new first user turn: a ``<state_snapshot>`` in the XML sections its prompt asks for, made from the
  summary's sections; both calls get the same one. It reads a ``:generateContent`` answer, which ends with a
  ``finishReason``.

Pure functions: they return the bytes (and content type) to write; ids, time and usage come in an
``Envelope``. Codex parses ``response.completed`` strictly: it needs ``response.id``, and a ``usage`` needs
``input_tokens``, ``output_tokens`` and ``total_tokens`` (``codex-rs/codex-api/src/sse/responses.rs``).
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.clientcompact import texts
from proxy.clientcompact.recognise import CompactionRequest

JSON_TYPE = "application/json"
SSE_TYPE = "text/event-stream"
#: The scratchpad Claude Code asks for and then throws away.
ANALYSIS_NOTE = "This conversation was summarised by ctxproxy from its checkpoint; the summary follows."


@dataclass(frozen=True, slots=True)
class Envelope:
    """What surrounds an answer: the model named, the ids, the time, and the usage reported."""

    model: str
    input_tokens: int
    output_tokens: int
    response_id: str
    item_id: str
    created_at: int

    @classmethod
    def new(cls, model: str, input_tokens: int, output_tokens: int) -> Envelope:
        """Fresh random ids and the current time. ``item_id`` serves as a Messages API answer's message id."""
        return cls(model, input_tokens, output_tokens, response_id=f"resp_{secrets.token_hex(12)}",
                   item_id=f"msg_{secrets.token_hex(12)}", created_at=int(time.time()))


@dataclass(frozen=True, slots=True)
class Answer:
    """What to write to the client, and the reply's items as the client will send them back (for the log)."""

    body: bytes
    content_type: str
    items: list[dict[str, Any]]


def render(request: CompactionRequest, envelope: Envelope, *, stream: bool, summary: str | None = None,
           reference: str | None = None) -> Answer:
    """The whole answer to ``request``: ``summary`` for Claude Code and Codex local, the signed ``reference`` for
    Codex remote. ``stream`` is the request's ``stream`` flag (``/responses/compact`` always answers JSON)."""
    if request.kind in ("gemini_snapshot", "gemini_verify"):
        if summary is None:
            raise ValueError(f"a {request.kind} answer needs the summary")
        text = state_snapshot(summary)
        body = gemini_body(text, envelope)
        reply = [{"role": "model", "parts": [{"text": text}]}]
        if stream:
            return Answer(b"data: " + orjson.dumps(body) + b"\r\n\r\n", SSE_TYPE, reply)
        return Answer(orjson.dumps(body), JSON_TYPE, reply)
    if request.kind in ("claude_code", "codex_local"):
        if summary is None:
            raise ValueError(f"a {request.kind} answer needs the summary")
        if request.kind == "claude_code":
            text = claude_code_text(summary, analysis=request.analysis)
            reply = [{"role": "assistant", "content": [{"type": "text", "text": text}]}]
            if stream:
                return Answer(messages_stream(text, envelope), SSE_TYPE, reply)
            return Answer(orjson.dumps(messages_body(text, envelope)), JSON_TYPE, reply)
        items = [message_item(summary.strip(), envelope.item_id)]
    else:
        if reference is None:
            raise ValueError(f"a {request.kind} answer needs the signed reference")
        items = [compaction_item(reference)]
        if request.kind == "codex_endpoint":
            return Answer(orjson.dumps(compact_endpoint_body(reference, envelope)), JSON_TYPE, items)
    if stream:
        return Answer(response_stream(items, envelope), SSE_TYPE, items)
    return Answer(orjson.dumps(response_body(items, envelope)), JSON_TYPE, items)


def sse(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


# -- Claude Code (Messages API) ---------------------------------------------------------------------


def claude_code_text(summary: str, *, analysis: bool = True) -> str:
    """The assistant text Claude Code expects; ``analysis`` False when the request asked for the summary alone."""
    body = summary.strip().replace("</summary>", "&lt;/summary&gt;")
    text = f"<summary>\n{body}\n</summary>"
    return f"<analysis>\n{ANALYSIS_NOTE}\n</analysis>\n\n{text}" if analysis else text


def _messages_usage(envelope: Envelope, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": envelope.input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "output_tokens": output_tokens}


def messages_body(text: str, envelope: Envelope) -> dict[str, Any]:
    """A finished Messages API answer holding ``text``."""
    return {"id": envelope.item_id, "type": "message", "role": "assistant", "model": envelope.model,
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": _messages_usage(envelope, envelope.output_tokens)}


def messages_stream(text: str, envelope: Envelope) -> bytes:
    """The same answer as Messages API events, ``message_start`` to ``message_stop``."""
    start = {**messages_body("", envelope), "content": [], "stop_reason": None,
             "usage": _messages_usage(envelope, 0)}
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": text}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": envelope.output_tokens}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(sse(name, data) for name, data in events)


# -- Codex (Responses API) ----------------------------------------------------------------------------


def message_item(text: str, item_id: str) -> dict[str, Any]:
    """An assistant message output item holding ``text``."""
    return {"type": "message", "id": item_id, "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def compaction_item(reference: str) -> dict[str, Any]:
    """The ``compaction`` output item of a remote compaction; ``reference`` comes from ``proxy.secret.sign``."""
    return {"type": "compaction", "encrypted_content": reference}


def responses_usage(envelope: Envelope) -> dict[str, Any]:
    return {"input_tokens": envelope.input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": envelope.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": envelope.input_tokens + envelope.output_tokens}


def response_body(items: Sequence[dict[str, Any]], envelope: Envelope, status: str = "completed") -> dict[str, Any]:
    """A Responses API response object with ``items`` as its output."""
    done = status == "completed"
    return {"id": envelope.response_id, "object": "response", "created_at": envelope.created_at, "status": status,
            "model": envelope.model, "output": list(items), "usage": responses_usage(envelope) if done else None}


def compact_endpoint_body(reference: str, envelope: Envelope) -> dict[str, Any]:
    """The answer to ``POST /v1/responses/compact``: one ``compaction`` item."""
    return {"id": envelope.response_id, "object": "response.compaction", "created_at": envelope.created_at,
            "output": [compaction_item(reference)], "usage": responses_usage(envelope)}


def response_stream(items: Sequence[dict[str, Any]], envelope: Envelope) -> bytes:
    """The Responses API events of an answer whose output is ``items``, ``response.created`` to
    ``response.completed``; a message item's text arrives as one delta."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_body([], envelope, "in_progress")},
        {"type": "response.in_progress", "response": response_body([], envelope, "in_progress")},
    ]
    for index, item in enumerate(items):
        events.extend(_item_events(index, item))
    events.append({"type": "response.completed", "response": response_body(items, envelope)})
    return b"".join(sse(event["type"], {**event, "sequence_number": number}) for number, event in enumerate(events))


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    if item.get("type") != "message":
        return [{"type": "response.output_item.added", "output_index": index, "item": item},
                {"type": "response.output_item.done", "output_index": index, "item": item}]
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    part = item["content"][0]
    return [
        {"type": "response.output_item.added", "output_index": index,
         "item": {**item, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **where, "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", **where, "delta": part["text"]},
        {"type": "response.output_text.done", **where, "text": part["text"]},
        {"type": "response.content_part.done", **where, "part": part},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


# -- Gemini CLI (Gemini API) --------------------------------------------------------------------------

_HEADING = re.compile(r"^#{1,3} +(?:\d+\. *)?(.+?) *$", re.MULTILINE)
#: Where each of the proxy's sections goes in the snapshot, by a word of its title (the first that matches);
#: text under no heading, or under one matched by none of them, is key knowledge.
_SECTION_OF = (("goal", "overall_goal"), ("user", "active_constraints"), ("constraint", "active_constraints"),
               ("work completed", "recent_actions"), ("recent", "recent_actions"), ("file", "artifact_trail"),
               ("artifact", "artifact_trail"), ("current state", "task_state"), ("next", "task_state"))


def state_snapshot(summary: str) -> str:
    """``summary`` (the proxy's ``## N. Title`` sections, its user words, its artifact trail and recent messages) as
    the ``<state_snapshot>`` Gemini CLI asks for, each section's text kept whole under the tag it fits."""
    sections: dict[str, list[str]] = {name: [] for name in texts.GEMINI_SECTIONS}
    headings = list(_HEADING.finditer(summary))
    lead = summary[: headings[0].start()] if headings else summary
    if lead.strip():
        sections["key_knowledge"].append(lead.strip())
    for heading, following in zip(headings, [*headings[1:], None], strict=True):
        body = summary[heading.end(): following.start() if following is not None else len(summary)].strip()
        if not body or body == "None":
            continue
        title = heading.group(1).lower()
        tag = next((tag for word, tag in _SECTION_OF if word in title), "key_knowledge")
        sections[tag].append(f"{heading.group(1)}:\n{body}" if tag == "key_knowledge" else body)
    lines = ["<state_snapshot>"]
    for tag in texts.GEMINI_SECTIONS:
        text = "\n\n".join(sections[tag]).replace("</state_snapshot>", "&lt;/state_snapshot&gt;")
        lines.append(f"    <{tag}>\n{text}\n    </{tag}>" if text else f"    <{tag}></{tag}>")
    lines.append("</state_snapshot>")
    return "\n".join(lines)


def gemini_body(text: str, envelope: Envelope) -> dict[str, Any]:
    """A finished ``:generateContent`` answer holding ``text``."""
    return {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP",
                            "index": 0}],
            "usageMetadata": {"promptTokenCount": envelope.input_tokens,
                              "candidatesTokenCount": envelope.output_tokens,
                              "totalTokenCount": envelope.input_tokens + envelope.output_tokens},
            "modelVersion": envelope.model, "responseId": envelope.response_id}
