"""Recognise an upstream refusal that means "the prompt does not fit the context window".

Why: the proxy compacts to a token budget it can only estimate; when the estimate is
wrong the upstream refuses, and the useful reaction is to compact harder and retry.
Providers word that refusal differently, so the recognisers live in one table
(`_TABLE`, each row backed by a real payload in tests/test_overflow.py). Pure, no I/O,
never raises. Signals in order of trust: error ``code``, ``type``, message regexes.
Vetoes run first, because a false positive throws context away for nothing:

* Status: 400, 413, 422 (TGI) and 500 only, or 200 carrying an error object (a stream
  whose first event is ``data: {"error": ...}``, as OpenRouter sends; its numeric
  ``code`` then stands in for the status). 500 still needs an overflow signal; it is
  admitted because llama.cpp before its 400 fix and ik_llama.cpp answer 500. 401/403/
  429 never count; nor do 502/503/504: a shorter prompt does not fix an overload.
* Rate-limit wording ("tokens per minute (TPM)"): Groq sends its TPM refusal as 413.
* An output budget at least as large as the window: no prompt compaction can fit it.

413 counts when the body says it is about size (Anthropic's ``request_too_large``, a
gateway's "Request Entity Too Large"): the limit is on bytes, not tokens, but the bytes
are the conversation and compaction shrinks them. A bare 413 does not: nothing says
whose limit it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

__all__ = ["Overflow", "Reason", "classify_overflow", "classify_sse_event", "error_object"]

Reason = Literal["code", "type", "message"]  # which signal decided, most trusted first
_MAX_TEXT = 65536  # error messages are short; this bounds regex work on HTML pages
_STATUSES = frozenset({400, 413, 422, 500})
_FLAGS = re.IGNORECASE | re.DOTALL


@dataclass(frozen=True, slots=True)
class Overflow:
    """A context-window refusal: which row recognised it, on what signal, and the numbers it states."""

    provider: str
    reason: Reason
    prompt_tokens: int | None
    limit_tokens: int | None


@dataclass(frozen=True, slots=True)
class _Row:
    """One provider. codes/types/patterns decide; headers and hint only say who answered."""

    provider: str
    codes: frozenset[str] = frozenset()
    types: frozenset[str] = frozenset()
    patterns: tuple[re.Pattern[str], ...] = ()
    headers: frozenset[str] = frozenset()
    hint: Callable[[Mapping[str, Any]], bool] | None = None


def _re(*alternatives: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(a, _FLAGS) for a in alternatives)


_CTX = frozenset({"context_length_exceeded"})
_P, _L, _O = (rf"(?P<{name}>\d+)" for name in ("prompt", "limit", "output"))

# Order breaks ties in attribution, so the generic OpenAI wording comes first and
# the catch-all last. Named groups feed prompt_tokens/limit_tokens (and the output veto).
_TABLE: tuple[_Row, ...] = (
    _Row("openai", _CTX, patterns=_re(
        rf"maximum context length is {_L} tokens", r"your input exceeds the context window of this model",
        rf"\({_P} in your prompt; {_O} for the completion\)"),
        headers=frozenset({"openai-organization", "openai-processing-ms", "openai-version"})),
    _Row("azure", _CTX, patterns=_re(rf"input tokens exceed the configured limit of {_L} tokens"),
         headers=frozenset({"apim-request-id", "x-ms-region", "azureml-model-session"})),
    _Row("anthropic", types=frozenset({"request_too_large"}), patterns=_re(
        rf"prompt is too long(?:: {_P} tokens > {_L} maximum)?",
        rf"input length and `?max_tokens`? exceed context limit: {_P} \+ {_O} > {_L}",
        r"exceeds the maximum allowed number of bytes"), headers=frozenset({"anthropic-organization-id"})),
    _Row("groq", _CTX, patterns=_re(r"^\s*please reduce the length of the messages or completion\.?\s*$"),
         headers=frozenset({"x-groq-region"})),
    _Row("cerebras", _CTX, patterns=_re(rf"current length is {_P} while limit is {_L}")),
    _Row("deepseek", patterns=_re(rf"\({_P} in the messages, {_O} in the completion\)"),
         hint=lambda e: e.get("code") == "invalid_request_error"),
    _Row("vllm", patterns=_re(
        rf"is too large: {_O}\. this model's maximum context length is {_L} tokens and your request has {_P} input",
        rf"your request has {_P} input tokens",
        rf"requested {_O} output tokens and your prompt contains (?:at least )?{_P} input tokens",
        r"your prompt contains \d+ characters \(more than \d+ characters"),
        hint=lambda e: e.get("type") == "BadRequestError"),
    _Row("sglang", patterns=_re(
        rf"the input \({_P} tokens\) is longer than the model's context length \({_L} tokens\)",
        rf"input length \({_P} tokens\) exceeds the maximum allowed length \({_L} tokens\)"),
        hint=lambda e: e.get("type") == "BadRequestError"),
    _Row("llamacpp", frozenset({"exceed_context_size_error"}), frozenset({"exceed_context_size_error"}), _re(
        rf"request \({_P} tokens\) exceeds the available context size \({_L} tokens\)",
        r"exceeds the available context size", r"context size has been exceeded"),
        hint=lambda e: "n_ctx" in e),
    _Row("lmstudio", patterns=_re(
        rf"trying to keep the first {_P} tokens when context the overflows.*?context length of only {_L} tokens",
        rf"reached context length of {_L} tokens")),
    _Row("gemini", patterns=_re(rf"input token count \({_P}\) exceeds the maximum number of tokens allowed \({_L}\)"),
        hint=lambda e: e.get("status") == "INVALID_ARGUMENT"),
    _Row("mistral", patterns=_re(
        rf"prompt contains {_P} tokens and \d+ draft tokens, too large for model with {_L} maximum context length")),
    _Row("openrouter", patterns=_re(
        rf"this endpoint's maximum context length is {_L} tokens", rf"{_P} of text input(?:, {_O} in the output)?"),
        headers=frozenset({"x-generation-id"}), hint=lambda e: isinstance(e.get("metadata"), Mapping)),
    _Row("xai", patterns=_re(rf"maximum prompt length is {_L} but the request contains {_P} tokens")),
    _Row("tgi", patterns=_re(
        rf"`inputs` tokens \+ `max_new_tokens` must be <= {_L}\. given: {_P} `inputs` tokens and {_O} `max_new",
        rf"`inputs` must have less than {_L} tokens\. given: {_P}")),
    _Row("bedrock", patterns=_re(r"input is too long for requested model")),
    _Row("http", frozenset({"request_too_large", "payload_too_large"}),
         patterns=_re(r"(?:request entity|payload) too large")),
    _Row("generic", frozenset({"context_window_exceeded"}), patterns=_re(
        r"context[ _](?:length|window)[ _]exceeded", r"contextwindowexceedederror",
        r"maximum context length (?:was |has been )?exceeded",
        r"exceeds? (?:the )?(?:model'?s? )?(?:maximum )?context (?:length|window|size)")),
)
_CODES = frozenset(code for row in _TABLE for code in row.codes)
_TYPES = frozenset(kind for row in _TABLE for kind in row.types)
_PATTERNS = tuple(p for row in _TABLE for p in row.patterns)
# Numbers only, never a trigger: Azure repeats OpenAI's "resulted in", and a bare total ("you requested
# about N tokens") is only an upper bound on the prompt, so it is read last.
_EXTRACTORS = (*(p for p in _PATTERNS if p.groupindex),
               *_re(rf"your messages resulted in {_P} tokens", rf"you requested (?:about )?{_P} tokens"))

_VETO_CODES = frozenset({"rate_limit_exceeded", "rate_limit_error", "insufficient_quota", "resource_exhausted",
                         "overloaded_error", "authentication_error", "permission_error", "invalid_api_key"})
_RATE = re.compile(r"rate[ _-]?limit|per (?:minute|min|hour|day)\b|\b[tr]p[md]\b", _FLAGS)
_SSE_START = re.compile(r"\s*(?:data|error|event|id|retry)?:")
_SSE_FIELD = re.compile(r"^(data|error):[ ]?(.*)$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class _View:
    """What the checks read: every code, type and message, including an error nested by a router."""

    codes: frozenset[str]
    types: frozenset[str]
    text: str


def error_object(body: object) -> Mapping[str, Any] | None:
    """The error object in any shape providers use, or None when the body is not an error.

    Handles ``{"error": {...}}`` (OpenAI, Anthropic's ``{"type":"error","error":{...}}``),
    ``{"error": "text"}`` (xAI, TGI: siblings such as ``code`` are kept), vLLM's and
    Mistral's top-level ``{"object":"error","message":...}``, a list wrapping one of these
    (Gemini's ``[{"error": {...}}]``), and a non-JSON body, whose text becomes the message.
    """
    return _error_object(body, 0)


def _error_object(body: object, depth: int) -> Mapping[str, Any] | None:
    if depth > 4 or body is None:
        return None
    if isinstance(body, Mapping):
        return _from_mapping(body)
    if isinstance(body, list | tuple):
        return next((e for item in body[:8] if (e := _error_object(item, depth + 1)) is not None), None)
    text = _as_text(body)
    if text is None or not text.strip():
        return None
    ok, parsed = _loads(text)
    if ok and not isinstance(parsed, str):
        return _error_object(parsed, depth + 1)
    message = (parsed if isinstance(parsed, str) else text).strip()
    return {"message": message[:_MAX_TEXT]} if message else None


def _from_mapping(body: Mapping[Any, Any]) -> Mapping[str, Any] | None:
    err = body.get("error")
    if isinstance(err, Mapping):
        return err
    if isinstance(err, str) and err.strip():
        return {**{k: body[k] for k in ("code", "type", "param") if k in body}, "message": err}
    for key in ("message", "detail"):
        if isinstance(body.get(key), str) and "choices" not in body:
            return {**body, "message": body[key]}
    return None


def classify_overflow(
    status: int, body: bytes | str | Mapping[str, Any] | None, headers: Mapping[str, str] | None = None
) -> Overflow | None:
    """Whether an upstream answer says the prompt is too long for the window, or None.

    `body` may be raw bytes, text, an already-parsed JSON value, or a whole SSE
    stream (only its first event is read). A 200 counts only when it carries a
    JSON error object; its embedded numeric ``code`` is then gated like a status.
    """
    value: object = body
    text = _as_text(body)
    if text is not None and _SSE_START.match(text):
        value = text = _sse_payload(text)
        if text is None:
            return None
    if status == 200:
        if text is not None:
            value = _loads(text)[1]  # None when not JSON: a 200 counts only with a JSON error
        if not isinstance(value, Mapping | list):
            return None
    err = error_object(value)
    if err is None:
        return None
    if status == 200:
        code = err.get("code")
        status = code if type(code) is int else 400
    return _classify(status, err, frozenset(k.lower() for k in (headers or {}) if isinstance(k, str)))


def classify_sse_event(data: str | bytes) -> Overflow | None:
    """The same decision for one SSE event: its ``data:`` payload or its raw lines (old llama.cpp
    streamed the refusal in an ``error:`` field, not ``data:``)."""
    return classify_overflow(200, data)


def _classify(status: int, err: Mapping[str, Any], headers: frozenset[str]) -> Overflow | None:
    if status not in _STATUSES:
        return None
    view = _view(err, 0)
    if view.codes & _VETO_CODES or view.types & _VETO_CODES or _RATE.search(view.text):
        return None
    reason: Reason = "code" if view.codes & _CODES else "type" if view.types & _TYPES else "message"
    if reason == "message" and not any(p.search(view.text) for p in _PATTERNS):
        return None
    prompt, limit, output = _numbers(err, view.text)
    if output is not None and limit is not None and output >= limit:
        return None  # the output budget alone fills the window: a shorter prompt cannot help
    row = max(_TABLE, key=lambda r: _score(r, err, view, headers))
    return Overflow(row.provider, reason, prompt, limit)


def _score(row: _Row, err: Mapping[str, Any], view: _View, headers: frozenset[str]) -> int:
    """Attribution only: a header or shape fingerprint beats wording shared by OpenAI-compatible servers."""
    score = 4 if row.headers & headers else 0
    score += 4 if row.hint is not None and row.hint(err) else 0
    score += 3 if any(p.search(view.text) for p in row.patterns) else 0
    return score + (1 if row.codes & view.codes or row.types & view.types else 0)


def _view(err: Mapping[str, Any], depth: int) -> _View:
    """Flatten the error and, for OpenRouter, the upstream error it carries in ``metadata.raw``."""
    codes, types = ({v.lower() for v in (err.get(key),) if isinstance(v, str)} for key in ("code", "type"))
    message = err.get("message")
    texts = [message] if isinstance(message, str) else []
    metadata = err.get("metadata")
    raw = metadata.get("raw") if isinstance(metadata, Mapping) else None
    inner = _error_object(raw, 0) if raw is not None and depth < 2 else None
    if inner is not None:
        nested = _view(inner, depth + 1)
        codes |= nested.codes
        types |= nested.types
        texts.append(nested.text)
    return _View(frozenset(codes), frozenset(types), "\n".join(texts)[:_MAX_TEXT])


def _numbers(err: Mapping[str, Any], text: str) -> tuple[int | None, int | None, int | None]:
    found: dict[str, int] = {}
    for key, field in (("prompt", "n_prompt_tokens"), ("limit", "n_ctx")):
        if type(value := err.get(field)) is int:
            found[key] = value
    for pattern in _EXTRACTORS:
        if match := pattern.search(text):
            for key, digits in match.groupdict().items():
                if digits is not None and len(digits) <= 15:
                    found.setdefault(key, int(digits))
    return found.get("prompt"), found.get("limit"), found.get("output")


def _sse_payload(text: str) -> str | None:
    """The data of the first event that has any; an ``error:`` field wins over ``data:``."""
    for event in re.split(r"\r?\n\r?\n", text[: _MAX_TEXT * 4]):
        fields = _SSE_FIELD.findall(event.replace("\r\n", "\n"))
        errors = [value for name, value in fields if name == "error"]
        lines = errors or [value for name, value in fields if name == "data"]
        if lines:
            payload = "\n".join(lines)
            return None if payload.strip() == "[DONE]" else payload
    return None


def _as_text(body: object) -> str | None:
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body).decode("utf-8", "replace")
    return body if isinstance(body, str) else None


def _loads(text: str) -> tuple[bool, object]:
    try:
        return True, orjson.loads(text)
    except orjson.JSONDecodeError:
        return False, None
