"""The README is a first screen and the reference lives in docs/: checked here so a link that breaks when a heading
is renamed, a README that grows back into the reference, or a citation of a file outside the repository fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

#: The design documents live outside the repository: a reader of the repository cannot open them.
OUTSIDE = ("CONTRACT.md", "WIRE_FORMATS.md", "DESIGN.md", "STYLE.md")

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, inline code blanked: a link or heading in code is an example."""
    lines, fence = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            lines.append(line if line.startswith("#") else re.sub(r"`[^`]*`", "``", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path``, a repeated heading numbered as GitHub numbers it."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose(path.read_text()):
        match = re.match(r"#{1,6} (.*)", line)
        if match:
            base = slug(match.group(1))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def links(path: Path) -> list[str]:
    return [target for line in prose(path.read_text()) for target in LINK.findall(line)
            if not re.match(r"[a-z]+:", target)]


def test_the_readme_is_a_first_screen() -> None:
    assert len(README.read_bytes()) <= 15 * 1024


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading")
    assert broken == []


def test_every_reference_page_is_reachable_from_the_readme() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_file_outside_the_repository_is_cited(page: Path) -> None:
    assert [name for name in OUTSIDE if name in page.read_text()] == []
