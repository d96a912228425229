"""The Gemini API (``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent``), as Gemini CLI
speaks it.

Items are ``contents`` entries ``{role: "user"|"model", parts: [...]}``; a part is ``text``, ``functionCall
{id?, name, args}``, ``functionResponse {id?, name, response}``, ``inlineData`` or ``fileData``, and may carry a
``thoughtSignature``. The model and the method are in the URL, not the body (``GeminiRequest``); the system prompt
is the ``systemInstruction`` field, which the proxy never touches. A user entry carrying function responses
continues the turn (role ``tool`` to the engine); only one without them opens a turn. Calls and responses pair by
``id`` where the part has one, else by name and order within the entry (``name#k``): Gemini answers a model entry's
calls in the next user entry, in order. A signed call travels inside its entry, so the kept tail, where Gemini 3
checks the signatures of the current turn, is byte-identical.

Identity sees through what Gemini CLI changes when it keeps a reply: it drops ``thought: true`` parts, joins the
text parts of a stream into one, and renames call ids to ``{name}__{id}``; so ids, thoughts and the text's cut
are not part of it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from proxy.context.items import Answer, Item, Path, Role, get_path
from proxy.dialects.base import Dialect, ParsedRequest, Problem, ReplyReader, Verdict, positive_int, require_items
from proxy.errors import BadRequest
from proxy.settings import Settings

#: ``finishReason`` values of an answer that ended as the model meant it to.
FINISHED = frozenset({"STOP"})
STREAM_METHOD = "streamGenerateContent"
#: The methods the front door answers (every other one passes through).
METHODS = frozenset({"generateContent", STREAM_METHOD, "countTokens"})
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: Fields of ``generationConfig`` that shape the answer's form: a summary is one plain text answer.
_FORM_FIELDS = frozenset({"responseMimeType", "responseSchema", "responseJsonSchema", "stopSequences",
                          "candidateCount", "responseModalities", "responseLogprobs", "logprobs"})


@dataclass(frozen=True, slots=True)
class GeminiRequest(ParsedRequest):
    """A Gemini request: its body, and the API version, model and method its URL names."""

    version: str = "v1beta"
    model_name: str = ""
    method: str = "generateContent"

    @property
    def stream(self) -> bool:
        return self.method == STREAM_METHOD

    @property
    def model(self) -> str | None:
        return self.model_name or None


def _parts(item: Item) -> list[dict[str, Any]]:
    parts = item.get("parts")
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def _keyed(parts: Sequence[Any], field: str) -> list[tuple[str, int, Mapping[str, Any]]]:
    """The pairing key of each ``field`` (``functionCall`` / ``functionResponse``) part, with its position in
    ``parts`` and the part's value."""
    seen: dict[str, int] = {}
    out = []
    for index, part in enumerate(parts):
        value = part.get(field) if isinstance(part, Mapping) else None
        if not isinstance(value, Mapping):
            continue
        name, call_id = str(value.get("name") or "?"), value.get("id")
        if isinstance(call_id, str) and call_id:
            out.append((f"{name}={call_id}", index, value))
            continue
        seen[name] = seen.get(name, 0) + 1
        out.append((f"{name}#{seen[name]}", index, value))
    return out


def _keys(parts: Sequence[Mapping[str, Any]], field: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The pairing key of each ``field`` part, with the part's value."""
    return [(key, value) for key, _, value in _keyed(parts, field)]


def _response_fields(value: Mapping[str, Any]) -> tuple[str, ...]:
    """The fields of a function response's ``response`` the engine reads, in order: a non-empty ``error`` string,
    then an ``output`` string.

    Gemini CLI answers a success with ``{"output": text}`` (``convertToFunctionResponse``: a tool's text, or
    ``Binary content provided (N item(s)).`` beside an image or a PDF it read), a call that failed, was refused or
    was cancelled before it ran with ``{"error": message}`` (its schedulers' ``createErrorResponse``), and one
    cancelled after it ran with both (``createCancelledResult`` adds ``[Operation Cancelled] …`` to what the tool
    returned). Both are read, the error first: it is what ended the call, and the readers look at a result's
    opening for that. The clients' cancellation and refusal wordings (``proxy.context.keep.refusals``) are
    matched there, so a call cancelled after it ran reads as declined, and a failed result whose words mark no
    error line gives its first line as its error (the trail's ``error: <line>``, the literals, a masked output's
    kept lines): the cancellation, where the output first read it gave the output's first line (``Command was
    cancelled by user before it could complete. Below is the output …``) and a write's cancellation read
    ``Successfully overwrote file``. A line the output does mark (an ``Error:`` a build printed before it was
    stopped) is still read, and kept as its error. A response with neither field (``{}``: a tool whose content
    held no text; a passthrough object) states no text, and is still one result of its own.
    """
    body = value.get("response")
    if not isinstance(body, Mapping):
        return ()
    error, output = body.get("error"), body.get("output")
    return (*(("error",) if isinstance(error, str) and error else ()),
            *(("output",) if isinstance(output, str) else ()))


def _identity_parts(parts: Sequence[Mapping[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for part in parts:
        if part.get("thought") is True:
            continue
        if set(part) <= {"text", "thoughtSignature"} and isinstance(part.get("text"), str):
            if out and isinstance(out[-1], str):
                out[-1] += part["text"]
            else:
                out.append(part["text"])
            continue
        kept = dict(part)
        for field in ("functionCall", "functionResponse"):
            value = kept.get(field)
            if isinstance(value, Mapping):
                kept[field] = {k: v for k, v in value.items() if k != "id"}
        out.append(kept)
    return [p.strip() if isinstance(p, str) else p for p in out if p != ""]


#: Google's canonical status names, by HTTP status (google.rpc.Code): what an error's ``status`` says.
STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                405: "UNIMPLEMENTED", 408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT",
                426: "FAILED_PRECONDITION", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
                501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
#: The API versions the door answers (``GOOGLE_GENAI_API_VERSION``): ``v1`` is the OpenAI door's.
VERSIONS = ("v1beta", "v1alpha")


class GeminiDialect(Dialect):
    name = "gemini"
    items_field = "contents"
    path = "/v1beta/models"
    door = "/v1beta"
    gemini = True
    model_field: ClassVar[str | None] = None
    summary_drops = frozenset({"toolConfig", "cachedContent"})
    #: Gemini CLI's system instruction is about 6,350 tokens of its 9,600-token head; left out, a view applying a new
    #: checkpoint was estimated that much low and went upstream over a 16k window (issue 35). ``generationConfig``
    #: holds a structured answer's schema; the answer's room is its ``maxOutputTokens`` (``max_output``).
    fixed_fields = ("systemInstruction", "toolConfig", "generationConfig")

    # -- requests -------------------------------------------------------------------------------

    def parse(self, raw: bytes, route: Mapping[str, str] | None = None) -> GeminiRequest:
        route = route or {}
        model = route.get("model", "")
        if not _MODEL.match(model):
            raise BadRequest(f"Unknown model name {model!r}.", param="model")
        parsed = super().parse(raw, route)
        return GeminiRequest(parsed.raw, parsed.payload, parsed.items, parsed.fixed_fields,
                             version=route.get("version", "v1beta"),
                             model_name=model, method=route.get("method", "generateContent"))

    def items_of(self, payload: dict[str, Any]) -> list[Item]:
        return require_items(payload, "contents")

    def item_problem(self, item: Item) -> Problem | None:
        if not isinstance(item.get("parts"), list):
            return ".parts", "must be an array (a content is an object with a 'parts' array)."
        role = item.get("role")
        if role is not None and not isinstance(role, str):
            return ".role", "must be a string."
        return None

    def at_door(self, path: str) -> bool:
        return any(path == f"/{version}" or path.startswith(f"/{version}/") for version in VERSIONS)

    def error_body(self, status: int, message: str, *, type: str, code: str | None,
                   param: str | None) -> dict[str, Any]:
        """Gemini clients read ``{"error": {"code": int, "message": str, "status": str}}``."""
        return {"error": {"code": status, "message": message, "status": STATUS_NAMES.get(status, "UNKNOWN")}}

    def upstream_target(self, settings: Settings, request: ParsedRequest,
                        query: Mapping[str, str]) -> tuple[str, Mapping[str, str]]:
        if not isinstance(request, GeminiRequest):
            raise TypeError("a Gemini request is a GeminiRequest")
        url = self._url(settings, request.version, request.model_name, request.method)
        return url, self.upstream_query(settings, query)

    def summary_target(self, settings: Settings, model: str, request: ParsedRequest | None,
                       query: Mapping[str, str]) -> tuple[str, Mapping[str, str]]:
        """Always ``:generateContent`` (one JSON answer), under the client's API version; ``alt`` goes."""
        version = request.version if isinstance(request, GeminiRequest) else "v1beta"
        kept = {k: v for k, v in query.items() if k != "alt"}
        return self._url(settings, version, model, "generateContent"), self.upstream_query(settings, kept)

    @staticmethod
    def _url(settings: Settings, version: str, model: str, method: str) -> str:
        return f"{settings.gemini_base}/{version}/models/{model}:{method}"

    @staticmethod
    def upstream_query(settings: Settings, query: Mapping[str, str]) -> Mapping[str, str]:
        """The query string; the client's ``key`` goes when ``--gemini-upstream-key`` replaces it."""
        if settings.gemini_upstream_key is None or "key" not in query:
            return query
        return {k: v for k, v in query.items() if k != "key"}

    def max_output(self, payload: Mapping[str, Any]) -> int | None:
        config = payload.get("generationConfig")
        return positive_int(config, "maxOutputTokens") if isinstance(config, Mapping) else None

    # -- items ----------------------------------------------------------------------------------

    def role(self, item: Item) -> Role:
        role = item.get("role")
        if role == "model":
            return "assistant"
        if role in ("user", None):
            return "tool" if any("functionResponse" in p for p in _parts(item)) else "user"
        return "other"

    def calls(self, item: Item) -> tuple[str, ...]:
        return tuple(key for key, _ in _keys(_parts(item), "functionCall")) if item.get("role") == "model" else ()

    def results(self, item: Item) -> tuple[str, ...]:
        if item.get("role") == "model":
            return ()
        return tuple(key for key, _, _ in _keyed(item.get("parts") or (), "functionResponse"))

    def answers(self, item: Item) -> tuple[Answer, ...]:
        """Each ``functionResponse`` part is one result: its key, and the paths of its ``error`` and ``output``
        (``_response_fields``: none for a response that states no text, so the results after it keep their own)."""
        if item.get("role") == "model":
            return ()
        return tuple(Answer(key, tuple(("parts", index, "functionResponse", "response", field)
                                       for field in _response_fields(value)))
                     for key, index, value in _keyed(item.get("parts") or (), "functionResponse"))

    def identity(self, item: Item) -> Any:
        return {"role": item.get("role") or "user", "parts": _identity_parts(_parts(item))}

    def text(self, item: Item) -> tuple[str, int]:
        texts: list[str] = []
        non_text = 0
        for part in _parts(item):
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part.get("functionCall"), Mapping):
                call = part["functionCall"]
                texts.append(f"{call.get('name')} {orjson.dumps(call.get('args')).decode()}")
            elif isinstance(part.get("functionResponse"), Mapping):
                response = part["functionResponse"]
                texts.append(f"{response.get('name')} {orjson.dumps(response.get('response')).decode()}")
            else:
                non_text += 1
        return "\n".join(texts), non_text

    def with_summary(self, item: Item | None, text: str) -> Item:
        if item is None:
            return {"role": "user", "parts": [{"text": text}]}
        return {**item, "parts": [{"text": text}, *(item.get("parts") or [])]}

    def result_paths(self, item: Item) -> list[Path]:
        """Every answer's paths (``answers``): a cancelled call's ``error`` and ``output`` both."""
        return [path for answer in self.answers(item) for path in answer.paths]

    def result_failed(self, item: Item, path: Path) -> bool:
        """A function response holding an ``error``: Gemini CLI answers a call that failed, was cancelled or was
        refused with ``{"error": message}`` (its schedulers' ``createErrorResponse``; beside the ``output`` of a
        call cancelled after it ran), a success with ``{"output": text}`` only (``convertToFunctionResponse``)."""
        body = get_path(item, path[:-1])
        return isinstance(body, Mapping) and bool(body.get("error"))

    def call_of(self, item: Item, call_id: str) -> tuple[str, Any] | None:
        if item.get("role") != "model":
            return None
        for key, call in _keys(_parts(item), "functionCall"):
            if key == call_id:
                return str(call.get("name") or "?"), call.get("args")
        return None

    def user_text(self, item: Item) -> str | None:
        if item.get("role") not in ("user", None):
            return None
        texts = [p["text"] for p in _parts(item) if isinstance(p.get("text"), str)]
        return "\n".join(texts) if texts else None

    # -- replies --------------------------------------------------------------------------------

    def reply_from_body(self, body: Mapping[str, Any]) -> tuple[list[Item], dict[str, Any] | None, bool]:
        reader = GeminiReader()
        reader.feed("", body)
        return reader.items(), reader.usage, reader.finished

    def reply_from_json(self, value: Any) -> tuple[list[Item], dict[str, Any] | None, bool]:
        """A JSON answer is one response object, or (``:streamGenerateContent`` without ``alt=sse``) an array of
        the chunks a stream would send."""
        if not isinstance(value, list):
            return super().reply_from_json(value)
        reader = GeminiReader()
        for chunk in value:
            reader.feed("", chunk)
        return reader.items(), reader.usage, reader.finished

    def reader(self, *, hide_usage: bool = False) -> ReplyReader:
        return GeminiReader()

    def prompt_tokens(self, usage: Mapping[str, Any]) -> int | None:
        value = usage.get("promptTokenCount")
        return value if isinstance(value, int) else None

    def cached_tokens(self, usage: Mapping[str, Any]) -> int | None:
        value = usage.get("cachedContentTokenCount")
        return value if isinstance(value, int) else None

    def output_tokens(self, usage: Mapping[str, Any]) -> int | None:
        """The answer's tokens and the thinking before it (Gemini bills both as output)."""
        parts = [usage.get(key) for key in ("candidatesTokenCount", "thoughtsTokenCount")]
        numbers = [part for part in parts if isinstance(part, int)]
        return sum(numbers) if numbers else None

    # -- the recall tool ------------------------------------------------------------------------

    def tool_definition(self, name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"functionDeclarations": [{"name": name, "description": description,
                                          "parametersJsonSchema": parameters}]}

    def reply_calls(self, items: Sequence[Item]) -> tuple[list[tuple[str, str, Any]], bool]:
        calls, text = [], False
        for item in items:
            parts = _parts(item)
            text = text or any(p.get("text") and p.get("thought") is not True for p in parts)
            calls += [(key, str(call.get("name")), call.get("args")) for key, call in _keys(parts, "functionCall")]
        return calls, text

    def tool_result(self, call_id: str, text: str) -> Item:
        """The response to the call keyed ``call_id`` (``name=id`` or ``name#k``, from ``calls``)."""
        name, sep, rest = call_id.partition("=")
        response: dict[str, Any] = {"name": name if sep else call_id.partition("#")[0], "response": {"output": text}}
        if sep:
            response["id"] = rest
        return {"role": "user", "parts": [{"functionResponse": response}]}

    def may_call_only(self, data: Any, name: str) -> bool:
        for part in _chunk_parts(data):
            if part.get("thought") is True:
                continue
            call = part.get("functionCall")
            other = not isinstance(call, Mapping) or call.get("name") != name
            if other and (part.get("text") or call is not None):
                return False
        return True

    # -- summary calls --------------------------------------------------------------------------

    def summary_payload(self, model: str, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        return {"systemInstruction": {"parts": [{"text": system}]},
                "contents": [{"role": "user", "parts": [{"text": user}]}],
                "generationConfig": {"maxOutputTokens": max_tokens}}

    def summary_fields(self, payload: Mapping[str, Any], model: str, bound: int) -> dict[str, Any]:
        """The client's ``generationConfig`` without what shapes the answer's form, bounded by ``bound`` where the
        client bounded its own answers."""
        config = payload.get("generationConfig")
        if not isinstance(config, Mapping):
            return {}
        kept = {k: v for k, v in config.items() if k not in _FORM_FIELDS}
        if "maxOutputTokens" in kept:
            kept["maxOutputTokens"] = bound
        return {"generationConfig": kept}

    def summary_answer(self, body: Mapping[str, Any]) -> tuple[str, bool, str]:
        items, _, _ = self.reply_from_body(body)
        texts = [p["text"] for item in items for p in _parts(item)
                 if isinstance(p.get("text"), str) and p.get("thought") is not True]
        if not texts:
            raise ValueError("the summary answer holds no text part")
        reason = _candidate(body).get("finishReason")
        return "".join(texts), reason in FINISHED, str(reason) if reason else "missing"


def _candidate(data: Any) -> Mapping[str, Any]:
    candidates = data.get("candidates") if isinstance(data, Mapping) else None
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    return first if isinstance(first, Mapping) else {}


def _chunk_parts(data: Any) -> list[Mapping[str, Any]]:
    content = _candidate(data).get("content")
    parts = content.get("parts") if isinstance(content, Mapping) else None
    return [p for p in parts if isinstance(p, Mapping)] if isinstance(parts, list) else []


class GeminiReader(ReplyReader):
    """Joins the chunks of candidate 0 into one model entry: adjacent text parts of the same kind (thought or not)
    become one, as the client keeps them; every other part, its ``thoughtSignature`` included, stays as sent. The
    chunk with a ``finishReason`` is the stream's last word."""

    def __init__(self) -> None:
        self._parts: list[dict[str, Any]] = []
        self._finish: Any = None

    def feed(self, event: str, data: Any) -> Verdict:
        if not isinstance(data, Mapping):
            return Verdict.RELAY
        for part in _chunk_parts(data):
            self._add(dict(part))
        usage = data.get("usageMetadata")
        if isinstance(usage, Mapping):
            self.usage = dict(usage)
        finish = _candidate(data).get("finishReason")
        if finish is not None:
            self._finish, self.finished = finish, True
            return Verdict.TERMINAL
        return Verdict.RELAY

    def _add(self, part: dict[str, Any]) -> None:
        self.received = True
        last = self._parts[-1] if self._parts else None
        if last is not None and _plain_text(last) and _plain_text(part) and last.get("thought") == part.get("thought"):
            last["text"] += part["text"]
            if "thoughtSignature" in part:
                last["thoughtSignature"] = part["thoughtSignature"]
            return
        self._parts.append(part)

    def items(self) -> list[Item]:
        return [{"role": "model", "parts": [dict(p) for p in self._parts]}] if self._parts else []

    def body(self) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": [dict(p) for p in self._parts]},
                                     "index": 0}
        if self._finish is not None:
            candidate["finishReason"] = self._finish
        return {"candidates": [candidate] if self.received else [], "usageMetadata": self.usage}


def _plain_text(part: Mapping[str, Any]) -> bool:
    return isinstance(part.get("text"), str) and set(part) <= {"text", "thought", "thoughtSignature"}


DIALECT = GeminiDialect()
