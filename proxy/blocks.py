"""What a person reads of a logged message, whatever API sent it: text, tool calls, tool results, reasoning.

Log entries keep each item as its API sent it (a Chat message, a Responses
input item, an Anthropic message with content blocks), so every reader of
message text (the CLI's transcript, the inspector) goes through
``message_blocks``, and a new shape is taught here once. Anything not
recognised is named (``[image_url]``), never dropped silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson


def content_text(content: Any) -> str:
    """The readable text of a ``content`` field; non-text parts show as ``[type]``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(f"[{part.get('type', 'part') if isinstance(part, Mapping) else 'part'}]")
        return "\n".join(parts)
    return orjson.dumps(content).decode()


BlockKind = Literal["text", "call", "result", "reasoning", "other"]


@dataclass(frozen=True)
class Block:
    """One readable piece of a message: text, a tool call (``name``: the tool), a tool result (``name``: the
    call it answers), reasoning, or a part only named (``[image]``)."""

    kind: BlockKind
    text: str
    name: str = ""


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _part_block(part: Any, default: BlockKind) -> Block:
    """One content part or block: Chat parts, Responses ``input_text``/``output_text``, Anthropic blocks."""
    if not isinstance(part, Mapping):
        return Block("other", "[part]")
    kind = part.get("type")
    if kind == "tool_use":
        return Block("call", _arguments(part.get("input")), str(part.get("name")))
    if kind == "tool_result":
        return Block("result", content_text(part.get("content")), str(part.get("tool_use_id") or ""))
    if kind == "thinking" and isinstance(part.get("thinking"), str):
        return Block("reasoning", part["thinking"])
    if kind == "compaction" and isinstance(part.get("content"), str):  # Anthropic's summary of what came before
        return Block("text", f"[compaction]\n{part['content']}")
    if isinstance(part.get("text"), str):
        return Block(default, part["text"])
    return Block("other", f"[{kind or 'part'}]")


def _gemini_block(part: Any) -> Block:
    if not isinstance(part, Mapping):
        return Block("other", "[part]")
    if isinstance(part.get("text"), str):
        return Block("reasoning" if part.get("thought") is True else "text", part["text"])
    call, response = part.get("functionCall"), part.get("functionResponse")
    if isinstance(call, Mapping):
        return Block("call", _arguments(call.get("args")), str(call.get("name")))
    if isinstance(response, Mapping):
        body = response.get("response")
        output = body.get("output") if isinstance(body, Mapping) else None
        return Block("result", output if isinstance(output, str) else orjson.dumps(body).decode(),
                     str(response.get("name") or ""))
    return Block("other", f"[{next(iter(part), 'part')}]")


def message_blocks(message: Mapping[str, Any]) -> list[Block]:
    """What a person reads of a logged message, whatever API sent it; every reader of message text goes here.

    Chat messages (string or list ``content``, ``tool_calls``, legacy
    ``function_call``, ``tool`` results), Anthropic messages (content blocks:
    ``text``, ``tool_use``, ``tool_result``, ``thinking``, ``compaction``) and Responses items
    (``function_call``, ``function_call_output``, ``reasoning``; messages as
    Chat), Gemini contents (``parts``: ``text``, ``thought``, ``functionCall``,
    ``functionResponse``). Anything else is named, never dropped silently.
    """
    item = message.get("type")
    if item in ("function_call", "custom_tool_call"):
        return [Block("call", _arguments(message.get("arguments", message.get("input"))), str(message.get("name")))]
    if item in ("function_call_output", "custom_tool_call_output"):
        return [Block("result", content_text(message.get("output")), str(message.get("call_id") or ""))]
    if item == "reasoning":
        summary = message.get("summary")
        texts = [p["text"] for p in summary if isinstance(p, Mapping) and isinstance(p.get("text"), str)] \
            if isinstance(summary, list) else []
        return [Block("reasoning", "\n".join(texts) or "[reasoning]")]
    if "role" not in message and isinstance(item, str) and item != "message":
        return [Block("other", f"[{item}]")]
    if isinstance(message.get("parts"), list) and "content" not in message:
        return [_gemini_block(part) for part in message["parts"]]
    role = message.get("role")
    default: BlockKind = "result" if role in ("tool", "function") else "text"
    tag = str(message.get("tool_call_id") or message.get("name") or "") if default == "result" else ""
    content = message.get("content")
    blocks: list[Block] = []
    if isinstance(content, str) and content:
        blocks.append(Block(default, content, tag))
    elif isinstance(content, list):
        blocks.extend(_part_block(part, default) for part in content)
        if default == "result" and all(b.kind == "result" for b in blocks) and blocks:
            blocks = [Block("result", "\n".join(b.text for b in blocks), tag)]  # one result, clipped as one
    elif content:
        blocks.append(Block(default, orjson.dumps(content).decode(), tag))
    calls = message.get("tool_calls")
    functions = [c.get("function") for c in calls if isinstance(c, Mapping)] if isinstance(calls, list) else []
    if isinstance(message.get("function_call"), Mapping):
        functions.append(message["function_call"])
    blocks.extend(Block("call", str(f.get("arguments") or ""), str(f.get("name")))
                  for f in functions if isinstance(f, Mapping))
    return blocks


def role_label(message: Mapping[str, Any]) -> str:
    """``role``, or the item's ``type`` for Responses items that have none, with the tool call id or name."""
    role = str(message.get("role") or message.get("type"))
    tag = message.get("tool_call_id") or message.get("name") or message.get("call_id")
    return f"{role} ({tag})" if isinstance(tag, str) and tag else role
