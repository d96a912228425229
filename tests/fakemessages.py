"""A fake Anthropic Messages API upstream for the real Claude Code: a real aiohttp server.

``POST /v1/messages`` (Claude Code adds ``?beta=true``) answers each turn of
``script`` with a ``thinking`` block (its ``signature`` one the fake issued),
then a ``Bash`` ``tool_use`` (opencode's ``bash``) whose ``command`` runs the step, or the final text;
streamed as the API streams it (``message_start``, ``ping``,
``content_block_start``/``delta``/``stop`` with ``thinking_delta``,
``signature_delta``, ``text_delta`` and ``input_json_delta``, ``message_delta``
with ``stop_reason`` and ``usage``, ``message_stop``) or as one JSON message. It
checks what the real API checks about history (thinking blocks come back with
their signature; every ``tool_use`` is answered by a ``tool_result`` in the next
message and every ``tool_result`` answers one) and refuses a prompt over
``window`` with the API's 400 "prompt is too long: N tokens > M maximum"
(``overflow="event"``: the same error as an in-stream ``error`` event, after
``message_start`` and a ``ping``).
It implements the API's own context management (``context_management.edits``), each edit refused with the
API's 400 unless its beta is in ``anthropic-beta`` (``context-management-2025-06-27`` for the clearing edits,
``compact-2026-01-12`` for compaction): ``clear_tool_uses_20250919`` over its ``trigger`` (input tokens,
default 100,000) clears the results of all but the last ``keep`` tool uses (default 3),
``clear_thinking_20251015`` (400 without ``thinking``) the thinking of all but the last ``keep`` turns (``all``:
none), and ``compact_20260112`` over its ``trigger`` (default 150,000) answers with a ``compaction`` block
first (its summary keeps the step markers; streamed as ``compaction_delta``), then the turn, or only the block
with ``stop_reason: "compaction"`` under ``pause_after_compaction``. Edits that cleared something are reported
in ``context_management.applied_edits``, a compaction's cost in ``usage.iterations``; a later request is read
from the last compaction block on, and one carrying a compaction block the fake did not issue, byte for byte,
is refused. The tokens recorded (and held against ``window``) are the prompt as the model reads it after the
edits.
Its prompt cache holds every prompt of the session (``cache_control`` markers aside): the longest shared prefix
is billed as ``cache_read_input_tokens``, and what lies past it up to the request's last breakpoint as
``cache_creation_input_tokens``, as the API bills a changed prefix, summary calls' prompts included (with a
``clock``, a session idle longer than ``ttl`` finds its cache empty, as the API's lapses); the output
as the tokenizer counts what the model wrote (``written``). Each request's billed usage is kept in its record
(``Recorded.usage``).
``/v1/messages/count_tokens`` answers ``{"input_tokens": N}``. A request whose
``system`` is the proxy's summariser prompt gets a summary, and so does one
whose last user message starts with it (a summary call shaped like the client's
request). ``require_claude_code`` refuses every message request whose first
system block is not Claude Code's own prompt, as the API does for a Claude
subscription's OAuth token. Everything it receives is in ``requests``.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from tests.fakescript import (
    Recorded,
    Recorder,
    Script,
    cached_prefix,
    content_text,
    is_summary_prompt,
    pieces,
    sse,
    summary_text,
)
from tests.fakeupstream import PREAMBLE, PREAMBLE_CALL, overflow_body

#: Claude Code's own compaction request carries this in its last user message; a proxy-driven run must never send it.
CLIENT_COMPACTION = "Your task is to create a detailed summary of the conversation so far"


#: How Claude Code's system prompt starts; with an OAuth token the API takes no other.
#: The shell tools the fake calls: Claude Code's and opencode's.
SHELLS = frozenset({"Bash", "bash"})
CLAUDE_CODE_SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude."
#: The beta each context-management edit needs in ``anthropic-beta``.
EDIT_BETAS = {"clear_tool_uses_20250919": "context-management-2025-06-27",
              "clear_thinking_20251015": "context-management-2025-06-27", "compact_20260112": "compact-2026-01-12"}
#: What a cleared tool result holds instead of its output.
CLEARED = "[cleared]"
OAUTH_REFUSED = {"type": "error", "error": {"type": "invalid_request_error", "message": "This credential is only "
                                            "authorized for use with Claude Code and cannot be used for other API "
                                            "requests."}}


def first_system_text(system: Any) -> str:
    """The text of a request's first system block (``system`` as a string, or a list of blocks)."""
    if isinstance(system, list):
        return str(system[0].get("text", "")) if system and isinstance(system[0], dict) else ""
    return system if isinstance(system, str) else ""


class FakeMessages(Recorder):
    """``script``: the run to drive. ``window``: refuse prompts over it. ``overflow``: ``http`` or ``event``."""

    def __init__(self, script: Script | None = None, window: int | None = None, overflow: str = "http") -> None:
        super().__init__(script, window, overflow)
        self._ids = itertools.count(1)
        #: (thinking, signature) of every thinking block handed out, so one sent back can be checked.
        self._issued: set[tuple[str, str]] = set()
        #: Every prompt of each session (by Claude Code's session header), for the longest cached prefix.
        self._prompts: dict[str, list[list[Any]]] = {}
        #: The cache's clock (None: it never lapses), its life in seconds, and each session's last request on it.
        self.clock: Callable[[], float] | None = None
        self.ttl = 300.0
        self._last_at: dict[str, float] = {}
        self.require_claude_code = False
        #: The content of every compaction block handed out, so one sent back can be checked.
        self._compactions: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_route("*", "/{tail:.*}", self.other)
        return app

    def prompt_counts(self, body: dict[str, Any]) -> tuple[list[Any], list[int]]:
        """The prompt as the model reads it (tools, system, messages) and each part's tokens."""
        prompt = [body.get("tools"), body.get("system"), *(body.get("messages") or [])]
        return prompt, [self.window.count(part) for part in prompt]

    # -- routes ---------------------------------------------------------------------------------

    async def other(self, request: web.Request) -> web.Response:
        self._record(request, await request.text(), "other", status=404)
        return web.json_response({"type": "error", "error": {"type": "not_found_error",
                                                             "message": f"No route {request.method} {request.path}"}},
                                 status=404)

    async def count_tokens(self, request: web.Request) -> web.Response:
        body = await request.json(loads=orjson.loads)
        tokens = sum(self.prompt_counts(body)[1])
        self._record(request, body, "count_tokens", tokens=tokens)
        return web.json_response({"input_tokens": tokens})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json(loads=orjson.loads)
        messages: list[dict[str, Any]] = body.get("messages") or []
        summary = is_summary_prompt(body.get("system")) or is_summary_prompt(_last_user_text(messages))
        if self.require_claude_code and not first_system_text(body.get("system")).startswith(CLAUDE_CODE_SYSTEM):
            self._record(request, body, "summary" if summary else "turn", status=400)
            return web.json_response(OAUTH_REFUSED, status=400)
        if summary:
            record = self._record(request, body, "summary")
            prompt, counts = self.prompt_counts(body)
            cached, written = self._cache(request, prompt, counts)
            if self.summary_style == PREAMBLE_CALL:
                call = {"type": "tool_use", "id": f"toolu_{next(self._ids):06d}", "name": body["tools"][0]["name"],
                        "input": {}}
                return await self._answer(request, body, record, [{"type": "text", "text": PREAMBLE}, call],
                                          "tool_use", sum(counts), cached, written=written)
            text = await self.summary(messages)
            if isinstance(text, web.Response):
                return text
            return await self._answer(request, body, record, [{"type": "text", "text": text}], "end_turn",
                                      sum(counts), cached, written=written)
        refusal = self._edit_refusal(request, body)
        if refusal is not None:
            self._record(request, body, "turn", status=400)
            return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                                                                 "message": refusal}}, status=400)
        edited = Edited(self, body, messages)
        prompt, counts = self.prompt_counts({**body, "messages": edited.messages})
        tokens = sum(counts)
        if self.window.refuses(tokens):
            assert self.window.limit is not None
            in_stream = self.overflow == "event" and bool(body.get("stream"))
            self._record(request, body, "turn", tokens=tokens, status=200 if in_stream else 400)
            status, raw = overflow_body("anthropic", tokens, self.window.limit)
            if in_stream:  # as a stream that started: message_start and a ping, then the error
                start = {"id": f"msg_{next(self._ids):06d}", "type": "message", "role": "assistant",
                         "model": body.get("model"), "content": [], "stop_reason": None, "stop_sequence": None,
                         "usage": {"input_tokens": 0, "output_tokens": 0}}
                return await _stream(request, [{"type": "message_start", "message": start}, {"type": "ping"},
                                               orjson.loads(raw)])
            return web.Response(status=status, body=raw, content_type="application/json")
        problem = self._check_history(messages) or self._check_compactions(messages)
        if problem is not None:
            self._record(request, body, "turn", tokens=tokens, status=400)
            return web.json_response({"type": "error", "error": {"type": "invalid_request_error", "message": problem}},
                                     status=400)
        kind = "client_compaction" if CLIENT_COMPACTION in _last_user_text(messages) else "turn"
        record = self._record(request, body, kind, tokens=tokens)
        cached, written = self._cache(request, prompt, counts)
        if kind != "turn":
            return await self._answer(request, body, record, [{"type": "text", "text": "<summary>None</summary>"}],
                                      "end_turn", tokens, cached, written=written)
        blocks, stop = self._turn_output(body, messages)
        compaction = edited.compaction(tokens)
        if compaction is None:
            return await self._answer(request, body, record, blocks, stop, tokens, cached, edited.applied,
                                      written=written)
        block = {"type": "compaction", "content": summary_text(orjson.dumps(edited.messages).decode())}
        self._compactions.add(block["content"])
        after = sum(self.prompt_counts({**body, "messages": [{"role": "assistant", "content": [block]}]})[1])
        iterations = [{"type": "compaction", "input_tokens": tokens, "output_tokens": self.written([block]),
                       "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
                      {"type": "message", "input_tokens": after, "output_tokens": self.written(blocks),
                       "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}]
        if compaction.get("pause_after_compaction") is True:
            blocks, stop = [], "compaction"
        return await self._answer(request, body, record, [block, *blocks], stop, after, 0, edited.applied, iterations)

    def _cache(self, request: web.Request, prompt: list[Any], counts: list[int]) -> tuple[int, int]:
        """(read, written): what the session's prompt cache serves of ``prompt`` (the longest prefix it shares with
        an earlier prompt) and what the prompt writes to it (``cache_written``); the prompt is cached from now on."""
        plain = uncontrolled(prompt)  # the cache holds content: moving a breakpoint keeps what it marked cached
        session = request.headers.get("X-Claude-Code-Session-Id", "")
        seen = self._prompts.setdefault(session, [])
        if self.clock is not None:  # an idle gap past the cache's life: it holds nothing any more
            now, last = self.clock(), self._last_at.get(session)
            if last is not None and now - last > self.ttl:
                seen.clear()
            self._last_at[session] = now
        cached = max((cached_prefix(earlier, plain, counts) for earlier in seen), default=0)
        seen.append(plain)
        return cached, cache_written(prompt, counts, cached)

    def written(self, blocks: list[dict[str, Any]]) -> int:
        """The tokens the model wrote in ``blocks``: texts, thinking, a call's name and input, a compaction's
        summary."""
        texts = [f"{b['name']}{orjson.dumps(b['input']).decode()}" if b["type"] == "tool_use" else
                 str(b.get("text") or b.get("thinking") or b.get("content") or "") for b in blocks]
        return sum(self.window.counter.text_tokens(text) for text in texts)

    def _edit_refusal(self, request: web.Request, body: dict[str, Any]) -> str | None:
        """The API's words for an edit it does not take here: its beta missing, or thinking off for clear_thinking."""
        betas = {beta.strip() for beta in request.headers.get("anthropic-beta", "").split(",")}
        for edit in edits_of(body):
            kind = edit.get("type")
            if kind not in EDIT_BETAS:
                return f"context_management.edits: unknown edit type {kind!r}"
            if EDIT_BETAS[kind] not in betas:
                return f"context_management: the {kind} edit requires the anthropic-beta {EDIT_BETAS[kind]}"
            if kind == "clear_thinking_20251015" and (body.get("thinking") or {}).get("type") not in (
                    "enabled", "adaptive"):
                return "context_management.edits: clear_thinking_20251015 requires thinking to be enabled"
        return None

    def _check_compactions(self, messages: list[dict[str, Any]]) -> str | None:
        for index, message in enumerate(messages):
            for b, block in enumerate(_blocks(message)):
                if block.get("type") == "compaction" and block.get("content") not in self._compactions:
                    return f"messages.{index}.content.{b}: Invalid `compaction` block"
        return None

    # -- the script -----------------------------------------------------------------------------

    def _turn_output(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
        command, output = _last_call(messages)
        step = self.script.next_step(command, output)
        shown = (body.get("thinking") or {}).get("display") != "omitted"
        if isinstance(step, str):
            return [self._thinking("Wrapping up.", shown), {"type": "text", "text": step}], "end_turn"
        shell = next((t["name"] for t in body.get("tools") or [] if t.get("name") in SHELLS), None)
        if shell is None:
            return [{"type": "text", "text": "No Bash tool was offered."}], "end_turn"
        call = {"type": "tool_use", "id": f"toolu_{next(self._ids):06d}", "name": shell,
                "input": {"command": self.script.command(step), "description": f"Run step {step}"}}
        return [self._thinking(f"Step {step} next.", shown), call], "tool_use"

    def _thinking(self, text: str, shown: bool) -> dict[str, Any]:
        """A thinking block; with ``display: omitted`` its text is empty and only the signature travels."""
        thinking = text if shown else ""
        digest = hashlib.sha256(f"{next(self._ids)}:{text}".encode()).digest()
        signature = base64.b64encode(digest * 6).decode()
        self._issued.add((thinking, signature))
        return {"type": "thinking", "thinking": thinking, "signature": signature}

    def _check_history(self, messages: list[dict[str, Any]]) -> str | None:
        """What the real API refuses in a conversation, or ``None``. Role ``system`` entries are passed over."""
        turns = [(i, m) for i, m in enumerate(messages) if m.get("role") != "system"]
        if turns and turns[0][1].get("role") != "user":
            return "messages: first message must use the \"user\" role"
        for (index, message), following in itertools.zip_longest(turns, turns[1:]):
            blocks = _blocks(message)
            for b, block in enumerate(blocks):
                signed = (block.get("thinking"), block.get("signature"))
                if block.get("type") == "thinking" and signed not in self._issued:
                    return f"messages.{index}.content.{b}: Invalid `signature` in `thinking` block"
            asked = [b["id"] for b in blocks if b.get("type") == "tool_use"]
            answers = _blocks(following[1]) if following else []
            if missing := [i for i in asked if i not in {b.get("tool_use_id") for b in answers}]:
                return (f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately "
                        f"after: {missing[0]}. Each `tool_use` block must have a corresponding `tool_result` block "
                        "in the next message.")
            for b, block in enumerate(answers):
                if block.get("type") == "tool_result" and block.get("tool_use_id") not in asked:
                    return (f"messages.{following[0]}.content.{b}: unexpected `tool_use_id` found in `tool_result` "
                            f"blocks: {block.get('tool_use_id')}. Each `tool_result` block must have a "
                            "corresponding `tool_use` block in the previous message.")
        return None

    # -- the wire -------------------------------------------------------------------------------

    async def _answer(self, request: web.Request, body: dict[str, Any], record: Recorded,
                      blocks: list[dict[str, Any]], stop: str, tokens: int, cached: int,
                      applied: list[dict[str, Any]] | None = None, iterations: list[dict[str, Any]] | None = None,
                      written: int = 0) -> web.StreamResponse:
        """The answer; with ``context_management`` in the request, the edits it applied, and the iterations'
        usage after a compaction (top-level usage is the message iteration's, as the API reports it). ``written``:
        the tokens the prompt cache took (``cache_written``), billed as cache creation rather than input; the usage is
        kept with the request's record."""
        usage: dict[str, Any] = {"input_tokens": tokens - cached - written, "cache_creation_input_tokens": written,
                                 "cache_read_input_tokens": cached,
                                 "output_tokens": self.written([b for b in blocks if b["type"] != "compaction"])}
        record.usage = usage
        managed = {"context_management": {"applied_edits": applied or []}} if edits_of(body) else {}
        message = {"id": f"msg_{next(self._ids):06d}", "type": "message", "role": "assistant",
                   "model": body.get("model"), "content": blocks, "stop_reason": stop, "stop_sequence": None,
                   "usage": {**usage, **({"iterations": iterations} if iterations else {})}, **managed}
        if not body.get("stream"):
            return web.json_response(message)
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        start.pop("context_management", None)
        events: list[dict[str, Any]] = [{"type": "message_start", "message": start}, {"type": "ping"}]
        for index, block in enumerate(blocks):
            events.extend(_block_events(index, block))
        final = {"output_tokens": usage["output_tokens"], **({"input_tokens": tokens - cached - written,
                                                                "iterations": iterations} if iterations else {})}
        events.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                       "usage": final, **managed})
        events.append({"type": "message_stop"})
        return await _stream(request, events)


def uncontrolled(value: Any) -> Any:
    """``value`` without its ``cache_control`` markers, at any depth."""
    if isinstance(value, dict):
        return {key: uncontrolled(item) for key, item in value.items() if key != "cache_control"}
    return [uncontrolled(item) for item in value] if isinstance(value, list) else value


def cache_written(prompt: list[Any], counts: list[int], cached: int) -> int:
    """What the API writes to its prompt cache for a prompt (tools, system, messages): the tokens past the cached
    prefix up to the last part carrying a ``cache_control`` breakpoint (none: nothing is written)."""
    marked = [index for index, part in enumerate(prompt) if b'"cache_control"' in orjson.dumps(part)]
    return max(0, sum(counts[:marked[-1] + 1]) - cached) if marked else 0


def edits_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    management = body.get("context_management")
    edits = management.get("edits") if isinstance(management, dict) else None
    return [edit for edit in edits if isinstance(edit, dict)] if isinstance(edits, list) else []


def _trigger(edit: dict[str, Any], default: int) -> int:
    trigger = edit.get("trigger")
    return int(trigger["value"]) if isinstance(trigger, dict) and isinstance(trigger.get("value"), int) else default


def _keep(edit: dict[str, Any], default: int) -> int | None:
    """How many of the newest to keep (None: ``"all"``)."""
    keep = edit.get("keep")
    if keep == "all":
        return None
    return int(keep["value"]) if isinstance(keep, dict) and isinstance(keep.get("value"), int) else default


class Edited:
    """The conversation as the model reads it: from the last compaction block on, with the clearing edits applied;
    and the edits that changed something (``applied``)."""

    def __init__(self, fake: FakeMessages, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        self.edits = edits_of(body)
        self.applied: list[dict[str, Any]] = []
        self.messages = messages
        compacted = [i for i, m in enumerate(messages) if any(b.get("type") == "compaction" for b in _blocks(m))]
        if compacted:  # the block stands for everything before it
            self.messages = messages[compacted[-1]:]
        self._fake, self._body = fake, body
        for edit in self.edits:
            if edit["type"] == "clear_thinking_20251015":
                self._clear_thinking(_keep(edit, 1))
            elif edit["type"] == "clear_tool_uses_20250919" and self._tokens() > _trigger(edit, 100_000):
                self._clear_tool_uses(_keep(edit, 3) or 0)

    def compaction(self, tokens: int) -> dict[str, Any] | None:
        """The compaction edit, when the prompt is over its trigger."""
        for edit in self.edits:
            if edit["type"] == "compact_20260112" and tokens > _trigger(edit, 150_000):
                return edit
        return None

    def _tokens(self) -> int:
        return sum(self._fake.prompt_counts({**self._body, "messages": self.messages})[1])

    def _rewrite(self, kind: str, counted: str, change: Any) -> None:
        before = self._tokens()
        self.messages, changed = change(self.messages)
        if changed:
            self.applied.append({"type": kind, counted: changed, "cleared_input_tokens": before - self._tokens()})

    def _clear_tool_uses(self, keep: int) -> None:
        def change(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
            results = [(i, b) for i, m in enumerate(messages) for b, block in enumerate(_blocks(m))
                       if block.get("type") == "tool_result" and block.get("content") != CLEARED]
            cleared = results[:max(len(results) - keep, 0)]
            out = [dict(m) for m in messages]
            for i, b in cleared:
                content = list(out[i]["content"])
                content[b] = {**content[b], "content": CLEARED}
                out[i]["content"] = content
            return out, len(cleared)

        self._rewrite("clear_tool_uses_20250919", "cleared_tool_uses", change)

    def _clear_thinking(self, keep: int | None) -> None:
        def change(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
            turns = [i for i, m in enumerate(messages) if any(b.get("type") == "thinking" for b in _blocks(m))]
            cleared = [] if keep is None else turns[:max(len(turns) - keep, 0)]
            out = [{**m, "content": [b for b in _blocks(m) if b.get("type") != "thinking"]} if i in cleared else m
                   for i, m in enumerate(messages)]
            return out, len(cleared)

        self._rewrite("clear_thinking_20251015", "cleared_thinking_turns", change)


def _block_events(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    kind = block["type"]
    start: dict[str, Any]
    deltas: list[dict[str, Any]]
    if kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"]) if p]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "text":
        start = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
    elif kind == "compaction":  # the summary comes whole, in one delta
        start = {"type": "compaction", "content": None}
        deltas = [{"type": "compaction_delta", "content": block["content"]}]
    else:
        start = {**block, "input": {}}
        arguments = orjson.dumps(block["input"]).decode()
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces(arguments)]
    return [{"type": "content_block_start", "index": index, "content_block": start},
            *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
            {"type": "content_block_stop", "index": index}]


async def _stream(request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for event in events:
        await resp.write(sse(event))
    await resp.write_eof()
    return resp


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _last_call(messages: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """The command of the latest Bash ``tool_use`` and the ``tool_result`` sent back for it."""
    for index in range(len(messages) - 1, -1, -1):
        uses = [b for b in _blocks(messages[index]) if b.get("type") == "tool_use"]
        if not uses:
            continue
        call = uses[-1]
        command = str((call.get("input") or {}).get("command"))
        for later in messages[index + 1:]:
            for block in _blocks(later):
                if block.get("type") == "tool_result" and block.get("tool_use_id") == call.get("id"):
                    return command, content_text(block.get("content"))
        return command, None
    return None, None


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""

