"""A fake Gemini API upstream for the real Gemini CLI: a real aiohttp server.

``POST /{version}/models/{model}:streamGenerateContent`` (``?alt=sse``: server-sent events; without it a JSON
array of the same chunks) and ``:generateContent`` answer each turn of ``script`` with a thought part, a text and
a ``run_shell_command`` ``functionCall`` whose ``command`` runs the step (its part signed with a
``thoughtSignature`` the fake issued, and with an ``id`` unless ``call_ids`` is off), or the final text. The text
of a reply arrives in several chunks, and the last chunk carries ``finishReason`` and ``usageMetadata``
(``promptTokenCount`` counted with the proxy's tokenizer, ``candidatesTokenCount`` and ``thoughtsTokenCount`` what
the model wrote, its thoughts apart; ``cachedContentTokenCount``: the prefix shared with the previous turn); every
answer, summaries and helper calls included, is billed so, its usage kept with its record (``Recorded.usage``). It
checks what Gemini 3 checks: the first function call of each model turn since the last user text carries a signature
it issued (older turns are not checked), and refuses a prompt over ``window`` with the API's 400 "The input token
count (N) exceeds the maximum number of tokens allowed (M).". ``:countTokens`` answers ``{"totalTokens": N}``. A
request whose ``systemInstruction`` is the proxy's summariser prompt, or whose last user turn starts with it, gets a
summary (``summary_style`` as the other fakes); Gemini CLI's own compression (``STATE_SNAPSHOT_SYSTEM``) gets a
``<state_snapshot>`` and is recorded as ``client_compaction``; a helper call asking for JSON (its next-speaker check)
gets ``{"reasoning": …, "next_speaker": "user"}``. Everything it receives is in ``requests``.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
from typing import Any

import orjson
from aiohttp import web

from tests.fakescript import Recorded, Recorder, Script, Window, cached_prefix, is_summary_prompt, pieces
from tests.fakeupstream import PREAMBLE, PREAMBLE_CALL, overflow_body

#: How Gemini CLI's compression prompt starts (its ``systemInstruction``).
STATE_SNAPSHOT_SYSTEM = ("You are a specialized system component responsible for distilling chat history into a "
                         "structured XML <state_snapshot>.")
SHELL = "run_shell_command"
#: The signature Gemini CLI puts on calls it has no signature for; the API lets it through.
SKIP_SIGNATURE = "skip_thought_signature_validator"
MISSING_SIGNATURE = ("Function call is missing a thought_signature in functionCall parts. This is required for tools "
                     "to work correctly, and missing thought_signature may lead to degraded model performance. "
                     "Additional data, function call `default_api:{name}` , position {position}. Please refer to "
                     "https://ai.google.dev/gemini-api/docs/thought-signatures for more details.")


def error(status: int, message: str, name: str) -> web.Response:
    return web.json_response({"error": {"code": status, "message": message, "status": name}}, status=status)


def parts_of(content: Any) -> list[dict[str, Any]]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def first_text(content: Any) -> str:
    return next((str(p["text"]) for p in parts_of(content) if isinstance(p.get("text"), str)), "")


def opens_turn(content: dict[str, Any]) -> bool:
    """A user entry with text and no function response: where Gemini's "current turn" starts."""
    parts = parts_of(content)
    return content.get("role") == "user" and any("text" in p for p in parts) and \
        not any("functionResponse" in p for p in parts)


class FakeGemini(Recorder):
    """``script``: the run to drive. ``window``: refuse prompts over it. ``call_ids``: give calls an ``id``."""

    def __init__(self, script: Script | None = None, window: int | None = None, call_ids: bool = True) -> None:
        super().__init__(script, window)
        self.call_ids = call_ids
        self._ids = itertools.count(1)
        self._issued: set[str] = set()
        self._last_prompt: list[Any] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{version}/models/{model}:{method}", self.models)
        app.router.add_route("*", "/{tail:.*}", self.other)
        return app

    def prompt_counts(self, body: dict[str, Any]) -> tuple[list[Any], list[int]]:
        """The prompt as the model reads it (tools, system instruction, contents) and each part's tokens."""
        prompt = [body.get("tools"), body.get("systemInstruction"), *(body.get("contents") or [])]
        return prompt, [self.window.count(part) for part in prompt]

    # -- routes ---------------------------------------------------------------------------------

    async def other(self, request: web.Request) -> web.Response:
        self._record(request, await request.text(), "other", status=404)
        return error(404, f"Method not found: {request.method} {request.path}", "NOT_FOUND")

    async def models(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        if method not in ("generateContent", "streamGenerateContent", "countTokens"):
            return await self.other(request)
        body = await request.json(loads=orjson.loads)
        contents: list[dict[str, Any]] = body.get("contents") or []
        if method == "countTokens":
            tokens = sum(self.prompt_counts(body)[1])
            self._record(request, body, "count_tokens", tokens=tokens)
            return web.json_response({"totalTokens": tokens})
        system = first_text(body.get("systemInstruction"))
        prompt, counts = self.prompt_counts(body)
        cached = cached_prefix(self._last_prompt, prompt, counts)  # what the cache serves (it keeps turns' prompts)
        if is_summary_prompt(system) or is_summary_prompt(first_text(contents[-1] if contents else None)):
            record = self._record(request, body, "summary")
            if self.summary_style == PREAMBLE_CALL:
                name = body["tools"][0]["functionDeclarations"][0]["name"]
                return await self._answer(request, body, record, [{"text": PREAMBLE}, {"functionCall": {
                    "name": name, "args": {}}}], sum(counts), cached)
            text = await self.summary(contents)
            if isinstance(text, web.Response):
                return text
            return await self._answer(request, body, record, [{"text": text}], sum(counts), cached)
        if system.startswith(STATE_SNAPSHOT_SYSTEM):
            record = self._record(request, body, "client_compaction")
            return await self._answer(request, body, record, [{"text": "<state_snapshot></state_snapshot>"}],
                                      sum(counts), cached)
        config = body.get("generationConfig") or {}
        if "responseJsonSchema" in config or "responseSchema" in config:
            record = self._record(request, body, "helper")
            answer = {"reasoning": "The model's last turn was complete.", "next_speaker": "user"}
            return await self._answer(request, body, record, [{"text": orjson.dumps(answer).decode()}], sum(counts),
                                      cached)
        return await self._turn(request, body, contents, prompt, counts)

    async def _turn(self, request: web.Request, body: dict[str, Any], contents: list[dict[str, Any]],
                    prompt: list[Any], counts: list[int]) -> web.StreamResponse:
        tokens = sum(counts)
        if self.window.refuses(tokens):
            assert self.window.limit is not None
            self._record(request, body, "turn", tokens=tokens, status=400)
            status, raw = overflow_body("gemini", tokens, self.window.limit)
            return web.Response(status=status, body=raw, content_type="application/json")
        problem = self._check_signatures(contents)
        if problem is not None:
            self._record(request, body, "turn", tokens=tokens, status=400)
            return error(400, problem, "INVALID_ARGUMENT")
        record = self._record(request, body, "turn", tokens=tokens)
        cached = cached_prefix(self._last_prompt, prompt, counts)
        self._last_prompt = prompt
        return await self._answer(request, body, record, self._turn_output(body, contents), tokens, cached)

    # -- the script -----------------------------------------------------------------------------

    def _turn_output(self, body: dict[str, Any], contents: list[dict[str, Any]]) -> list[dict[str, Any]]:
        command, output = last_call(contents)
        step = self.script.next_step(command, output)
        if isinstance(step, str):
            return [{"text": step, "thoughtSignature": self._sign(step)}]
        declared = [d.get("name") for tool in body.get("tools") or [] for d in tool.get("functionDeclarations") or []]
        if SHELL not in declared:
            return [{"text": f"No {SHELL} tool was offered."}]
        call: dict[str, Any] = {"name": SHELL, "args": {"command": self.script.command(step),
                                                        "description": f"Run step {step}"}}
        if self.call_ids:
            call["id"] = f"call{next(self._ids):06d}"
        return [{"text": f"Step {step} comes next.", "thought": True}, {"text": f"Running step {step}."},
                {"functionCall": call, "thoughtSignature": self._sign(str(step))}]

    def _sign(self, text: str) -> str:
        digest = hashlib.sha256(f"{next(self._ids)}:{text}".encode()).digest()
        signature = base64.b64encode(digest * 4).decode()
        self._issued.add(signature)
        return signature

    def _check_signatures(self, contents: list[dict[str, Any]]) -> str | None:
        """Gemini 3's check: the first call of each model turn since the last user text is signed by the model."""
        start = max((i for i, c in enumerate(contents) if opens_turn(c)), default=0)
        for index in range(start, len(contents)):
            if contents[index].get("role") != "model":
                continue
            calls = [p for p in parts_of(contents[index]) if "functionCall" in p]
            if calls and calls[0].get("thoughtSignature") not in self._issued | {SKIP_SIGNATURE}:
                return MISSING_SIGNATURE.format(name=calls[0]["functionCall"].get("name"), position=index + 1)
        return None

    # -- the wire -------------------------------------------------------------------------------

    async def _answer(self, request: web.Request, body: dict[str, Any], record: Recorded,
                      parts: list[dict[str, Any]], tokens: int, cached: int) -> web.StreamResponse:
        """The answer ``parts`` to a prompt of ``tokens`` (``cached`` of them served by the cache), billed as the
        tokenizer counts what the model wrote, its thoughts apart (``written``); the usage is kept with ``record``."""
        thoughts = sum(written(self.window, part) for part in parts if part.get("thought"))
        candidates = sum(written(self.window, part) for part in parts if not part.get("thought"))
        usage: dict[str, Any] = {"promptTokenCount": tokens, "candidatesTokenCount": candidates,
                                 "totalTokenCount": tokens + candidates + thoughts, "cachedContentTokenCount": cached}
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        record.usage = usage
        model = request.match_info["model"]
        response_id = f"resp{next(self._ids):06d}"
        last = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": usage, "modelVersion": model, "responseId": response_id}
        if request.match_info["method"] != "streamGenerateContent":
            return web.json_response(last)
        *head, tail = split_text(parts)
        chunks = [{"candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}],
                   "modelVersion": model, "responseId": response_id} for part in head]
        chunks.append({**last, "candidates": [{**last["candidates"][0], "content": {"role": "model",
                                                                                    "parts": [tail]}}]})
        if request.query.get("alt") == "sse":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for chunk in chunks:
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\r\n\r\n")
        else:  # a JSON array, written element by element as the API streams it
            resp = web.StreamResponse(headers={"Content-Type": "application/json; charset=UTF-8"})
            await resp.prepare(request)
            for n, chunk in enumerate(chunks):
                await resp.write((b"[" if n == 0 else b",\r\n") + orjson.dumps(chunk))
            await resp.write(b"]")
        await resp.write_eof()
        return resp


def written(window: Window, part: dict[str, Any]) -> int:
    """The tokens the model wrote in one part: its text, or its call (name and arguments) as JSON."""
    if isinstance(part.get("text"), str):
        return window.counter.text_tokens(part["text"])
    return window.count(part.get("functionCall"))


def kept_reply(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The model entry Gemini CLI keeps from a reply's chunks: thought parts dropped, adjacent texts joined."""
    parts: list[dict[str, Any]] = []
    for chunk in chunks:
        for part in chunk["candidates"][0]["content"]["parts"]:
            if part.get("thought"):
                continue
            if parts and set(parts[-1]) == {"text"} and set(part) == {"text"}:
                parts[-1] = {"text": parts[-1]["text"] + part["text"]}
            else:
                parts.append(dict(part))
    return {"role": "model", "parts": parts}


def split_text(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A reply's text parts cut into small ones (a signature stays with the last piece); other parts as they are."""
    out: list[dict[str, Any]] = []
    for part in parts:
        if set(part) - {"thoughtSignature"} != {"text"}:
            out.append(part)
            continue
        texts = pieces(part["text"])
        out.extend({"text": piece} for piece in texts[:-1])
        out.append({**part, "text": texts[-1]})
    return out


def last_call(contents: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """The command of the latest ``run_shell_command`` call and the output sent back for it."""
    for index in range(len(contents) - 1, -1, -1):
        calls = [p["functionCall"] for p in parts_of(contents[index]) if "functionCall" in p]
        if not calls or contents[index].get("role") != "model":
            continue
        call = calls[-1]
        command = str((call.get("args") or {}).get("command"))
        for later in contents[index + 1:]:
            for part in parts_of(later):
                response = part.get("functionResponse")
                if isinstance(response, dict) and response.get("name") == call.get("name"):
                    return command, orjson.dumps(response.get("response")).decode()
        return command, None
    return None, None
