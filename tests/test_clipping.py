"""Clipping tool results to fit: the least that must go, measured in tokens, parts and their keys kept."""

from __future__ import annotations

import copy
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.view.budget import ContextBudgetPolicy
from proxy.context.view.clipping import clip_to_fit, cut_text, entry_namer
from proxy.context.view.tokens import NON_TEXT_PART_TOKENS, TokenCounter
from proxy.dialects import CHAT
from proxy.types import Message


class WordEncoding:
    def encode_ordinary(self, text: str) -> list[int]:
        return [0] * len(text.split())


MEASURE = ContextBudgetPolicy(estimator="tokenizer", counter=TokenCounter(WordEncoding()))
MARKER = re.compile(r"\n\[… (\d+) characters elided by ctxproxy; full text in the fact log, (.+?) …\]\n")


def words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def result(call: str, content: object) -> Message:
    return {"role": "tool", "tool_call_id": call, "content": content}


def named(message: Message) -> str:
    return f"message {message['tool_call_id']}"


def test_only_the_largest_result_is_cut_and_only_as_far_as_needed() -> None:
    big, small = result("a", words("b", 1000)), result("b", words("s", 100))
    view = [{"role": "user", "content": words("u", 2000)}, big, small]
    clipped = clip_to_fit(CHAT, view, 300, MEASURE, named)
    assert clipped is not None
    assert clipped[0] is view[0] and clipped[2] is small
    text = clipped[1]["content"]
    marker = MARKER.search(text)
    assert marker is not None and marker.group(2) == "message a"
    head, tail = text[: marker.start()], text[marker.end():]
    kept = len(head.split()) + len(tail.split())
    assert 680 <= kept <= 700  # 1000 words, 300 must go, the marker costs its own words
    assert big["content"].startswith(head) and big["content"].endswith(tail)
    assert len(head) + int(marker.group(1)) + len(tail) == len(big["content"])


def test_results_larger_than_the_cap_are_cut_to_the_same_size() -> None:
    view = [result("a", words("a", 900)), result("b", words("b", 600)), result("c", words("c", 200))]
    clipped = clip_to_fit(CHAT, view, 800, MEASURE, named)
    assert clipped is not None and clipped[2] is view[2]
    sizes = [MEASURE.text_tokens(m["content"]) for m in clipped[:2]]
    assert abs(sizes[0] - sizes[1]) <= 1
    assert 1700 - sum(MEASURE.text_tokens(m["content"]) for m in clipped) >= 800


def test_text_parts_are_cut_in_place_and_keep_their_keys() -> None:
    parts = [{"type": "text", "text": words("x", 800), "cache_control": {"type": "ephemeral"}},
             {"type": "text", "text": "short", "cache_control": {"type": "ephemeral"}}]
    view = [result("a", parts)]
    before = copy.deepcopy(view)
    clipped = clip_to_fit(CHAT, view, 400, MEASURE, named)
    assert clipped is not None
    content = clipped[0]["content"]
    assert [part["cache_control"] for part in content] == [{"type": "ephemeral"}] * 2
    assert content[1] is parts[1]
    assert MARKER.search(content[0]["text"]) is not None
    assert view == before, "the input is left alone"


def test_a_non_text_part_goes_only_when_the_cap_falls_below_it() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}, "cache_control": {"x": 1}}
    view = [result("a", [{"type": "text", "text": words("t", 3000)}, image])]
    kept = clip_to_fit(CHAT, view, 1000, MEASURE, named)
    assert kept is not None and kept[0]["content"][1] is image
    gone = clip_to_fit(CHAT, view, 3000 + NON_TEXT_PART_TOKENS - 500, MEASURE, named)
    assert gone is not None
    assert gone[0]["content"][1] == {"type": "text", "cache_control": {"x": 1},
                                     "text": "[image_url part elided by ctxproxy; kept in the fact log, message a]"}
    # The image's removal saves most of what must go, so the text keeps more than the cap alone would leave.
    assert MEASURE.text_tokens(gone[0]["content"][0]["text"]) > 400


def test_nothing_to_clip() -> None:
    view = [{"role": "user", "content": words("u", 100)}]
    assert clip_to_fit(CHAT, view, 50, MEASURE, named) is None
    assert clip_to_fit(CHAT, [result("a", words("a", 100))], 0, MEASURE, named) is None


def test_the_marker_names_the_log_entry_when_it_is_known() -> None:
    messages = [{"role": "user", "content": "go"}, result("a", "x"), result("b", "y")]
    name = entry_namer(messages, [7, 9])
    assert name(messages[1]) == "entry seq 9"
    assert name(messages[2]) == "message index 2"  # not logged yet
    assert name({"role": "tool", "content": "a copy"}) == "a message of this request"


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 1500), min_size=1, max_size=8), st.integers(1, 6000))
def test_what_is_cut_saves_what_must_go_and_never_much_more(sizes: list[int], excess: int) -> None:
    view = [result(str(i), words("w", n)) for i, n in enumerate(sizes)]
    total = sum(sizes)
    clipped = clip_to_fit(CHAT, view, excess, MEASURE, named)
    if clipped is None:
        assert all(n <= 40 for n in sizes) or excess <= 0, "only results smaller than a marker are left whole"
        return
    after = sum(MEASURE.text_tokens(m["content"]) for m in clipped)
    reachable = sum(max(0, n - 30) for n in sizes)  # everything down to its marker
    if excess <= reachable - 30 * len(sizes):
        assert total - after >= excess
        assert total - after <= excess + 30 * len(sizes) + total // 50
    for original, shown in zip(view, clipped, strict=True):
        assert shown is original or MEASURE.text_tokens(shown["content"]) < MEASURE.text_tokens(original["content"])


def test_cut_text_keeps_head_and_tail() -> None:
    text = words("w", 100)
    cut = cut_text(text, 100, 10, MEASURE, "entry seq 4")
    marker = MARKER.search(cut)
    assert marker is not None and marker.group(2) == "entry seq 4"
    head, tail = cut[: marker.start()], cut[marker.end():]
    assert text.startswith(head) and text.endswith(tail)
    assert head.startswith("w0 w1 w2 w3") and tail == "w95 w96 w97 w98 w99"
    assert MEASURE.text_tokens(head) == 5 and MEASURE.text_tokens(tail) == 5
