"""Views that fit the window, end to end: clip only what must go, and leave room after a compaction."""

from __future__ import annotations

import itertools
import random
import re
from typing import Any

import orjson

from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import MASKING_OFF
from tests.test_compaction_e2e import HEADERS, TOOLS, prose, tool_call

CLIPPED = re.compile(r"(.*)\n\[… (\d+) characters elided by ctxproxy; full text in the fact log, entry seq 3 …\]\n(.*)",
                     re.DOTALL)
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def text_of(rng: random.Random, chars: int) -> str:
    text = ""
    while len(text) < chars:
        text += prose(rng, 500) + "\n"
    return text[:chars]


def one_tool_step(result: Any) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Look at the build log and the screenshot."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": result}]


async def post(proxy: Any, messages: list[dict[str, Any]], session: str, **fields: Any) -> tuple[Any, dict]:
    body = {"model": "gpt-4o", "messages": messages, "tools": TOOLS, **fields}
    resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={**HEADERS, "X-Session-Id": session})
    raw = await resp.read()
    assert resp.status == 200, raw[:500]
    return resp, orjson.loads(raw)["choices"][0]["message"]


async def test_a_result_of_text_and_an_image_over_the_window_is_clipped_to_fit(make_proxy,
                                                                               fake: FakeUpstream) -> None:
    proxy = await make_proxy(context_window=8_000)
    fake.window = 8_000
    text = text_of(random.Random(5), 60_000)
    fake.script.append(Reply(content="Seen."))
    resp, _ = await post(proxy, one_tool_step([{"type": "text", "text": text}, IMAGE]), "image")

    assert fake.refused == 0
    assert 6_000 < fake.prompt_tokens[-1] <= 6_400, "the window less room for the answer (1,600 tokens)"
    assert resp.headers["X-Ctxproxy-Compacted"] == "proactive"
    sent = fake.requests[-1]["messages"][-1]["content"]
    assert sent[1] == IMAGE, "the image fits once the text is clipped"
    clipped = CLIPPED.fullmatch(sent[0]["text"])
    assert clipped is not None
    head, elided, tail = clipped.group(1), int(clipped.group(2)), clipped.group(3)
    assert text.startswith(head) and text.endswith(tail) and len(head) + elided + len(tail) == len(text)
    assert len(head) > 10_000 and len(tail) > 10_000


async def test_images_that_cannot_fit_become_placeholders_naming_their_entry(make_proxy, fake: FakeUpstream) -> None:
    proxy = await make_proxy(context_window=8_000)
    fake.window = 8_000
    text = text_of(random.Random(6), 20_000)
    fake.script.append(Reply(content="Seen."))
    await post(proxy, one_tool_step([{"type": "text", "text": text}, *[IMAGE] * 10]), "images")

    assert fake.refused == 0 and fake.prompt_tokens[-1] <= 6_400
    sent = fake.requests[-1]["messages"][-1]["content"]
    assert len(sent) == 11
    assert sent[1:] == [{"type": "text", "text": "[image_url part elided by ctxproxy; kept in the fact log, "
                                                 "entry seq 3]"}] * 10
    assert sent[0]["text"].startswith(text[:200])


async def test_a_long_tool_result_that_fits_the_window_goes_upstream_whole(make_proxy, fake: FakeUpstream) -> None:
    proxy = await make_proxy()  # gpt-4o: a 128k window
    text = text_of(random.Random(7), 66_756)
    fake.script.append(Reply(content="Read it."))
    resp, _ = await post(proxy, one_tool_step(text), "whole")

    assert fake.requests[-1]["messages"][-1]["content"] == text
    assert resp.headers["X-Ctxproxy-Compacted"] == "none"
    assert int(resp.headers["X-Ctxproxy-View-Tokens"]) < 20_000


async def test_a_small_window_with_a_large_answer_reserve_compacts_every_few_steps(make_proxy,
                                                                                   fake: FakeUpstream) -> None:
    """Window 8,000 and ``max_tokens`` 5,500: the threshold (2,500) is below 35 % of the window (2,800)."""
    # Masking off, 175-word outputs: counted honestly, 100-word outputs under masking reach the threshold only at
    # step 26 (one summary in 30 steps); these summarise at steps 13, 18 and 24.
    proxy = await make_proxy(context_window=8_000, **MASKING_OFF)
    fake.window = 8_000
    rng = random.Random(8)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Refactor the parser module."}]
    summaries: list[int] = []
    for step in range(30):
        fake.script.append(tool_call(step))
        _, reply = await post(proxy, messages, "reserve", max_tokens=5_500)
        summaries.append(len(fake.summary_requests))
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": prose(rng, 175)}]

    compacted_at = [i for i in range(1, len(summaries)) if summaries[i] > summaries[i - 1]]
    gaps = [b - a for a, b in itertools.pairwise(compacted_at)]
    assert fake.refused == 0
    assert len(compacted_at) >= 2, compacted_at
    assert min(gaps) >= 3, gaps


async def test_the_reactive_path_clips_what_compaction_cannot_shrink(make_proxy, fake: FakeUpstream) -> None:
    """The proxy believes gpt-4o's 128k; the upstream has 8,000, and the last step's result alone is over it."""
    proxy = await make_proxy()
    fake.window, fake.overflow_style = 8_000, "vllm"
    text = text_of(random.Random(9), 60_000)
    fake.script.append(Reply(content="Read it."))
    resp, _ = await post(proxy, one_tool_step(text), "reactive-clip")

    assert fake.refused == 1
    assert resp.headers["X-Ctxproxy-Compacted"] == "reactive"
    assert fake.prompt_tokens[-1] <= 6_400
    assert CLIPPED.fullmatch(fake.requests[-1]["messages"][-1]["content"]) is not None
