"""Tests for proxy.overflow: real refusal payloads, one or more per provider row.

Every body below reproduces a wire shape seen in public docs or bug reports (the
source is named next to each case); numbers are changed, wording and shape are not.
The negatives are the refusals that must never make the proxy throw context away.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.overflow import Overflow, Reason, classify_overflow, classify_sse_event, error_object


def oai(message: str, type_: str | None = "invalid_request_error", param: Any = None, code: Any = None) -> bytes:
    """The OpenAI envelope, byte for byte as the API sends it."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def anthropic(type_: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": type_, "message": message}, "request_id": "req_011CSHo"})


def vllm(message: str, *, wrapped: bool = False) -> bytes:
    """vLLM's ErrorResponse: top-level in older releases, wrapped in {"error": ...} in newer ones."""
    body: dict[str, Any] = {"object": "error", "message": message, "type": "BadRequestError"}
    body |= {"param": None, "code": 400}
    if wrapped:
        body = {"error": {k: v for k, v in body.items() if k != "object"}}
    return orjson.dumps(body)


VLLM_CLASSIC = (
    "This model's maximum context length is 32768 tokens. However, you requested 33000 tokens "
    "(31000 in the messages, 2000 in the completion). Please reduce the length of the messages or completion."
)
GEMINI_MSG = "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
OPENROUTER_MSG = (
    "This endpoint's maximum context length is 200000 tokens. However, you requested about 250000 tokens "
    "(242000 of text input, 8000 in the output). Please reduce the length of either one, or use the "
    '"middle-out" transform to compress your prompt automatically.'
)
OPENAI_CTX = oai(
    "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. "
    "Please reduce the length of the messages.",
    param="messages",
    code="context_length_exceeded",
)

# (id, status, body, headers, provider, reason, prompt_tokens, limit_tokens)
POSITIVE: list[tuple[str, int, Any, dict[str, str] | None, str, Reason, int | None, int | None]] = [
    ("openai", 400, OPENAI_CTX, None, "openai", "code", 130000, 128000),
    ("openai-responses", 400, oai(
        "Your input exceeds the context window of this model. Please adjust your input and try again.",
        param="input", code="context_length_exceeded"), None, "openai", "code", None, None),
    ("openai-legacy-completions", 400, oai(
        "This model's maximum context length is 4097 tokens, however you requested 4226 tokens (3970 in your "
        "prompt; 256 for the completion). Please reduce your prompt; or completion length."),
     None, "openai", "message", 3970, 4097),
    ("azure", 400, oai(
        "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 300000 tokens. "
        "Please reduce the length of the messages.", param="messages", code="context_length_exceeded"),
     {"apim-request-id": "5b0e7c1a", "x-ms-region": "East US 2"}, "azure", "code", 300000, 272000),
    ("azure-no-code", 400, oai(
        "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 300000 tokens. "
        "Please reduce the length of the messages."), None, "azure", "message", 300000, 272000),
    ("anthropic", 400, anthropic("invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"),
     {"anthropic-organization-id": "0b1f", "request-id": "req_011CSHo"}, "anthropic", "message", 208310, 200000),
    ("anthropic-input-plus-max-tokens", 400, anthropic(
        "invalid_request_error",
        "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, decrease input length or "
        "`max_tokens` and try again"), None, "anthropic", "message", 197000, 200000),
    # docs.anthropic.com/en/api/errors: 413 request_too_large, returned by Cloudflare; bytes, but compaction helps.
    ("anthropic-413-bytes", 413, anthropic("request_too_large", "Request exceeds the maximum allowed number of bytes."),
     None, "anthropic", "type", None, None),
    ("vllm-top-level", 400, vllm(VLLM_CLASSIC), None, "vllm", "message", 31000, 32768),
    ("vllm-wrapped", 400, vllm(VLLM_CLASSIC, wrapped=True), None, "vllm", "message", 31000, 32768),
    ("vllm-422", 422, vllm(VLLM_CLASSIC), None, "vllm", "message", 31000, 32768),
    ("vllm-request-has", 400, vllm(
        "This model's maximum context length is 32768 tokens. However, your request has 40000 input tokens. "
        "Please reduce the length of the input messages.", wrapped=True), None, "vllm", "message", 40000, 32768),
    ("vllm-0.19-prompt-contains", 400, vllm(
        "This model's maximum context length is 32768 tokens. However, you requested 2000 output tokens and your "
        "prompt contains at least 30769 input tokens, for a total of at least 32769 tokens. Please reduce the length "
        "of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=30769)",
        wrapped=True), None, "vllm", "message", 30769, 32768),
    ("vllm-max-tokens-fixable", 400, vllm(
        "'max_tokens' or 'max_completion_tokens' is too large: 2000. This model's maximum context length is 4096 "
        "tokens and your request has 2778 input tokens (2000 > 4096 - 2778). None", wrapped=True),
     None, "vllm", "message", 2778, 4096),
    # llama.cpp server, after PR #16486 (HTTP 400) and the newest wording with counts in the message.
    ("llamacpp", 400, orjson.dumps({"error": {
        "code": 400, "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}}),
     None, "llamacpp", "type", 5000, 4096),
    ("llamacpp-counts-in-message", 400, orjson.dumps({"error": {
        "code": 400, "message": "request (4390 tokens) exceeds the available context size (4096 tokens), try "
        "increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 4390, "n_ctx": 4096}}),
     None, "llamacpp", "type", 4390, 4096),
    # llama.cpp PR #15780 era: the type existed but the status was 500.
    ("llamacpp-500", 500, orjson.dumps({"error": {
        "code": 500, "message": "the request exceeds the available context size. try increasing the context size "
        "or enable context shift", "type": "exceed_context_size_error", "n_prompt_tokens": 1407, "n_ctx": 256}}),
     None, "llamacpp", "type", 1407, 256),
    # llama.cpp issue #19774: the other 500 it sometimes answers.
    ("llamacpp-500-server-error", 500, orjson.dumps({"error": {
        "code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}),
     None, "llamacpp", "message", None, None),
    # gemini-cli issues #6678, #12214: the list-wrapped form.
    ("gemini-list", 400, orjson.dumps([{"error": {
        "code": 400, "message": GEMINI_MSG,
        "errors": [{"message": GEMINI_MSG, "domain": "global", "reason": "badRequest"}],
        "status": "INVALID_ARGUMENT"}}]), None, "gemini", "message", 1200000, 1048576),
    ("gemini-dict", 400, orjson.dumps({"error": {"code": 400, "message": GEMINI_MSG, "status": "INVALID_ARGUMENT"}}),
     None, "gemini", "message", 1200000, 1048576),
    ("mistral", 400, orjson.dumps({
        "object": "error", "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for model with "
        "32768 maximum context length", "type": "invalid_request_message_error", "param": None, "code": None}),
     None, "mistral", "message", 40000, 32768),
    ("mistral-3051", 400, orjson.dumps({
        "object": "error", "message": "Prompt contains 159202 tokens and 0 draft tokens, too large for model with "
        "131072 maximum context length", "type": "invalid_request_invalid_args", "param": None, "code": "3051",
        "raw_status_code": 400}), None, "mistral", "message", 159202, 131072),
    ("deepseek", 400, oai(
        "This model's maximum context length is 65536 tokens. However, you requested 70000 tokens (70000 in the "
        "messages, 0 in the completion). Please reduce the length of the messages or completion.",
        code="invalid_request_error"), None, "deepseek", "message", 70000, 65536),
    ("openrouter", 400, orjson.dumps({"error": {
        "message": OPENROUTER_MSG, "code": 400, "metadata": {"provider_name": None}}}),
     None, "openrouter", "message", 242000, 200000),
    ("openrouter-text-only", 400, orjson.dumps({"error": {
        "message": "This endpoint's maximum context length is 16384 tokens. However, you requested about 94307 "
        "tokens (94307 of text input). Please reduce the length of either one, or use the \"middle-out\" "
        "transform to compress your prompt automatically.", "code": 400, "metadata": {"provider_name": None}}}),
     {"x-generation-id": "gen-1741"}, "openrouter", "message", 94307, 16384),
    # OpenRouter relaying the provider's own refusal as a JSON string in metadata.raw.
    ("openrouter-raw", 400, orjson.dumps({"error": {
        "message": "Provider returned error", "code": 400, "metadata": {"provider_name": "Chutes", "raw": json.dumps(
            {"error": {"message": "This model's maximum context length is 32768 tokens. However, you requested "
                       "8192 output tokens and your prompt contains at least 24577 input tokens, for a total of at "
                       "least 32769 tokens. Please reduce the length of the input prompt or the number of requested "
                       "output tokens."}})}}}), None, "openrouter", "message", 24577, 32768),
    ("lmstudio", 400, orjson.dumps({"error": (
        "Trying to keep the first 5000 tokens when context the overflows. However, the model is loaded with context "
        "length of only 4096 tokens, which is not enough. Try to load the model with a larger context length, or "
        "provide a shorter input")}), None, "lmstudio", "message", 5000, 4096),
    ("groq", 400, oai("Please reduce the length of the messages or completion.", param="messages",
                      code="context_length_exceeded"), None, "groq", "code", None, None),
    ("groq-by-header", 400, oai(
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 9500 tokens. "
        "Please reduce the length of the messages.", param="messages", code="context_length_exceeded"),
     {"x-groq-region": "dls", "x-request-id": "req_01jq"}, "groq", "code", 9500, 8192),
    # Cerebras: cline #5140, modelrelay #73; Cerebras's flat error envelope.
    ("cerebras", 400, orjson.dumps({
        "message": "Please reduce the length of the messages or completion. Current length is 9000 while limit is "
        "8192", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}),
     None, "cerebras", "code", 9000, 8192),
    # SGLang: QwenLM/Qwen3 #1321, same envelope as vLLM.
    ("sglang", 400, vllm("The input (9000 tokens) is longer than the model's context length (8192 tokens)."),
     None, "sglang", "message", 9000, 8192),
    ("xai", 400, orjson.dumps({
        "code": "Client specified an invalid argument",
        "error": "This model's maximum prompt length is 131072 but the request contains 149617 tokens."}),
     None, "xai", "message", 149617, 131072),
    ("tgi-422", 422, orjson.dumps({
        "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` "
        "tokens and 200 `max_new_tokens`", "error_type": "validation"}), None, "tgi", "message", 4000, 4096),
    ("bedrock", 400, orjson.dumps({"message": "Input is too long for requested model."}),
     None, "bedrock", "message", None, None),
    ("nginx-413", 413, b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center>"
     b"<h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
     None, "http", "message", None, None),
    ("mlx-generic", 400, oai("Prompt exceeds maximum context length"), None, "generic", "message", None, None),
]


@pytest.mark.parametrize(
    ("status", "body", "headers", "provider", "reason", "prompt", "limit"),
    [case[1:] for case in POSITIVE],
    ids=[case[0] for case in POSITIVE],
)
def test_positive(
    status: int, body: Any, headers: dict[str, str] | None, provider: str, reason: Reason,
    prompt: int | None, limit: int | None,
) -> None:
    assert classify_overflow(status, body, headers) == Overflow(provider, reason, prompt, limit)


@pytest.mark.parametrize("form", ["bytes", "str", "parsed"])
def test_body_forms_agree(form: str) -> None:
    body: Any = {"bytes": OPENAI_CTX, "str": OPENAI_CTX.decode(), "parsed": orjson.loads(OPENAI_CTX)}[form]
    assert classify_overflow(400, body) == Overflow("openai", "code", 130000, 128000)


@pytest.mark.parametrize("status", [401, 403, 404, 429, 502, 503, 504, 529])
@pytest.mark.parametrize("case", POSITIVE, ids=[case[0] for case in POSITIVE])
def test_status_gate_beats_any_wording(case: tuple[Any, ...], status: int) -> None:
    assert classify_overflow(status, case[2], case[3]) is None


OPENAI_TPM = oai(
    "Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, Used 0, Requested "
    "45000. Please try again in 30s. Visit https://platform.openai.com/account/rate-limits to learn more.",
    type_="tokens", code="rate_limit_exceeded")
NEGATIVE: list[tuple[str, int, Any]] = [
    ("openai-429-tpm", 429, OPENAI_TPM),
    ("tpm-text-at-400", 400, OPENAI_TPM),
    ("tpm-text-no-code", 400, oai("Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested "
                                  "45000. The input or output tokens must be reduced in order to run successfully.")),
    # Groq sends its TPM refusal as 413, and it says "reduce your message size".
    ("groq-413-tpm", 413, orjson.dumps({"error": {
        "message": "Request too large for model `llama-3.1-8b-instant` in organization `org_01` service tier "
        "`on_demand` on tokens per minute (TPM): Limit 6000, Requested 9512, please reduce your message size and "
        "try again.", "type": "tokens", "code": "rate_limit_exceeded"}})),
    ("anthropic-429", 429, anthropic("rate_limit_error", "Number of request tokens has exceeded your per-minute "
                                                         "rate limit")),
    ("openai-401", 401, oai("Incorrect API key provided: sk-abc. You can find your API key at "
                            "https://platform.openai.com/account/api-keys.", code="invalid_api_key")),
    ("anthropic-403", 403, anthropic("permission_error", "Your API key does not have permission to use the "
                                                         "specified resource.")),
    ("openai-500", 500, oai("The server had an error while processing your request. Sorry about that!",
                            type_="server_error")),
    ("anthropic-500", 500, anthropic("api_error", "Internal server error")),
    ("bad-tool-schema", 400, oai(
        "Invalid schema for function 'get_weather': In context=(), 'required' is required to be supplied and to be "
        "an array including every key in properties. Missing 'location'.",
        param="tools[0].function.parameters", code="invalid_function_parameters")),
    ("openai-max-tokens-output-limit", 400, oai(
        "max_tokens is too large: 100000. This model supports at most 16384 completion tokens, whereas you provided "
        "100000.", param="max_tokens", code="invalid_value")),
    ("anthropic-max-tokens-output-limit", 400, anthropic(
        "invalid_request_error", "max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens "
        "for claude-sonnet-4-20250514")),
    # The output budget alone fills the window: no compaction of the prompt can help.
    ("vllm-max-tokens-unfixable", 400, vllm(
        "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096 "
        "tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None", wrapped=True)),
    ("openrouter-output-fills-window", 400, orjson.dumps({"error": {
        "message": "This endpoint's maximum context length is 131072 tokens. However, you requested about 141607 "
        "tokens (10535 of text input, 131072 in the output). Please reduce the length of either one, or use the "
        '"middle-out" transform to compress your prompt automatically.', "code": 400,
        "metadata": {"provider_name": "Chutes"}}})),
    ("invalid-model-404", 404, oai("The model `gpt-5-turbo` does not exist or you do not have access to it.",
                                   code="model_not_found")),
    ("invalid-model-400", 400, orjson.dumps({"error": {"message": "foo/bar is not a valid model ID", "code": 400}})),
    ("gemini-bad-key", 400, orjson.dumps({"error": {
        "code": 400, "message": "API key not valid. Please pass a valid API key.", "status": "INVALID_ARGUMENT"}})),
    ("openai-503-overloaded", 503, oai("The engine is currently overloaded, please try again later",
                                       type_="server_error")),
    ("anthropic-529-overloaded", 529, anthropic("overloaded_error", "Overloaded")),
    ("normal-completion-200", 200, orjson.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": "The prompt is too long: 5 tokens > 1 maximum"}}]})),
    ("normal-sse-200", 200, b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,'
                            b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'),
    ("plain-text-200", 200, b"prompt is too long: 208310 tokens > 200000 maximum"),
    ("empty-400", 400, b""),
    ("whitespace-400", 400, "  \n"),
    ("none-400", 400, None),
    ("bare-413", 413, b""),
    ("html-502", 502, b"<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1>"
                      b"</center><hr><center>cloudflare</center></body></html>"),
    ("json-not-error", 400, b'{"detail_level": 3}'),
    ("json-scalar", 400, b"42"),
]


@pytest.mark.parametrize(("status", "body"), [case[1:] for case in NEGATIVE], ids=[case[0] for case in NEGATIVE])
def test_negative(status: int, body: Any) -> None:
    assert classify_overflow(status, body) is None


OPENROUTER_EVENT = orjson.dumps(
    {"error": {"code": 400, "message": OPENROUTER_MSG, "metadata": {"provider_name": None}}})


@pytest.mark.parametrize(
    "event",
    [OPENROUTER_EVENT, OPENROUTER_EVENT.decode(), b"data: " + OPENROUTER_EVENT, b"data: " + OPENROUTER_EVENT + b"\r\n"],
    ids=["payload-bytes", "payload-str", "event-bytes", "event-crlf"],
)
def test_sse_event_openrouter(event: str | bytes) -> None:
    assert classify_sse_event(event) == Overflow("openrouter", "message", 242000, 200000)


def test_whole_stream_at_200_reads_first_data_event() -> None:
    keepalive = b": OPENROUTER PROCESSING\n\n"
    stream = keepalive * 2 + b"data: " + OPENROUTER_EVENT + b"\n\ndata: [DONE]\n\n"
    headers = {"Content-Type": "text/event-stream", "X-Generation-Id": "gen-1"}
    assert classify_overflow(200, stream, headers) == Overflow("openrouter", "message", 242000, 200000)


def test_sse_llamacpp_error_field() -> None:
    """llama.cpp before #16486 streamed the refusal at HTTP 200 in an ``error:`` field (issue #16104)."""
    event = (
        'error: {"code":400,"message":"the request exceeds the available context size. try increasing the context '
        'size or enable context shift","type":"exceed_context_size_error","n_prompt_tokens":14429,"n_ctx":8192}\n\n'
    )
    assert classify_sse_event(event) == Overflow("llamacpp", "type", 14429, 8192)


def test_sse_anthropic_error_event() -> None:
    event = (
        "event: error\ndata: "
        + anthropic("invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum").decode()
        + "\n\n"
    )
    assert classify_sse_event(event) == Overflow("anthropic", "message", 208310, 200000)


@pytest.mark.parametrize(
    "event",
    [
        b'{"id":"gen-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}',
        "data: [DONE]",
        "[DONE]",
        ": OPENROUTER PROCESSING",
        "",
        "data: not json at all, prompt is too long",
        '{"error":{"code":429,"message":"Rate limit exceeded: free-models-per-day"}}',
        # A 502 relayed mid-stream, even with context wording, is the upstream failing, not the prompt.
        '{"error":{"code":502,"message":"This model\'s maximum context length is 8192 tokens"}}',
        '{"id":"gen-2","object":"chat.completion.chunk","error":{"code":"server_error","message":"Provider '
        'disconnected unexpectedly"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}',
        'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","content":[]}}',
    ],
)
def test_sse_negative(event: str | bytes) -> None:
    assert classify_sse_event(event) is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"error": {"message": "m", "code": "c"}}', {"message": "m", "code": "c"}),
        (b'{"type":"error","error":{"type":"t","message":"m"}}', {"type": "t", "message": "m"}),
        (b'{"code":"x","error":"text"}', {"code": "x", "message": "text"}),
        (b'{"object":"error","message":"m","type":"BadRequestError","param":null,"code":400}',
         {"object": "error", "message": "m", "type": "BadRequestError", "param": None, "code": 400}),
        (b'[{"error": {"code": 400, "message": "m"}}]', {"code": 400, "message": "m"}),
        (b'{"detail": "Not Found"}', {"detail": "Not Found", "message": "Not Found"}),
        (b"upstream connect error", {"message": "upstream connect error"}),
        ({"error": {"message": "m"}}, {"message": "m"}),
        (b'{"id":"x","choices":[]}', None),
        (b'{"id":"x","choices":[],"message":"not an error"}', None),
        (b"", None),
        (None, None),
        (b"[]", None),
    ],
)
def test_error_object_shapes(body: Any, expected: dict[str, Any] | None) -> None:
    found = error_object(body)
    assert (dict(found) if found is not None else None) == expected


def test_huge_digit_runs_do_not_raise() -> None:
    """int() refuses strings over 4300 digits; a hostile message must not make the classifier raise."""
    body = oai("prompt is too long: " + "9" * 5000 + " tokens > " + "9" * 5000 + " maximum")
    assert classify_overflow(400, body) == Overflow("anthropic", "message", None, None)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["context_length_exceeded", "exceed_context_size_error", "prompt is too long: 5 tokens > 1 "
                       "maximum", "request_too_large", "[DONE]", "rate_limit_exceeded"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["error", "message", "code", "type", "metadata", "raw", "n_ctx", "n_prompt_tokens",
                         "object", "detail", "choices", "status"]) | st.text(max_size=8),
        children, max_size=5),
    max_leaves=20,
)
bodies = (
    st.none() | st.binary(max_size=300) | st.text(max_size=300) | json_values
    | json_values.map(lambda v: orjson.dumps(v)) | json_values.map(lambda v: "data: " + orjson.dumps(v).decode())
)
statuses = st.sampled_from([200, 400, 401, 413, 422, 429, 500, 502, 503]) | st.integers(-1000, 1000)
headers = st.none() | st.dictionaries(st.text(max_size=20), st.text(max_size=20), max_size=4)


@settings(max_examples=400, deadline=None)
@given(status=statuses, body=bodies, hdrs=headers)
def test_classify_never_raises(status: int, body: Any, hdrs: dict[str, str] | None) -> None:
    result = classify_overflow(status, body, hdrs)
    assert result is None or isinstance(result, Overflow)
    if status in (401, 403, 429, 502, 503, 504):
        assert result is None


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300) | st.text(max_size=300) | json_values.map(lambda v: orjson.dumps(v)))
def test_sse_never_raises(data: str | bytes) -> None:
    result = classify_sse_event(data)
    assert result is None or isinstance(result, Overflow)
