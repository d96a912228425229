"""The scripted tool loop both lasting benches drive (bench/lasting.py, bench/lastingcost.py): its session, its
length, the summary its instant model answers, tool outputs and tool definitions of a given size."""

from __future__ import annotations

import random
from typing import Any

from proxy.context.summary.summarizer import SECTIONS
from proxy.context.view.tokens import TokenCounter
from proxy.store.base import SessionKey

KEY = SessionKey("bench", "lasting")
STEPS = 60
#: The words its text is made of (one token each).
WORDS = ("config parser handler request retry socket buffer stream token index commit branch merge build test "
         "fixture assert value result error module function class import return yield await async cache store "
         "session window budget summary checkpoint").split()
SUMMARY = "\n".join(f"## {n}. {title.split(':')[0]}\n" + " ".join(WORDS[(n * 7 + i) % len(WORDS)] for i in range(45))
                    for n, title in enumerate(SECTIONS, 1))


def sized(counter: TokenCounter, tokens: int, rng: random.Random) -> str:
    """Text of about ``tokens`` tokens (one word is about one token; trimmed to the count)."""
    words = [rng.choice(WORDS) for _ in range(tokens)]
    while counter.text_tokens(" ".join(words)) > tokens:
        words.pop()
    return " ".join(words)


def tools_of(counter: TokenCounter, tokens: int) -> list[dict[str, Any]]:
    """Tool definitions of about ``tokens`` tokens: eight tools whose descriptions carry the instructions."""
    rng = random.Random(tokens)
    tools = [{"type": "function", "function": {"name": f"tool_{n}", "description": sized(counter, tokens // 8, rng),
                                               "parameters": {"type": "object",
                                                              "properties": {"arg": {"type": "string"}}}}}
             for n in range(8)]
    return tools
