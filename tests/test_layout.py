"""The layout the design promises, checked on the source: the context engine free of HTTP, ``http/`` without an
import circle (``Turn`` below everything that takes a turn)."""

from __future__ import annotations

import ast
from pathlib import Path

PROXY = Path(__file__).resolve().parents[1] / "proxy"


def imported(path: Path) -> set[str]:
    """The ``proxy…`` modules ``path`` imports anywhere, ``TYPE_CHECKING`` blocks included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.split(".")[0] in ("proxy", "aiohttp")}


def test_the_context_engine_imports_nothing_of_http() -> None:
    offenders = {str(path.relative_to(PROXY)): sorted(n for n in imported(path)
                                                      if n.startswith(("aiohttp", "proxy.http", "proxy.dialects.")))
                 for path in (PROXY / "context").rglob("*.py")}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_http_has_no_import_circle() -> None:
    modules = {f"proxy.http.{path.stem}": path for path in (PROXY / "http").glob("*.py") if path.stem != "__init__"}
    edges = {name: {m for m in modules if m in imported(path) and m != name} for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, " -> ".join((*trail, name))
        if name not in done:
            for nxt in sorted(edges[name]):
                visit(nxt, (*trail, name))
            done.add(name)

    for name in sorted(modules):
        visit(name, ())
