"""Is this request the client's own compaction? Pure functions of the request body, as the API sent it.

Four shapes, each answered differently (``proxy.clientcompact.answers``):

- ``claude_code``: Claude Code asks the model for ``<analysis>…</analysis><summary>…</summary>`` in a text block
  of its last user message. Captured from 2.1.332 after a "prompt is too long": the block comes after the
  ``tool_result`` blocks of that message, the request still offers tools, and a role ``"system"`` entry may
  follow the message. Only a top-level text block counts: the phrases inside a ``tool_result`` (a file that
  quotes them) or in an earlier message are conversation, not a request.
- ``codex_local``: Codex with a custom provider appends a user message with its ``compact_prompt`` and keeps
  the answer's last assistant message as the summary.
- ``codex_trigger``: Codex's remote compaction v2, a ``/v1/responses`` turn whose input ends with
  ``{"type": "compaction_trigger"}``; it needs exactly one ``compaction`` output item.
- ``codex_endpoint``: ``POST /v1/responses/compact`` (remote compaction v1); the path says so, the body is the
  turn's ``model``, ``input``, ``instructions`` (the base instructions, not summary instructions), ``tools``,
  ``reasoning``…: there is no ``compact_prompt`` field (``codex-rs/codex-api/src/common.rs``,
  ``CompactionInput``).
- ``gemini_snapshot`` / ``gemini_verify``: Gemini CLI's two ``:generateContent`` calls, both with its compression
  prompt as ``systemInstruction``: the history then a user turn asking for the ``<state_snapshot>``, and the same
  history, the first answer as a model turn and a user turn asking to check it and give it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from proxy.clientcompact import texts
from proxy.types import Message

ClientKind = Literal["claude_code", "codex_local", "codex_trigger", "codex_endpoint", "gemini_snapshot",
                     "gemini_verify"]
#: What Claude Code wants summarised: everything, only the messages after a retained head ("recent"), or the
#: messages it sent, newer ones being kept after the summary ("up_to").
Scope = Literal["all", "recent", "up_to"]
_SCOPES: dict[str, Scope] = {
    "the conversation so far": "all",
    "the RECENT portion of the conversation": "recent",
    "this conversation": "up_to",
}


@dataclass(frozen=True, slots=True)
class CompactionRequest:
    """A client compaction request.

    ``index`` is the item holding the request (Claude Code's user message, Codex's prompt or trigger item);
    None for ``/responses/compact``, whose whole input is conversation. ``block`` is the content block of
    Claude Code's message that holds the prompt (None: the content is that one string). ``instructions`` is
    what the user added (``/compact <text>``, a custom Codex ``compact_prompt``), for the summary prompt.
    """

    kind: ClientKind
    index: int | None
    block: int | None = None
    instructions: str | None = None
    scope: Scope = "all"
    #: Claude Code only: whether the request asks for an ``<analysis>`` block before the ``<summary>``.
    analysis: bool = True

    @property
    def prefix_only(self) -> bool:
        """Whether the client asks about the older part of its conversation only (Gemini CLI keeps its newest 30%
        verbatim): its items may be a prefix of the logged conversation, which the answer must not log again."""
        return self.kind in ("gemini_snapshot", "gemini_verify")

    def conversation(self, items: Sequence[Message]) -> list[Message]:
        """The request's items without the compaction request itself: what the client wants summarised.

        Claude Code's prompt block is taken out of its message (the ``tool_result`` blocks beside it are
        conversation; a message left empty goes), and what follows the message stays; Codex's prompt or trigger
        item goes.
        """
        if self.index is None:
            return list(items)
        if self.kind in ("gemini_snapshot", "gemini_verify"):
            return list(items[: self.index])
        if self.kind != "claude_code":
            return [item for i, item in enumerate(items) if i != self.index]
        message = items[self.index]
        content = message.get("content")
        rest = [b for i, b in enumerate(content) if i != self.block] if isinstance(content, list) else []
        kept = [{**message, "content": rest}] if rest else []
        return [*items[: self.index], *kept, *items[self.index + 1 :]]


#: ``POST /v1/responses/compact``: recognised by its path alone.
CODEX_ENDPOINT = CompactionRequest(kind="codex_endpoint", index=None)


def recognise(dialect: str, payload: Mapping[str, Any], turn_metadata: str | None = None) -> CompactionRequest | None:
    """The compaction request in a body of the ``dialect`` API (``messages`` or ``responses``), if it is one.

    ``turn_metadata`` is Codex's ``x-codex-turn-metadata`` header, when the request had one.
    """
    if dialect == "messages":
        messages = payload.get("messages")
        return claude_code_compaction(messages) if isinstance(messages, list) else None
    if dialect == "responses":
        return codex_compaction(payload, turn_metadata)
    if dialect == "gemini":
        return gemini_compaction(payload)
    return None


# -- Claude Code ------------------------------------------------------------------------------------


def claude_code_compaction(messages: Sequence[Any]) -> CompactionRequest | None:
    """Claude Code's summary request: a top-level text block of the last user message (``system`` entries after
    it skipped) that starts with the marker and carries a task sentence or the closing reminder."""
    index = len(messages) - 1
    while index >= 0 and _role(messages[index]) == "system":
        index -= 1
    if index < 0 or _role(messages[index]) != "user":
        return None
    content = messages[index].get("content")
    if isinstance(content, str):
        return _claude_request(index, None, content)
    if not isinstance(content, list):
        return None
    for block_index in range(len(content) - 1, -1, -1):
        block = content[block_index]
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            found = _claude_request(index, block_index, block["text"])
            if found is not None:
                return found
    return None


def _claude_request(index: int, block: int | None, text: str) -> CompactionRequest | None:
    if not text.lstrip().startswith(texts.CLAUDE_MARKER):
        return None
    task = texts.CLAUDE_TASK.search(text)
    if task is None and texts.CLAUDE_REMINDER not in text:
        return None
    scope = _SCOPES[task["scope"]] if task is not None else "all"
    analysis = texts.CLAUDE_WANTS_ANALYSIS in text or "<summary> block" not in text
    return CompactionRequest(kind="claude_code", index=index, block=block, instructions=_claude_instructions(text),
                             scope=scope, analysis=analysis)


def _claude_instructions(text: str) -> str | None:
    """The ``Additional Instructions:`` block: from its (first) line to the closing reminder; the body before it
    never has that line, so a user's text that repeats it is kept whole."""
    start = text.find(texts.CLAUDE_INSTRUCTIONS)
    if start == -1:
        return None
    start += len(texts.CLAUDE_INSTRUCTIONS)
    end = text.find(texts.CLAUDE_REMINDER, start)
    instructions = text[start : end if end != -1 else len(text)].strip()
    return instructions or None


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


# -- Codex ------------------------------------------------------------------------------------------


def codex_compaction(payload: Mapping[str, Any], turn_metadata: str | None = None) -> CompactionRequest | None:
    """Codex's compaction turn on ``/v1/responses``: a trailing ``compaction_trigger`` item, or a last user
    message holding the compaction prompt.

    The default prompt is recognised by its first words, and then adds no instructions (the proxy's own summary
    prompt replaces it). A custom ``compact_prompt`` has no fixed words; it is recognised when Codex's turn
    metadata (body ``client_metadata`` or header) says ``request_kind: "compaction"``, and its text becomes the
    instructions.
    """
    items = payload.get("input")
    if not isinstance(items, list) or not items or not isinstance(items[-1], dict):
        return None
    last = items[-1]
    index = len(items) - 1
    if last.get("type") == texts.CODEX_TRIGGER:
        return CompactionRequest(kind="codex_trigger", index=index)
    if last.get("role") != "user" or last.get("type", "message") != "message":
        return None
    text = input_text(last.get("content"))
    if text.lstrip().startswith(texts.CODEX_PROMPT):
        return CompactionRequest(kind="codex_local", index=index)
    if text.strip() and _is_compaction_turn(payload, turn_metadata):
        return CompactionRequest(kind="codex_local", index=index, instructions=text.strip())
    return None


def input_text(content: Any) -> str:
    """The text parts of a Responses message joined by newlines, as Codex reads them (``content_items_to_text``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [part.get("text") for part in content if isinstance(part, dict)
             and part.get("type") in ("input_text", "output_text", "text")]
    return "\n".join(part for part in parts if isinstance(part, str) and part)


def _is_compaction_turn(payload: Mapping[str, Any], header: str | None) -> bool:
    metadata = payload.get("client_metadata")
    in_body = metadata.get(texts.CODEX_TURN_METADATA) if isinstance(metadata, Mapping) else None
    for raw in (in_body, header):
        if not isinstance(raw, str | bytes):
            continue
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(parsed, dict) and parsed.get("request_kind") == "compaction":
            return True
    return False


# -- Gemini CLI -----------------------------------------------------------------------------------


def gemini_compaction(payload: Mapping[str, Any]) -> CompactionRequest | None:
    """Gemini CLI's compression calls: its prompt as ``systemInstruction``, the ask (or the check, after the
    model turn holding the first answer) as the last user turn."""
    if not _gemini_text(payload.get("systemInstruction")).lstrip().startswith(texts.GEMINI_SYSTEM):
        return None
    contents = payload.get("contents")
    if not isinstance(contents, list) or not contents or not isinstance(contents[-1], dict):
        return None
    last = _gemini_text(contents[-1]).strip()
    if contents[-1].get("role") != "user":
        return None
    if last.endswith(texts.GEMINI_ASK):
        return CompactionRequest(kind="gemini_snapshot", index=len(contents) - 1)
    if last.startswith(texts.GEMINI_VERIFY) and len(contents) >= 2 and _role(contents[-2]) == "model":
        return CompactionRequest(kind="gemini_verify", index=len(contents) - 2)
    return None


def _gemini_text(content: Any) -> str:
    """The text parts of a Gemini content (or ``systemInstruction``, which may also be a bare string) joined."""
    if isinstance(content, str):
        return content
    parts = content.get("parts") if isinstance(content, Mapping) else None
    if isinstance(content, Mapping) and parts is None and isinstance(content.get("text"), str):
        return str(content["text"])  # {"text": …}: the SDK's shorthand for one part
    texts_ = [p.get("text") for p in parts if isinstance(p, Mapping)] if isinstance(parts, list) else []
    return "\n".join(t for t in texts_ if isinstance(t, str))
