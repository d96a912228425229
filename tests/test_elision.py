from __future__ import annotations

from proxy.context.view.elision import clip_text


def test_clip_text_keeps_head_and_tail_and_names_the_index() -> None:
    text = "0123456789" * 10
    clipped = clip_text(text, 20, 17)
    assert clipped == (
        "0123456789\n[… 80 characters elided by ctxproxy; full text in the fact log, message index 17 …]\n0123456789"
    )
    assert clip_text(text, 100, 17) is text
