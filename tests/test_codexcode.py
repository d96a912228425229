"""Codex's code mode: a JavaScript cell read as the tool calls it makes, or refused when it does anything else."""

from __future__ import annotations

import pytest

from proxy.context.keep.codexcode import cell_calls


def test_a_cell_of_tool_calls_is_read_as_those_calls_in_order() -> None:
    source = ('const patch = "*** Begin Patch\\n*** Add File: a.ts\\n+x\\n*** End Patch";\n'
              "text(await tools.apply_patch(patch));\n"
              'const r = await tools.exec_command({cmd:"npm test","workdir":"/w","yield_time_ms":30_000,'
              '"prefix_rule":["npm","test"],tty:false}); text(r.output); if(r.session_id) text(`ID=${r.session_id}`);\n'
              "await tools.write_stdin({session_id:7,chars:'',yield_time_ms:1000})\n"
              "const v = await tools.view_image({path:'/w/a.png',detail:'original'}); image(v.image_url);\n")
    assert cell_calls(source) == [
        ("apply_patch", "*** Begin Patch\n*** Add File: a.ts\n+x\n*** End Patch"),
        ("exec_command", {"cmd": "npm test", "workdir": "/w", "yield_time_ms": 30000, "prefix_rule": ["npm", "test"],
                          "tty": False}),
        ("write_stdin", {"session_id": 7, "chars": "", "yield_time_ms": 1000}),
        ("view_image", {"path": "/w/a.png", "detail": "original"}),
    ]


@pytest.mark.parametrize("source", [
    "for (const c of ['a', 'b']) await tools.exec_command({cmd: c})",
    "const fs = require('fs'); fs.writeFileSync('a.ts', 'x')",
    "await tools.exec_command({cmd: `rm -rf ${dir}`})",
    "await tools.exec_command({cmd: 'make ' + target})",
    "await tools.apply_patch(unknown)",
    'await tools.apply_patch("\\x41")',
    "async function f() { await tools.apply_patch('x') }",
    'await tools.exec_command({cmd: "ls"}',
    "const s = '§0§'; await tools.apply_patch(s)",
])
def test_a_cell_that_does_anything_else_is_refused(source: str) -> None:
    assert cell_calls(source) is None
