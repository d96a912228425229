"""Server-sent events from an OpenAI-compatible upstream, relayed unchanged and read on the side.

The proxy must never delay or rewrite what the model streams: clients measure
time-to-first-token and some of them parse the wire format strictly. So the
byte stream is cut into whole events and each event is written to the client
exactly as it arrived, while a copy is parsed to rebuild the assistant message
that the proxy stores in the session history.

    upstream bytes ──► SSESplitter.feed() ──► raw event ──► client (unchanged)
                                                  │
                                            parse_event()
                                                  │
                                         SSEEvent.json() ──► StreamAssembler.feed()

Nothing here does I/O, so every edge case (chunk boundaries, CR line endings,
interleaved tool calls, cut streams) is testable without a server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = [
    "EventTooLarge",
    "SSEEvent",
    "SSESplitter",
    "StreamAssembler",
    "is_usage_only",
    "looks_like_sse",
    "message_from_completion",
    "parse_event",
]

# A line ends with CRLF, LF or a lone CR (HTML Living Standard, "Parsing an event stream").
_LINE_END = re.compile(rb"\r\n|\r|\n")
_LINE_END_TEXT = re.compile(r"\r\n|\r|\n")
_CR = 0x0D

DONE = "[DONE]"
_BOM = b"\xef\xbb\xbf"
#: What the first line of an event stream starts with: a field name and its colon, or a comment's colon.
_SSE_STARTS = (b"data:", b"event:", b"id:", b"retry:", b":")


class EventTooLarge(ValueError):
    """An event is longer than the splitter's limit: an upstream that never ends an event must not fill memory.

    ``events`` are the complete events the same `SSESplitter.feed` found
    before it, which the caller may still relay.
    """

    def __init__(self, limit: int, events: list[bytes]) -> None:
        super().__init__(f"an event of over {limit} bytes")
        self.events = events


class SSESplitter:
    """Cuts an event stream into complete raw events, each with its terminating blank line.

    An event ends at its first empty line. Events are returned byte for byte so
    the proxy can relay them with one write each; concatenating everything
    `feed` returns plus `flush` gives back the input exactly, and the events
    are the same whatever the chunking.

    A lone CR at the very end of the buffer is held back until the next byte:
    it may be the first half of a CRLF, and deciding early would turn the LF
    into a spurious empty line (a different event boundary). Only streams that
    use bare CR line endings are affected, by one byte of latency per event.

    Searching resumes where the previous `feed` stopped, so the total work is
    linear in the stream length however small the chunks are.

    ``limit`` bounds one event in bytes: `feed` raises `EventTooLarge` as soon
    as an event, complete or still buffered, is longer, so the splitter never
    holds more than the limit plus one chunk. The stream is to be abandoned
    then (after relaying the events the exception carries); the splitter is
    not usable after.
    """

    __slots__ = ("_buf", "_limit", "_line_start", "_scan")

    def __init__(self, limit: int | None = None) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._line_start = 0  # start of the current, unterminated line in _buf
        self._scan = 0  # where the next line-terminator search starts in _buf

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned, for the caller's memory limit on runaway events."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> list[bytes]:
        """Adds upstream bytes and returns the events they complete, oldest first."""
        if not chunk:
            return []
        buf = self._buf
        buf += chunk
        end = len(buf)
        events: list[bytes] = []
        event_start = 0
        line_start = self._line_start
        pos = self._scan
        search = _LINE_END.search
        while (match := search(buf, pos)) is not None:
            term_start, term_end = match.span()
            if term_end == end and term_end - term_start == 1 and buf[term_start] == _CR:
                pos = term_start  # maybe half a CRLF: look at it again with the next chunk
                break
            if term_start == line_start:  # empty line: the event is complete
                self._check(term_end - event_start, events)
                events.append(bytes(buf[event_start:term_end]))
                event_start = term_end
            line_start = pos = term_end
        else:
            pos = end
        self._check(end - event_start, events)
        if event_start:
            del buf[:event_start]
        self._line_start = line_start - event_start
        self._scan = pos - event_start
        return events

    def _check(self, size: int, events: list[bytes]) -> None:
        if self._limit is not None and size > self._limit:
            raise EventTooLarge(self._limit, events)

    def flush(self) -> bytes:
        """Returns what is left at end of stream, to be relayed as is, and resets the splitter.

        Normally this is an incomplete event (the upstream was cut), which the
        SSE spec says must not be dispatched. The one exception is a bare-CR
        stream whose last event ends exactly at end of stream: its final CR was
        held back, so the tail is a complete event; parse it if it ends in an
        empty line.
        """
        tail = bytes(self._buf)
        self._buf = bytearray()
        self._line_start = 0
        self._scan = 0
        return tail


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: its type and its data lines joined with LF, as the SSE spec defines them."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None

    @property
    def is_done(self) -> bool:
        """True for OpenAI's end-of-stream sentinel, which is not JSON and must not be parsed as a chunk."""
        return self.data.strip() == DONE

    def json(self) -> Any:
        """Decodes the data as JSON; raises `orjson.JSONDecodeError` for non-JSON data such as ``[DONE]``."""
        return orjson.loads(self.data)


def parse_event(raw: bytes) -> SSEEvent | None:
    """Parses one raw event as the SSE spec does; None when it would not be dispatched.

    Comment-only events (``: keep-alive``), blank lines and events without any
    ``data`` field dispatch nothing, so callers can skip them with one test.
    Invalid UTF-8 is replaced rather than rejected, as browsers do, so a bad
    byte from the upstream never kills the relay.
    """
    text = raw.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):  # a BOM may open the stream, hence the first event
        text = text[1:]
    data: list[str] = []
    event = ""
    event_id: str | None = None
    retry: int | None = None
    for line in _LINE_END_TEXT.split(text):
        if not line or line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id" and "\0" not in value:
            event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            retry = int(value)
    if not data:
        return None
    return SSEEvent(data="\n".join(data), event=event or "message", id=event_id, retry=retry)


def looks_like_sse(head: bytes) -> bool | None:
    """Whether a body opening with ``head`` is an event stream, told by its bytes; None while too short to tell.

    Some upstreams stream SSE under another content type (the ChatGPT Codex
    backend), or none. A BOM and whitespace may come first; a JSON body opens
    with ``{`` or ``[``, anything else is not a stream either.
    """
    if head and _BOM.startswith(head):
        return None
    text = head.removeprefix(_BOM).lstrip()
    if not text:
        return None
    if text.startswith(_SSE_STARTS):
        return True
    return None if any(start.startswith(text) for start in _SSE_STARTS) else False


class _Parts(list[str]):
    """Fragments of a streamed string, joined once at the end to keep accumulation linear."""


def _accumulate(target: dict[str, Any], key: str, value: Any) -> None:
    """Applies one delta value the way streamed fields grow: strings append, lists extend, anything else replaces."""
    current = target.get(key)
    if isinstance(value, str):
        if isinstance(current, _Parts):
            current.append(value)
        else:
            target[key] = _Parts([value])
    elif isinstance(value, list):
        if type(current) is list:
            current.extend(value)
        else:
            target[key] = list(value)  # a copy: extending it must not alter the caller's chunk
    else:
        target[key] = value


def _merge(target: dict[str, Any], delta: Mapping[str, Any], first_wins: frozenset[str]) -> None:
    """Merges a nested delta object such as ``function`` or ``audio``.

    Identity fields (a function's name, an audio id) are sent whole, and some
    upstreams repeat them on every delta, so the first non-empty value is kept
    instead of concatenating copies; the payload fields grow.
    """
    for key, value in delta.items():
        if value is None:
            continue
        if key in first_wins:
            if not target.get(key):
                target[key] = value
        else:
            _accumulate(target, key, value)


def _render(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Turns accumulated fields into plain JSON values, detached from the assembler's state."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, _Parts):
            out[key] = "".join(value)
        elif isinstance(value, list):
            out[key] = list(value)
        elif isinstance(value, dict):
            out[key] = _render(value)
        else:
            out[key] = value
    return out


_NAME = frozenset({"name"})
#: Known nested message fields and their identity keys; other dict-valued fields are last-value-wins.
_NESTED: dict[str, frozenset[str]] = {"function_call": _NAME, "audio": frozenset({"id"})}


@dataclass(slots=True)
class _ToolCall:
    index: int
    id: str = ""
    type: str = ""
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # "function", "custom", ...
    extra: dict[str, Any] = field(default_factory=dict)

    def apply(self, delta: Mapping[str, Any]) -> None:
        for key, value in delta.items():
            if value is None or key == "index":
                continue
            if key in ("id", "type"):
                if isinstance(value, str) and value and not getattr(self, key):
                    setattr(self, key, value)
            elif isinstance(value, Mapping):
                _merge(self.objects.setdefault(key, {}), value, _NAME)
            else:
                self.extra[key] = value

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": self.type or "function"}
        for key, fields in self.objects.items():
            out[key] = _render(fields)
        if out["type"] == "function":
            function = out.setdefault("function", {})
            function.setdefault("name", "")
            function.setdefault("arguments", "")
        out.update(self.extra)
        return out


class StreamAssembler:
    """Rebuilds choice 0's assistant message from a Chat Completions stream, as if it had not been streamed.

    Feed it every parsed ``chat.completion.chunk`` (and ``{"error": ...}``
    objects) in order. Only choice 0 is assembled: the proxy stores a single
    assistant turn per request, and with ``n > 1`` the client picks one of the
    choices in a way the proxy cannot see, so the first is the best guess.

    Fields the proxy does not know are kept, because dropping them would
    corrupt the history for the providers that need them back
    (``reasoning_content``, ``reasoning``, signatures...): strings are
    concatenated, lists extended, other values last-value-wins. A null delta
    value means "nothing new" (OpenAI sends ``"refusal": null`` on every text
    chunk) and never creates or clears a field.

    Tool calls are keyed by their ``index``, which lets parallel calls
    interleave. Two upstream quirks are tolerated: a missing ``index`` (the
    call is matched by ``id``, or continues the last call), and a new ``id``
    reusing an index (it starts a new call, placed after the earlier one).
    """

    def __init__(self) -> None:
        self.id: str | None = None
        self.model: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self._role = "assistant"
        self._fields: dict[str, Any] = {}  # in first-seen order, so message() keeps the upstream's key order
        self._calls: list[_ToolCall] = []  # in creation order
        self._open: dict[int, _ToolCall] = {}  # index -> call that deltas with this index continue
        self._last_call: _ToolCall | None = None

    @property
    def finished(self) -> bool:
        """Whether the model ended its turn; False means the stream was cut and the message is partial."""
        return self.finish_reason is not None

    def feed(self, chunk: Mapping[str, Any]) -> None:
        """Takes one decoded stream chunk; anything that is not recognisably part of a chunk is ignored."""
        error = chunk.get("error")
        if isinstance(error, Mapping):
            self.error = dict(error)
        elif isinstance(error, str):
            self.error = {"message": error}
        for attr in ("id", "model"):
            value = chunk.get(attr)
            if isinstance(value, str) and value and getattr(self, attr) is None:
                setattr(self, attr, value)
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            self.usage = dict(usage)
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
                    self._apply_choice(choice)

    def message(self) -> dict[str, Any]:
        """Returns a fresh copy of the message so far: role and content always, other keys only if they arrived."""
        fields = _render(self._fields)
        msg: dict[str, Any] = {"role": self._role, "content": fields.pop("content", None)}
        msg.update(fields)
        if self._calls:
            calls = sorted(self._calls, key=lambda call: call.index)  # stable: reused indexes keep arrival order
            msg["tool_calls"] = [call.render() for call in calls]
        return msg

    def _apply_choice(self, choice: Mapping[str, Any]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, Mapping):
            self._apply_delta(delta)
        finish_reason = choice.get("finish_reason")
        if isinstance(finish_reason, str):
            self.finish_reason = finish_reason

    def _apply_delta(self, delta: Mapping[str, Any]) -> None:
        for key, value in delta.items():
            if value is None:
                continue
            if key == "role":
                if isinstance(value, str) and value:
                    self._role = value  # some upstreams repeat it on every chunk: never concatenate
            elif key == "tool_calls":
                if isinstance(value, list):
                    for position, call in enumerate(value):
                        if isinstance(call, Mapping):
                            self._tool_call_for(call, position).apply(call)
            elif key in _NESTED and isinstance(value, Mapping):
                nested = self._fields.get(key)
                if not isinstance(nested, dict):
                    nested = self._fields[key] = {}
                _merge(nested, value, _NESTED[key])
            else:
                _accumulate(self._fields, key, value)

    def _tool_call_for(self, delta: Mapping[str, Any], position: int) -> _ToolCall:
        index = delta.get("index")
        call_id = delta.get("id")
        if not isinstance(call_id, str):
            call_id = ""
        call: _ToolCall | None
        if isinstance(index, int) and not isinstance(index, bool):
            call = self._open.get(index)
            if call is not None and call_id and call.id and call.id != call_id:
                call = None  # same index, different id: a new call
        elif call_id:
            call = next((c for c in self._calls if c.id == call_id), None)
            index = call.index if call is not None else max(self._open, default=-1) + 1
        else:
            call = self._last_call
            index = call.index if call is not None else position
        if call is None:
            call = _ToolCall(index=index)
            self._calls.append(call)
            self._open[index] = call
        self._last_call = call
        return call


def is_usage_only(chunk: Mapping[str, Any]) -> bool:
    """Whether this is the trailing usage chunk that ``stream_options.include_usage`` adds.

    The proxy may request usage for its own accounting; a client that did not
    ask for it would otherwise receive a chunk without choices, which some
    clients index into and crash on. vLLM sends ``"choices": null`` or omits
    the key, so those count too; chunks that carry usage next to real choices
    (vLLM's continuous usage stats) do not.
    """
    choices = chunk.get("choices", None)
    return (choices is None or choices == []) and isinstance(chunk.get("usage"), Mapping)


def message_from_completion(body: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Returns choice 0's message and the usage of a non-streamed ``chat.completion``, as the upstream sent them.

    The objects are returned as is, not copied, so the history stores exactly
    what the model produced, unknown fields included. Either is None when the
    body lacks it (an error body, an empty choice list).
    """
    usage = body.get("usage")
    message: dict[str, Any] | None = None
    choices = body.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
                candidate = choice.get("message")
                if isinstance(candidate, dict):
                    message = candidate
                break
    return message, usage if isinstance(usage, dict) else None
