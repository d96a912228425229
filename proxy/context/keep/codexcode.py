"""Codex's code mode: the tool calls a JavaScript cell makes, when it makes nothing else.

Codex CLI's ``exec`` tool runs a JavaScript cell that calls the agent's tools
(``await tools.apply_patch(patch)``, ``await tools.exec_command({cmd: "…"})``)
and prints what they return (``text(r.output)``). What such a cell did to
files is what those calls did: ``cell_calls`` reads a cell that is only a
sequence of them as those calls, in order, each with its arguments (a string
literal, a constant bound to one, or an object literal of literals). Anything
else (a loop, a function, another API, an escape JSON does not know) is code
the proxy does not run: None, and the caller assumes it may have changed any
file.

The statements it knows, after string literals are taken out::

    const NAME = "…"
    [const r =] [await] tools.NAME(ARGUMENT) | text([await] tools.NAME(ARGUMENT))
    text(r.output) | image(r.image_url) | if (r.session_id) text(`…${r.session_id}`)
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["cell_calls"]

#: String literals: double-quoted (decoded as JSON), single-quoted without escapes, templates whose only
#: substitutions name a value.
_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'[^\'\\\n]*\'|`(?:[^`\\$]|\$\{[\w.]+\})*`')
_SLOT = r"§(\d+)§"
_NAME = r"[A-Za-z_$][\w$]*"
_VALUE = rf"{_NAME}(?:\.{_NAME})*"
_BIND = re.compile(rf"const\s+({_NAME})\s*=\s*{_SLOT}")
_CALL = re.compile(rf"(?:const\s+{_NAME}\s*=\s*)?(?:await\s+)?tools\.({_NAME})\((.*)\)"
                   rf"|text\(\s*(?:await\s+)?tools\.({_NAME})\((.*)\)\s*\)", re.DOTALL)
_OUTPUT = re.compile(rf"(?:if\s*\(\s*!?{_VALUE}\s*\)\s*)?(?:text|image)\(\s*(?:{_VALUE}|{_SLOT})\s*\)")
_SCALAR = re.compile(r"-?\d[\d_]*(?:\.\d+)?|true|false|null")


def cell_source(name: str, args: Any) -> str | None:
    """The JavaScript a Codex code-mode cell runs (an ``exec`` call with a string ``input``), or None for any other
    call: the one test of what a cell is, for the working set and the literals alike."""
    if name.lower() != "exec" or not isinstance(args, dict) or not isinstance(args.get("input"), str):
        return None
    return str(args["input"])


def cell_calls(source: str) -> list[tuple[str, Any]] | None:
    """The tool calls of a code-mode cell, in order (name, arguments), or None when it does anything else."""
    literals: list[Any] = []

    def slot(found: re.Match[str]) -> str:
        literals.append(_decoded(found.group(0)))
        return f"§{len(literals) - 1}§"

    skeleton = _LITERAL.sub(slot, source)
    if "§" in source or any(ch in skeleton for ch in "\"'`"):
        return None
    constants: dict[str, Any] = {}
    calls: list[tuple[str, Any]] = []
    for statement in _split(skeleton, ";\n"):
        if _OUTPUT.fullmatch(statement):
            continue
        if (bound := _BIND.fullmatch(statement)) is not None:
            constants[bound.group(1)] = literals[int(bound.group(2))]
            continue
        call = _CALL.fullmatch(statement)
        if call is None:
            return None
        name, argument = (call.group(1), call.group(2)) if call.group(1) else (call.group(3), call.group(4))
        value = _argument(argument.strip(), literals, constants)
        if value is None:
            return None
        calls.append((name, value))
    return calls


def _decoded(literal: str) -> Any:
    """A literal's text; None for one whose text is not known exactly (an escape JSON does not read, a template
    with substitutions)."""
    if literal.startswith('"'):
        try:
            return json.loads(literal)
        except ValueError:
            return None
    if literal.startswith("`") and "${" in literal:
        return None
    return literal[1:-1]


def _argument(text: str, literals: list[Any], constants: dict[str, Any]) -> Any:
    """An argument: a literal, a constant, or an object literal of them; None when it is anything else."""
    if (found := re.fullmatch(_SLOT, text)) is not None:
        return literals[int(found.group(1))]
    if re.fullmatch(_NAME, text):
        return constants.get(text)
    if text.startswith("{") and text.endswith("}"):
        return _object(text[1:-1], literals, constants)
    return None


def _object(body: str, literals: list[Any], constants: dict[str, Any]) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for entry in _split(body):
        key, colon, value = entry.partition(":")
        key, value = key.strip(), value.strip()
        if not colon:
            return None
        if (slot := re.fullmatch(_SLOT, key)) is not None:
            key = literals[int(slot.group(1))]
        if not isinstance(key, str) or not key or (parsed := _plain(value, literals, constants)) is None:
            return None
        out[key] = parsed[0]
    return out


def _plain(value: str, literals: list[Any], constants: dict[str, Any]) -> tuple[Any] | None:
    """A value in an object literal, boxed (None inside is JSON's null); None when it is not a plain value."""
    if _SCALAR.fullmatch(value):
        return (json.loads(value.replace("_", "")),)
    if value.startswith("[") and value.endswith("]"):
        items = [_plain(item, literals, constants) for item in _split(value[1:-1])]
        boxed = [item for item in items if item is not None]
        return ([item[0] for item in boxed],) if len(boxed) == len(items) else None
    found = _argument(value, literals, constants)
    return None if found is None else (found,)


def _split(body: str, separators: str = ",") -> list[str]:
    """``body`` split at its top-level ``separators`` (none inside brackets); empty entries left out."""
    parts: list[str] = []
    depth = 0
    start = 0
    for at, ch in enumerate(body):
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch in separators and depth == 0:
            parts.append(body[start:at])
            start = at + 1
    parts.append(body[start:])
    return [part for part in (p.strip() for p in parts) if part]
