"""Recorded sessions as the engine's items: one small reader per format an agent writes, each in its own dialect.

A replay needs the conversation as the agent sent it, item by item, in the API
the engine speaks for that agent: Claude Code's session JSONL becomes
Anthropic Messages, Codex's rollout JSONL becomes Responses items, a Gemini CLI
saved chat becomes Gemini ``contents``, and a list of Chat Completions messages
(bare, or under ``messages`` as in the shared corpus, with its ``probes``)
stays Chat. Reasoning is left out of every format (encrypted or signed, it is
the model's, not the conversation's; the corpus drops it too).

Only the fields named in each reader's docstring are read; anything else a
line holds (ids, token counts, UI events) is ignored, so a newer version of a
format that adds fields still reads. The two JSONL formats time each line
(``timestamp``): those times drive the replay's clock (``Recording.times``), so
that it sees the session's idle gaps as the provider's cache did. A Gemini CLI
saved chat and Chat messages (the shared corpus too) carry none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from proxy import render
from proxy.dialects import CHAT, GEMINI, MESSAGES, RESPONSES, Dialect
from proxy.store.base import FactLog, SessionKey
from proxy.types import Message


class SourceError(ValueError):
    """The file is none of the formats ``read_file`` knows, or is not well formed."""


@dataclass
class Recording:
    """A session to replay: its items in ``dialect``, the model that answered, and the probes if it came with any."""

    dialect: Dialect
    items: list[Message]
    model: str
    #: Ground truth the source carries (the corpus's ``probes``): None when it must be derived from the items.
    probes: Mapping[str, Any] | None = None
    #: When each item was recorded, in seconds (None: not known), or None for a format that times nothing.
    times: list[float | None] | None = None


def _seconds(line: Mapping[str, Any]) -> float | None:
    """A line's ``timestamp`` (ISO 8601, as both JSONL formats write it) in seconds since the epoch; None when it
    has none or it does not read."""
    value = line.get("timestamp")
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def _latest(known: float | None, line: Mapping[str, Any]) -> float | None:
    """The time of an item another line adds to: that line's, where it has one."""
    seconds = _seconds(line)
    return known if seconds is None else seconds


def read_file(path: Path) -> Recording:
    """The recording in ``path``, its format told by its content (JSONL lines, or one JSON document)."""
    raw = path.read_bytes()
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _read_lines(raw)
    if isinstance(document, dict) and isinstance(document.get("messages"), list):
        return read_chat(document["messages"], str(document.get("model") or ""), document.get("probes"))
    history = document.get("history") if isinstance(document, dict) else document
    if isinstance(history, list) and history and all(isinstance(i, dict) for i in history):
        if all("parts" in i for i in history):
            return read_gemini_chat(history)
        if all("role" in i for i in history):
            return read_chat(history)
    if isinstance(document, dict) and document.get("type") is not None:  # a JSONL file of one line
        return _read_lines(raw)
    raise SourceError("not a recorded session: expected Chat messages, a Gemini CLI saved chat, or JSONL lines")


def _read_lines(raw: bytes) -> Recording:
    lines: list[dict[str, Any]] = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise SourceError(f"line {number} is not JSON") from None
        if isinstance(value, dict):
            lines.append(value)
    if any("payload" in line or line.get("type") in ("message", "function_call", "function_call_output")
           for line in lines):
        return read_codex_rollout(lines)
    if any(line.get("type") in ("user", "assistant") and isinstance(line.get("message"), dict) for line in lines):
        return read_claude_code(lines)
    raise SourceError("JSONL lines of neither a Claude Code session nor a Codex rollout")


def read_chat(messages: list[Any], model: str = "", probes: Any = None) -> Recording:
    """Chat Completions messages (``role``, ``content``, ``tool_calls``, ``tool_call_id``), as they are."""
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise SourceError("every Chat message must be an object with a role")
    return Recording(CHAT, [dict(m) for m in messages], model, probes if isinstance(probes, Mapping) else None)


def read_claude_code(lines: Iterable[Mapping[str, Any]]) -> Recording:
    """Claude Code's session JSONL (``~/.claude/projects/<project>/<session>.jsonl``) as Anthropic messages.

    Fields read: ``type`` (``user``/``assistant``; ``summary``, ``system`` and the
    rest are not conversation), ``message`` (``role``, ``content`` as a string or
    blocks, ``model``, ``id``), ``isSidechain`` (a Task sub-agent's lines: not
    this conversation), ``uuid``/``parentUuid`` (the active branch is followed back
    from the last line; a file without them is read in order). Claude Code writes
    one line per content block of a reply, all under one ``message.id``: they are
    joined into one assistant message, and consecutive user lines (the results of
    parallel calls) into one user message, as its API request carries them.
    ``thinking`` blocks are dropped. ``timestamp``: a message's time is its last line's.
    """
    entries = [line for line in _active_branch(list(lines)) if line.get("type") in ("user", "assistant")
               and isinstance(line.get("message"), dict) and not line.get("isSidechain")]
    items: list[Message] = []
    times: list[float | None] = []
    model = ""
    last_id: Any = None
    for entry in entries:
        message = entry["message"]
        role = "assistant" if entry["type"] == "assistant" else "user"
        content = message.get("content")
        blocks = ([{"type": "text", "text": content}] if isinstance(content, str)
                  else [b for b in content if isinstance(b, dict) and b.get("type") not in ("thinking",
                                                                                           "redacted_thinking")]
                  if isinstance(content, list) else [])
        if not blocks:
            continue
        if role == "assistant":
            model = str(message.get("model") or model)
            if items and items[-1]["role"] == "assistant" and message.get("id") is not None \
                    and message.get("id") == last_id:
                items[-1]["content"].extend(blocks)
                times[-1] = _latest(times[-1], entry)
                continue
            last_id = message.get("id")
        elif items and items[-1]["role"] == "user":  # the API request carries consecutive user lines as one
            items[-1]["content"].extend(blocks)
            times[-1] = _latest(times[-1], entry)
            continue
        items.append({"role": role, "content": blocks})
        times.append(_seconds(entry))
    return Recording(MESSAGES, items, model, times=times)


def _active_branch(lines: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The lines on the path from the last conversation line back to the root by ``parentUuid``, in order (a
    rewound branch is left out); all lines when they carry no ``uuid``."""
    by_uuid = {line["uuid"]: line for line in lines if isinstance(line.get("uuid"), str)}
    last = next((line for line in reversed(lines) if line.get("type") in ("user", "assistant")
                 and not line.get("isSidechain") and isinstance(line.get("uuid"), str)), None)
    if last is None:
        return lines
    path: list[Mapping[str, Any]] = []
    current: Mapping[str, Any] | None = last
    while current is not None and len(path) <= len(lines):  # bounded: a cycle of parents ends the walk
        path.append(current)
        parent = current.get("parentUuid")
        current = by_uuid.get(parent) if isinstance(parent, str) else None
    return path[::-1]


#: Responses items a Codex rollout records that are conversation (reasoning and UI events are not).
CODEX_ITEMS = frozenset({"message", "function_call", "function_call_output", "custom_tool_call",
                         "custom_tool_call_output", "local_shell_call", "local_shell_call_output",
                         "web_search_call"})


def read_codex_rollout(lines: Iterable[Mapping[str, Any]]) -> Recording:
    """Codex's rollout JSONL (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``) as Responses items.

    Fields read: each line's ``type`` and ``payload``; a ``response_item``'s
    payload is a Responses item (``message`` with ``role`` and ``content`` parts,
    ``function_call`` with ``name``/``arguments``/``call_id``,
    ``function_call_output`` with ``call_id``/``output``, their ``custom_tool_call``
    forms); ``turn_context``'s ``payload.model`` names the model. Older rollouts
    wrote the items themselves, one a line, after a meta line: read as well.
    ``reasoning`` items and ``event_msg`` lines are left out. ``timestamp``: each item's time.
    """
    items: list[Message] = []
    times: list[float | None] = []
    model = ""
    for line in lines:
        payload = line.get("payload")
        if line.get("type") == "turn_context" and isinstance(payload, dict):
            model = str(payload.get("model") or model)
            continue
        item = payload if line.get("type") == "response_item" else line if "payload" not in line else None
        if isinstance(item, dict) and item.get("type") in CODEX_ITEMS:
            items.append(dict(item))
            times.append(_seconds(line))
    return Recording(RESPONSES, items, model, times=times)


def read_gemini_chat(history: list[Any]) -> Recording:
    """A Gemini CLI saved chat (``/chat save TAG`` writes ``checkpoint-TAG.json``): Gemini ``contents``.

    Fields read: each content's ``role`` (``user``/``model``) and ``parts`` (``text``,
    ``functionCall``, ``functionResponse``); ``thought`` parts are dropped. The file
    is the list itself, or an object holding it under ``history`` (newer versions). It records no times.
    """
    items: list[Message] = []
    for content in history:
        parts = [p for p in content.get("parts") or [] if isinstance(p, dict) and not p.get("thought")]
        if parts and content.get("role") in ("user", "model"):
            items.append({"role": content["role"], "parts": parts})
    return Recording(GEMINI, items, "")


async def read_store(store: FactLog, key: SessionKey) -> Recording:
    """A session in the store: the conversation its log's head describes (``proxy.render.replay``), in the API it
    came through, and the model its newest logged reply names."""
    lineage = await render.replay(store, key)
    model = ""
    async for page in render.pages(store, key):
        model = next((str(f.extra["model"]) for f in reversed(page) if isinstance(f.extra.get("model"), str)), model)
    return Recording(lineage.dialect, [dict(m) for m in lineage.messages], model)
