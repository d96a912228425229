"""The dialect interface: everything one wire API means to the proxy, in one class per API.

A dialect extends the engine's ``ItemModel`` (roles, pairing, identity, text:
see ``proxy.context.items``) with what the HTTP layer needs:

    request bytes ──parse──► ParsedRequest(payload, items) ──engine──► view items
                                                                          │
    upstream ◄──────────────── render(request, view items) ◄──────────────┘
       │
       ├─ JSON body ──reply_from_body──► reply items + usage ──► the log
       └─ SSE stream ──ReplyReader.feed (event by event, relayed unchanged)──► the log

plus the upstream's URL, the usage figures, the terminal event of a stream
(held back until the reply is logged, so a client that answers at once finds it
there), the events that may still be retried unseen (an overflow error before
any output), and the shape of a summary call in that API. Adding an API is one
new module with one ``Dialect`` subclass.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import orjson

from proxy.context.items import Item, ItemModel
from proxy.context.view.projection import FrozenEnds
from proxy.errors import BadRequest, openai_error
from proxy.settings import Settings

#: Values that cannot nest: an item made of them alone can always be written back.
_FLAT = (str, int, float, bool, type(None))


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated request: its bytes, its JSON object, and the conversation items inside it."""

    raw: bytes
    payload: dict[str, Any]
    items: list[Item]
    #: The request fields besides the tools that the model reads as part of the prompt (``Dialect.fixed_fields``).
    fixed_fields: tuple[str, ...] = ()

    @property
    def stream(self) -> bool:
        return self.payload.get("stream") is True

    @property
    def model(self) -> str | None:
        model = self.payload.get("model")
        return model if isinstance(model, str) else None

    @property
    def tools(self) -> list[Any] | None:
        tools = self.payload.get("tools")
        return tools if isinstance(tools, list) else None

    @property
    def fixed(self) -> list[Any] | None:
        """What the model reads of the request besides its items, which no compaction frees: the budget counts it
        in every estimate and threshold (``ContextBudgetPolicy``, as its ``tools``). The tool definitions and the
        dialect's ``fixed_fields``: a system prompt left out (Claude Code's ``system``, Codex's and pi's
        ``instructions``, Gemini CLI's ``systemInstruction``) put the estimate of a view applying a new checkpoint,
        with no usage figure for it yet, that much low, and it went upstream over the window (issue 35)."""
        fixed = [*(self.tools or ()), *(self.payload[name] for name in self.fixed_fields if self.payload.get(name))]
        return fixed or None


def answered_model(data: Any) -> str | None:
    """The model an upstream answer names, in a whole body or in one stream event: OpenAI's ``model`` (a Chat
    chunk's too), a Responses event's ``response.model``, an Anthropic ``message_start``'s ``message.model``,
    Gemini's ``modelVersion``. What the upstream answered with is what it bills, whatever name the client sent
    (a gateway routing ``gpt-4o-mini`` to ``gpt-4o``), so savings are priced by it."""
    if not isinstance(data, Mapping):
        return None
    for holder in (data, data.get("response"), data.get("message")):
        if isinstance(holder, Mapping):
            for name in ("model", "modelVersion"):
                value = holder.get(name)
                if isinstance(value, str) and value:
                    return value
    return None


class Verdict(enum.Enum):
    """What the relay does with one upstream event."""

    RELAY = "relay"
    #: Not for the client's eyes (usage the proxy asked for on its behalf).
    HIDE = "hide"
    #: The stream's last word: relayed only once the reply is in the log.
    TERMINAL = "terminal"


class ReplyReader(abc.ABC):
    """Reads one reply stream on the side: the items it adds to the conversation, its usage, its end."""

    usage: dict[str, Any] | None = None
    #: Whether the model ended its turn (False: the stream was cut and the reply is partial).
    finished: bool = False
    #: Whether any reply content arrived: an empty stream logs nothing.
    received: bool = False
    #: The reply's id, when the API gives one (``Dialect.reply_id``).
    reply_id: str | None = None

    @abc.abstractmethod
    def feed(self, event: str, data: Any) -> Verdict:
        """Take one event: its SSE ``event`` name and its data, decoded when JSON, else the raw text."""

    @abc.abstractmethod
    def items(self) -> list[Item]:
        """The reply's items so far, as the client will send them back."""

    @abc.abstractmethod
    def body(self) -> dict[str, Any]:
        """The reply so far as the non-streamed answer would hold it (what ``Dialect.summary_answer`` reads):
        a streamed summary is read as a whole one is."""


class Dialect(ItemModel):
    """One wire API. Subclasses are stateless singletons."""

    #: The request field holding the conversation.
    items_field: str
    #: Path below the upstream base that the front door posts to.
    path: str
    #: The door's path on the proxy (also below ``/s/{session}``): errors the proxy raises at it or under it
    #: take this API's shape (``error_body``).
    door: str
    #: Whether the API's requests go to ``--anthropic-upstream`` (else ``--upstream``).
    anthropic: bool = False
    #: Whether they go to ``--gemini-upstream`` (the model and the method are in the URL, not the body).
    gemini: bool = False
    #: Whether requests may carry back a ``compaction`` item the proxy handed out (Codex's remote compaction).
    carries_compaction_items: bool = False
    #: Headers the API requires, for a summary call whose caller sent none (an admin compaction).
    required_headers: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: Request fields that bound the answer's length: a summary call made from a client's request
    #: (``proxy.summarycall``) bounds its answer in the ones the client used.
    bound_fields: ClassVar[tuple[str, ...]] = ()
    #: Request fields a summary call made from a client's request leaves out: they shape the answer's form
    #: (stop sequences, a JSON format, several choices, audio…), and a summary is one plain text answer.
    summary_drops: ClassVar[frozenset[str]] = frozenset()
    #: The request field naming the model; None where the URL names it (the Gemini API).
    model_field: ClassVar[str | None] = "model"
    #: Request fields besides the items and the tools that the model reads as part of the prompt and the proxy
    #: forwards as they are: the system prompt where it is not an item, a structured answer's schema (counted whole,
    #: with the few tokens of options beside it). ``ParsedRequest.fixed`` counts them in every estimate.
    fixed_fields: ClassVar[tuple[str, ...]] = ()

    def upstream_url(self, settings: Settings, path: str | None = None) -> str:
        """Where this API's requests go: ``path`` (default: the front door's) below the right upstream."""
        base = settings.anthropic_base if self.anthropic else settings.upstream_base
        return base + (self.path if path is None else path)

    def at_door(self, path: str) -> bool:
        """Whether ``path`` (below any ``/s/{session}``) is at or under this API's door."""
        return path == self.door or path.startswith(self.door + "/")

    def error_body(self, status: int, message: str, *, type: str, code: str | None,
                   param: str | None) -> dict[str, Any]:
        """An error the proxy raises itself at this door, in the shape this API's clients read; OpenAI's unless
        the API has its own. ``type`` and ``code`` are the proxy's words (``proxy.errors``)."""
        return openai_error(message, type=type, code=code, param=param)

    def reply_id(self, body: Mapping[str, Any]) -> str | None:
        """The id of a non-streamed answer, when the API names one that a later request may continue from
        (the Responses API's ``previous_response_id``); it is logged with the reply."""
        return None

    def upstream_target(self, settings: Settings, request: ParsedRequest,
                        query: Mapping[str, str]) -> tuple[str, Mapping[str, str]]:
        """The URL and query string a client's ``request`` (sent with ``query``) goes upstream with."""
        return self.upstream_url(settings), query

    def summary_target(self, settings: Settings, model: str, request: ParsedRequest | None,
                       query: Mapping[str, str]) -> tuple[str, Mapping[str, str]]:
        """The URL and query string of a summary call to ``model``, made from the client's ``request`` (None: the
        canonical call) sent with ``query``."""
        return self.upstream_url(settings), query

    def usage_request(self, request: ParsedRequest) -> dict[str, Any] | None:
        """Fields to add so a streamed answer reports its usage, when the client did not ask for it itself;
        what they add is hidden from the client (``ReplyReader`` with ``hide_usage``)."""
        return None

    # -- requests -------------------------------------------------------------------------------

    def parse(self, raw: bytes, route: Mapping[str, str] | None = None) -> ParsedRequest:
        """Validate a request body (``route``: what the URL says of it, the Gemini API's model and method);
        ``BadRequest`` (a 4xx) for anything the proxy cannot work with. Its items are objects; what else an item
        must be is checked where it is new to its conversation (``checked_hash``)."""
        payload = parse_json(raw)
        if not isinstance(payload, dict):
            raise BadRequest("Request body must be a JSON object.", code="invalid_json")
        items = self.items_of(payload)
        check_writable({key: value for key, value in payload.items() if key != self.items_field})
        return ParsedRequest(raw, payload, items, self.fixed_fields)

    def item_problem(self, item: Item) -> Problem | None:
        """What is wrong with an item (an object) that this API's requests may not hold; None: nothing."""
        return None

    def check(self, item: Item, items: Sequence[Item]) -> None:
        """Refuse ``item``, one of the request's ``items``, with a 400 naming it (``messages[3].tool_calls``): what
        this API's requests may not hold (``item_problem``), and a ``type`` in it, or in a part of it, that is
        there but not a string (the dialects look types up in sets, where an object or an array is a
        ``TypeError``)."""
        problem = self.item_problem(item) or (("", _UNTYPED) if _untyped(item) else None)
        if problem is not None:
            index = next(i for i, other in enumerate(items) if other is item)  # for the error only
            where = f"{self.items_field}[{index}]{problem[0]}"
            raise BadRequest(f"{where} {problem[1]}", param=where)

    def checked_hash(self, item: Item, items: Sequence[Item]) -> str:
        """``hash``, for an item of the request's ``items`` new to its conversation: refused first if the API's
        requests may not hold it (``check``) or it could not be written back.

        The request path hashes only the items that are not in the
        conversation's previous request (``HistoryManager.hashes_for``), so each
        item is checked once, not on every step, and a request's checks grow
        with what is new. That is exact: an item equal to one of that request
        (a deep equality of the parsed JSON) passed these same checks, and none
        of them tells apart what the equality does not (key order, spacing;
        ``1``, ``1.0`` and ``true``). A first request, a short one, a new
        session or a restarted process has none kept: every item is checked.
        """
        self.check(item, items)
        for value in item.values():  # a flat item (most of a chat history) cannot nest: nothing to write
            if not isinstance(value, _FLAT):
                check_writable({self.items_field: [item]})
                break
        return self.hash(item)

    @abc.abstractmethod
    def items_of(self, payload: dict[str, Any]) -> list[Item]:
        """The conversation items of a request; ``BadRequest`` when malformed."""

    def render(self, request: ParsedRequest, items: Sequence[Item], extra: Mapping[str, Any] | None = None) -> bytes:
        """The upstream body: the client's payload with ``items`` (and ``extra`` fields) in place."""
        payload = dict(request.payload)
        payload[self.items_field] = list(items)
        if extra:
            payload.update(extra)
        return orjson.dumps(payload)

    @abc.abstractmethod
    def max_output(self, payload: Mapping[str, Any]) -> int | None:
        """Tokens the request reserves for the answer."""

    # -- replies --------------------------------------------------------------------------------

    @abc.abstractmethod
    def reply_from_body(self, body: Mapping[str, Any]) -> tuple[list[Item], dict[str, Any] | None, bool]:
        """A non-streamed answer's items, usage and whether it finished normally."""

    def reply_from_json(self, value: Any) -> tuple[list[Item], dict[str, Any] | None, bool]:
        """``reply_from_body`` for any JSON answer: the APIs whose answer is an object read only that."""
        return self.reply_from_body(value) if isinstance(value, dict) else ([], None, False)

    @abc.abstractmethod
    def reader(self, *, hide_usage: bool = False) -> ReplyReader:
        """A fresh reader for one streamed answer."""

    # -- summary calls --------------------------------------------------------------------------

    @abc.abstractmethod
    def summary_payload(self, model: str, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        """The canonical summary call, a non-streaming request of the proxy's own asking ``model`` for a summary:
        for when no client request is at hand to shape it (``proxy.summarycall``)."""

    def summary_fields(self, payload: Mapping[str, Any], model: str, bound: int) -> dict[str, Any]:
        """Fields a summary call made from the client's ``payload`` sets itself: ``bound`` in each output-bound
        field the client used, none when it used none (the upstream's default bounds it, as it bounds the
        client's own requests), since a field the client did not send may be one its upstream refuses."""
        return {name: bound for name in self.bound_fields if name in payload}

    @abc.abstractmethod
    def summary_answer(self, body: Mapping[str, Any]) -> tuple[str, bool, str]:
        """The summary text of an answer, whether it finished normally, and the upstream's word for how it ended;
        ``ValueError`` if it holds no text."""

    def session_hint(self, payload: Mapping[str, Any]) -> str | None:
        """A session id the client put in the body itself (used when no header names one)."""
        return None

    def upstream_manages(self, payload: Mapping[str, Any]) -> bool:
        """Whether the request asks the upstream to compact or clear its conversation itself (Anthropic's
        ``context_management`` edits, the Responses API's compaction or ``truncation``): the proxy then forwards
        the conversation as the client sent it, since an upstream that rewrites it would undo a proxy view, and
        the view would cost the prompt cache for nothing (``proxy.http.turn.Turn.as_sent``)."""
        return False

    def commits(self, data: Any) -> bool:
        """Whether relaying must start with this stream event: anything before it may be withheld and retried."""
        return True

    def refusal_of(self, data: Any) -> Any:
        """The part of a stream event that may say "prompt too long" (``proxy.overflow`` reads it)."""
        return data

    # -- the prompt cache (proxy.http.frontdoor) and the recall tool (proxy.http.recall) ----------

    def cache_fields(self, payload: Mapping[str, Any], session: str) -> dict[str, Any]:
        """Request fields that keep the provider's prompt cache warm for ``session``, where the client set none."""
        return {}

    def caches_tail(self, payload: Mapping[str, Any]) -> bool:
        """Whether the provider reads the request's prompt from its cache up to (near) its end, where the prefix is
        the previous request's: the cost of deferring a reduction mid-burst (``proxy.context.view.worth``). Yes
        where the provider caches implicitly (OpenAI, Gemini)."""
        return True

    def cache_hints(self, payload: Mapping[str, Any], items: list[Item], frozen: FrozenEnds, *,
                    adds_fields: bool) -> list[Item]:
        """``items`` (a view whose frozen prefix ends at ``frozen``) with the cache hints the API takes inline
        (``proxy.dialects.breakpoints``); ``adds_fields``: whether the upstream is known to take fields beyond the
        client's (``--add-fields``)."""
        return items

    @abc.abstractmethod
    def tool_definition(self, name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        """A function tool in this API's shape."""

    @abc.abstractmethod
    def reply_calls(self, items: Sequence[Item]) -> tuple[list[tuple[str, str, Any]], bool]:
        """The tool calls of a reply (call id, tool name, arguments) and whether it also says something."""

    @abc.abstractmethod
    def tool_result(self, call_id: str, text: str) -> Item:
        """The item answering call ``call_id`` with ``text``."""

    @abc.abstractmethod
    def may_call_only(self, data: Any, name: str) -> bool:
        """Whether a reply whose stream holds this event may still turn out to call only the tool ``name``
        (reasoning so far, or the start of a call to it); False once it says something or calls another tool."""


def with_fields(raw: bytes, fields: Mapping[str, Any]) -> bytes:
    """``raw``, a JSON object holding none of ``fields``, with them added at its start and the rest byte for byte:
    a request the proxy only adds to goes upstream as the client wrote it."""
    if not fields:
        return raw
    start = raw.index(b"{") + 1
    added = b",".join(orjson.dumps(name) + b":" + orjson.dumps(value) for name, value in fields.items())
    rest = raw[start:]
    return raw[:start] + added + (b"," if rest.lstrip()[:1] != b"}" else b"") + rest


def parse_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None


def check_writable(value: Any) -> None:
    """Refuse what orjson could read but not write (254 levels, where it reads 1024), before hashing, logging
    or forwarding tries to: a 400, never a 500. ``value`` is wrapped as deep as it sits in the request."""
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise BadRequest(f"Request body cannot be processed: {exc} (nested too deeply).", code="invalid_json") from None


#: What is wrong with an item: the path below it ('' for the item itself, '.content') and what it must be.
Problem = tuple[str, str]


def require_items(payload: Mapping[str, Any], field: str, *, allow_string: bool = False) -> list[Item]:
    """``payload[field]`` as a non-empty list of objects; ``BadRequest`` otherwise, naming the item (``messages[3]``).
    A request of a long session carries hundreds of items: they are told apart from anything else in C, and the
    name is made only for the error."""
    value = payload.get(field)
    if allow_string and isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise BadRequest(f"'{field}' must be a non-empty array of objects.", param=field)
    if set(map(type, value)) != {dict}:
        where = f"{field}[{next(i for i, item in enumerate(value) if type(item) is not dict)}]"
        raise BadRequest(f"{where} must be an object.", param=where)
    return value


#: Fields whose arrays hold typed parts: content blocks and parts, tool calls, reasoning summaries, tool outputs.
_PART_FIELDS = frozenset({"content", "tool_calls", "summary", "output"})


_UNTYPED = "has a type that is not a string: a type must be a string."


def _untyped(value: Item) -> bool:
    """Whether ``value``, or a part in it at any depth of ``_PART_FIELDS``' arrays, has a ``type`` that is there
    but not a string (depth is bounded by orjson's 1024 levels, two a step: within Python's recursion limit)."""
    kind = value.get("type")
    if kind is not None and type(kind) is not str:
        return True
    for field, parts in value.items():
        if type(parts) is list and field in _PART_FIELDS:
            for part in parts:
                if type(part) is dict and _untyped(part):
                    return True
    return False


def role_problem(message: Item) -> Problem | None:
    """A message of the Chat Completions or Messages API: an object with a string ``role``."""
    return None if type(message.get("role")) is str else ("", "must be an object with a string 'role'.")


def positive_int(payload: Mapping[str, Any], *names: str) -> int | None:
    """The first of ``names`` holding a positive integer (bool excluded)."""
    for name in names:
        value = payload.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def text_of(content: Any, text_types: frozenset[str]) -> tuple[list[str], int]:
    """Texts of a content value (a string or a list of typed parts), and the count of non-text parts."""
    if isinstance(content, str):
        return [content], 0
    texts: list[str] = []
    non_text = 0
    if isinstance(content, list):
        for part in content:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str) and part.get("type", "text") in text_types:
                texts.append(text)
            else:
                non_text += 1
    return texts, non_text
