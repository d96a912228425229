"""Issue 33, item 3: a new summary updates the previous one section by section instead of replacing it."""

from __future__ import annotations

from proxy.context.summary.summarymerge import heading_index, merge, trim, update
from tests.fakeupstream import SECTION_TITLES


def summary(**bodies: str) -> str:
    """A summary in the proxy's sections; ``bodies`` by section number (``s1``…``s8``), "None" elsewhere."""
    return "\n".join(f"## {n}. {title}\n{bodies.get(f's{n}', 'None')}" for n, title in enumerate(SECTION_TITLES, 1))


def section(text: str, number: int) -> str:
    """The body of section ``number`` of a rendered summary."""
    start = text.index(f"## {number}. ")
    body = text[text.index("\n", start) + 1:]
    return body[:body.index("\n## ")] if "\n## " in body else body


PREVIOUS = summary(s1="Port the parser; never touch vendor/.", s2="Read src/parse.py.", s6="Reading the parser.",
                   s8="- PORT=8421\n- `src/parse.py`\n- token build-7f3a9")


def test_headings_are_recognised_numbered_titled_or_bold() -> None:
    assert heading_index("## 8. Identifiers worth keeping") == 8
    assert heading_index("### 3. Entscheidungen") == 3  # numbered: the number says which
    assert heading_index("## Files touched and how") == 4
    assert heading_index("**Next steps**") == 7
    assert heading_index("**Note:** the parser is slow") is None
    assert heading_index("1. Goals: fix it") is None  # a numbered line, not a heading
    assert heading_index("## Notes") is None


def test_a_section_left_out_is_carried_and_a_section_given_replaces() -> None:
    merged = merge(PREVIOUS, "## 6. Current state\nEditing parse().\n## 2. Work completed\nRead and split parse.py.")
    assert section(merged, 1) == "Port the parser; never touch vendor/."
    assert section(merged, 2) == "Read and split parse.py."
    assert section(merged, 6) == "Editing parse()."
    assert section(merged, 8) == "- PORT=8421\n- `src/parse.py`\n- token build-7f3a9"
    assert merged.index("## 2.") < merged.index("## 6.") < merged.index("## 8."), "sections in their order"


def test_a_heading_inside_a_code_block_is_code() -> None:
    answer = "## 2. Work completed\nWrote the script:\n```sh\n# 1. build\nmake\n```"
    assert section(merge(PREVIOUS, answer), 1) == "Port the parser; never touch vendor/."


def test_none_under_a_section_never_erases_it() -> None:
    lazy = "\n".join(f"## {n}. {title}\nNone" for n, title in enumerate(SECTION_TITLES, 1))
    assert merge(PREVIOUS, lazy) == PREVIOUS


def test_identifiers_are_extended_and_go_only_when_retracted_reassigned_or_repeated() -> None:
    answer = summary(s8="- PORT=9000\n- Superseded: token build-7f3a9\n- `src/lexer.py`\n- `src/parse.py` (split)")
    assert section(merge(PREVIOUS, answer), 8) == "- PORT=9000\n- `src/lexer.py`\n- `src/parse.py` (split)"
    kept = merge(PREVIOUS, "## 8. Identifiers\n- `src/lexer.py`")
    assert section(kept, 8) == "- PORT=8421\n- `src/parse.py`\n- token build-7f3a9\n- `src/lexer.py`"


def test_an_answer_in_another_format_keeps_the_previous_sections() -> None:
    german = "## Ziele\nDen Parser portieren.\n## Erledigte Arbeit\nparse.py gelesen."
    merged = merge(PREVIOUS, german)
    assert merged == german + "\n" + PREVIOUS
    later = merge(merged, "## Ziele\nDen Parser portieren.\n## Erledigte Arbeit\nlexer.py geschrieben.")
    assert later == german + "\nlexer.py geschrieben.\n" + PREVIOUS, "added to, never replaced"
    assert merge("Plain prose before.", "Plain prose after.") == "Plain prose after.", "no sections: as before"


def test_a_first_summary_is_the_answer_itself() -> None:
    assert update(None, "  Anything.\n", 10, len) == "Anything."


def test_over_its_budget_the_oldest_lines_of_the_longest_section_go_first_with_a_marker() -> None:
    work = "\n".join(f"- step {n}: ran the suite and fixed one more failing parser case" for n in range(1, 21))
    text = summary(s2=work, s8="- PORT=8421\n- token build-7f3a9")
    trimmed = trim(text, len(text) - 200, len)
    assert len(trimmed) <= len(text) - 200
    kept = section(trimmed, 2).splitlines()
    assert kept[0] == "[ctxproxy] 4 older lines trimmed"
    assert kept[1].startswith("- step 5:") and kept[-1].startswith("- step 20:")
    assert section(trimmed, 8) == "- PORT=8421\n- token build-7f3a9", "the short sections are left whole"
    again = trim(merge(trimmed, summary(s2=work + "\n- step 21: done")), len(text) - 200, len)
    assert section(again, 8) == "- PORT=8421\n- token build-7f3a9"
    assert section(again, 2).splitlines()[0].startswith("[ctxproxy] ")
