"""The proxy's four front doors as the benchmarks drive them: one conversation, written in each API.

The latency workloads build conversations as Chat Completions messages; a
``Route`` writes the same conversation in its own API (the same texts, the
same tool calls and outputs), so the three doors are measured on equal
workloads:

- ``chat``: ``POST /v1/chat/completions``, the messages as they are;
- ``responses``: ``POST /v1/responses``, Codex's shape: system as a ``developer``
  message, text parts, ``function_call`` / ``function_call_output`` items;
- ``messages``: ``POST /v1/messages``, Claude Code's shape: system in the
  ``system`` field, ``tool_use`` / ``tool_result`` blocks, ``max_tokens`` set;
- ``gemini``: ``POST /v1beta/models/bench-model:generateContent`` (streamed:
  ``:streamGenerateContent?alt=sse``), Gemini CLI's shape: the model in the URL,
  system in ``systemInstruction``, ``functionCall`` / ``functionResponse`` parts.

The reply the fake upstream gives (``bench.fakeserver``) is echoed back in the
form that API's client sends it, so the proxy recognises it as already logged.

``check_front_door`` makes a missing door fail loudly: a proxy without it would
pass the request through to the same fake and measure something else.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from bench.fakeserver import GEMINI_REPLY, MESSAGES_REPLY, REPLY, RESPONSES_REPLY

Message = dict[str, Any]
HEADER_COMPACTED = "X-Ctxproxy-Compacted"


@dataclass(frozen=True)
class Route:
    """One front door. ``path``: below the ``/v1`` base; ``item``: a Chat message written in this API."""

    name: str
    path: str
    items_field: str
    item: Callable[[Message], Message]
    #: Fields every request of this API carries besides the model, the stream flag and the items.
    extra: dict[str, Any]
    #: Whether a leading system message goes in a ``system`` field rather than among the items.
    system_field: bool = False
    #: The name of that field, and its value for a system text.
    system_name: str = "system"
    system_value: Callable[[str], Any] = str
    #: Where a streamed request goes instead of ``path`` (the API streams by URL: no ``stream`` field then).
    stream_path: str | None = None
    #: Whether ``path`` is below the host rather than below the ``/v1`` base, and the model is in it.
    at_root: bool = False

    def url(self, base: str, stream: bool) -> str:
        """Where a request goes, ``base`` being the ``…/v1`` base of the proxy or of the upstream."""
        path = self.stream_path if stream and self.stream_path is not None else self.path
        return (base.removesuffix("/v1") if self.at_root else base) + path


def responses_item(message: Message) -> Message:
    role = message["role"]
    if message == REPLY:
        return RESPONSES_REPLY
    if role == "tool":
        return {"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}
    if role == "assistant" and message.get("tool_calls"):
        (call,) = message["tool_calls"]  # the workloads make one call per step, as Codex does
        return {"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                "arguments": call["function"]["arguments"]}
    if role == "assistant":
        return {"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": message["content"], "annotations": []}]}
    return {"type": "message", "role": "developer" if role == "system" else role,
            "content": [{"type": "input_text", "text": message["content"]}]}


def messages_item(message: Message) -> Message:
    role = message["role"]
    if message == REPLY:
        return MESSAGES_REPLY
    if role == "tool":
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": message["tool_call_id"],
                                             "content": message["content"]}]}
    if role == "assistant" and message.get("tool_calls"):
        return {"role": "assistant", "content": [
            {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
             "input": orjson.loads(call["function"]["arguments"])} for call in message["tool_calls"]]}
    if role == "assistant":
        return {"role": "assistant", "content": [{"type": "text", "text": message["content"]}]}
    return {"role": role, "content": message["content"]}


def gemini_item(message: Message) -> Message:
    role = message["role"]
    if message == REPLY:
        return GEMINI_REPLY
    if role == "tool":
        return {"role": "user", "parts": [{"functionResponse": {"id": message["tool_call_id"], "name": "tool",
                                                                "response": {"output": message["content"]}}}]}
    if role == "assistant" and message.get("tool_calls"):
        return {"role": "model", "parts": [
            {"functionCall": {"id": call["id"], "name": call["function"]["name"],
                              "args": orjson.loads(call["function"]["arguments"])}} for call in message["tool_calls"]]}
    return {"role": "model" if role == "assistant" else "user", "parts": [{"text": message["content"]}]}


CHAT = Route("chat", "/chat/completions", "messages", dict, {})
RESPONSES = Route("responses", "/responses", "input", responses_item, {})
MESSAGES = Route("messages", "/messages", "messages", messages_item, {"max_tokens": 1024}, system_field=True)
GEMINI = Route("gemini", "/v1beta/models/bench-model:generateContent", "contents", gemini_item, {},
               system_field=True, system_name="systemInstruction",
               system_value=lambda text: {"parts": [{"text": text}]},
               stream_path="/v1beta/models/bench-model:streamGenerateContent?alt=sse", at_root=True)
ROUTES = {route.name: route for route in (CHAT, RESPONSES, MESSAGES, GEMINI)}


def request_head(route: Route, messages: list[Message], stream: bool) -> tuple[bytes, list[Message]]:
    """The body up to the items array's opening bracket, and the messages that go in the array."""
    fields: dict[str, Any] = {} if route.at_root else {"model": "bench-model"}
    fields.update(route.extra)
    if stream and route.stream_path is None:
        fields["stream"] = True
    if route.system_field and messages and messages[0]["role"] == "system":
        fields[route.system_name] = route.system_value(messages[0]["content"])
        messages = messages[1:]
    head = orjson.dumps(fields)[:-1] + (b',"' if fields else b'"') + route.items_field.encode() + b'":['
    return head, messages


async def check_front_door(http: aiohttp.ClientSession, proxy: str, route: Route, headers: dict[str, str]) -> None:
    """Raise unless ``proxy`` (``…/v1``) serves ``route`` as a front door: answered, logged, counted.

    A build without the door passes the request through to the same fake
    upstream and answers 200, so the status alone proves nothing: a front door
    adds ``X-Ctxproxy-Compacted`` and counts the request under its own route.
    """
    head, items = request_head(route, [{"role": "system", "content": "You are a benchmark."},
                                       {"role": "user", "content": "Check the front door."}], stream=False)
    body = head + b",".join(orjson.dumps(route.item(m)) for m in items) + b"]}"
    url = route.url(proxy, False)
    async with http.post(url, data=body, headers={**headers, "X-Session-Id": f"bench-door-{route.name}"}) as resp:
        text = await resp.text()
        marked = HEADER_COMPACTED in resp.headers
    if resp.status != 200 or not marked:
        raise SystemExit(f"the proxy has no {route.name} front door: POST {url} answered {resp.status}"
                         f"{'' if marked else f' without {HEADER_COMPACTED} (passed through?)'}: {text[:300]}")
    async with http.get(proxy.removesuffix("/v1") + "/metrics") as resp:
        metrics = await resp.text()
    if not re.search(r'^ctxproxy_requests_total\{[^}]*route="' + route.name + '"', metrics, re.MULTILINE):
        raise SystemExit(f"the proxy answered POST {url} but /metrics counts no request with route=\"{route.name}\"")
