"""What a shell command may have done to the files the agent has in hand: the conservative rule.

The working set (``proxy.context.keep.workingset``) must never show a stale text as
current, and a shell can change any file. A command is split into simple
commands (at ``&&``, ``||``, ``;``, ``|``, newlines) and read as follows:

- a heredoc written to a file (``cat > PATH <<'EOF'`` … ``EOF``, as Codex
  writes files) sets that file's text exactly (a quoted delimiter, or a body
  with nothing the shell would expand); an append or an expanding body only
  drops it. An output redirect (``>``, ``>>``), ``tee`` or PowerShell's
  ``Set-Content`` drops its target (``written``, the one reader of these, the
  literals' too: outside quotes, heredoc bodies and here-strings);
- a program that writes the files it names (``rm``, ``mv``, ``sed -i``,
  ``gofmt -w``, ``prettier --write``, …) drops every file an argument names or
  holds (a directory); given a glob, a ``$`` expansion or no path it drops every file;
- a copy (``cp``, ``ln``, ``rsync``, ``install``) writes only its destination,
  the last path: it drops what that names or holds, and reads its sources, globs
  too (``cp tests/*.js web/tests/`` leaves ``tests/a.js`` as it was); a
  destination given by ``-t`` or that is a glob drops every file;
- a command that rewrites a tree (``git checkout``/``reset``/``stash``/``pull``,
  ``find -delete``, ``ruff --fix``, ``go fmt``, inline code that writes:
  ``python -c "open(…, 'w')…"``) and a command that does not parse drop every
  file; a package manager's ``install``/``add``/``tidy`` drops the manifests
  and lock files (``package.json``, ``go.mod``, …) wherever they are;
- a program known to only read (``ls``, ``cat``, ``grep``, ``rg``, ``sed -n``,
  ``git status``/``diff``/``log``, ``mkdir``, …) drops nothing, and a plain
  ``cat [--] PATH`` alone is a whole read of PATH, its output the file's bytes
  (PowerShell's ``Get-Content [-Raw] PATH`` alone is one too, its output the
  file's lines, not its bytes; ``-ErrorAction``/``-EA`` silences its errors,
  not its output). A read that stops at a line bound (``sed -n '1,Np' PATH``,
  as Codex reads files, ``head -n N PATH``) alone is a whole read of PATH where
  its output holds fewer than N lines (it stopped at the file's end, not at the
  bound: ``ShellEffect.read_lines``). Only its errors may be redirected (``2>/dev/null``,
  ``2> /dev/null``, ``2>$null``): its output is still the file; ``2>&1``
  merges the errors into it, and any other redirection takes it elsewhere, so
  neither is a read;
- a test runner (``pytest``, ``python -m pytest``, ``jest``, ``vitest``,
  ``node --test``, ``npx playwright test``, …) reads the tests it is given:
  it drops nothing;
- any other program (a build, ``python script.py``, ``curl``) is trusted to
  leave the agent's files alone, except the files its arguments name (the
  script an interpreter runs excepted): those may be its outputs.

The one assumption is the last: a program that is not a known writer does not
rewrite a file it is not told about. Dropping every file at each test run would
leave nothing in hand in a real session (the agent tests after every change);
the label each file carries (the log entry it is current as of) and the
verbatim tail after it keep what the model sees honest.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import NamedTuple

_HEREDOC = re.compile(
    r"(?:^|(?<=[\n;&|]))[ \t]*cat[ \t]+(?:(>>?)[ \t]*(\S+)[ \t]+<<(-?)[ \t]*(['\"]?)(\w+)\4"
    r"|<<(-?)[ \t]*(['\"]?)(\w+)\7[ \t]*(>>?)[ \t]*(\S+))[ \t]*\n(.*?)\n[ \t]*(?:\5|\8)[ \t]*(?=\n|$)",
    re.DOTALL)
READ_ONLY = frozenset({
    "ls", "cat", "head", "tail", "grep", "egrep", "fgrep", "rg", "ag", "ack", "wc", "nl", "uniq", "diff", "cmp",
    "file", "stat", "pwd", "echo", "printf", "which", "type", "true", "false", "test", "[", "cd", "pushd", "popd",
    "du", "df", "tree", "jq", "less", "more", "date", "printenv", "whoami", "uname", "id", "ps", "sleep", "xxd",
    "od", "hexdump", "md5sum", "sha1sum", "sha256sum", "basename", "dirname", "realpath", "readlink", "column",
    "cut", "tr", "fd", "fdfind", "export", "set", "exit", "sort", "find", "lsof", "netstat", "ss", "hostname",
    "nproc", "free", "uptime", "mkdir", "touch", "chmod", "sed", "awk", "gawk", "gofmt", "goimports",
})
#: Programs that write the files their arguments name (and, given a directory or a glob, anything under it).
MUTATORS = frozenset({"rm", "mv", "truncate", "dd", "unlink", "patch", "tar", "unzip", "black", "isort", "autopep8",
                      "rustfmt", "prettier", "shred"})
#: Programs that write only their last path argument (the destination), reading the others.
COPIERS = frozenset({"cp", "ln", "rsync", "install"})
#: Options that give a copy its destination elsewhere than last (``cp -t DIR SRC…``): read as writing anything.
_TARGET_OPTION = re.compile(r"^(?:--target-directory|-[a-zA-Z]*t)")
#: Programs that write only when given one of these flags (``sed -i``, ``gofmt -w``): else they only read.
WRITE_FLAGS = {"sed": ("-i", "--in-place"), "perl": ("-i",), "gofmt": ("-w",), "goimports": ("-w",),
               "find": ("-delete", "-exec", "-execdir", "-ok", "-fprint"), "sort": ("-o", "--output"),
               "ruff": ("--fix", "format"), "eslint": ("--fix",), "prettier": ("--write", "-w"),
               "awk": ("-i",), "gawk": ("-i",)}
#: Subcommands that rewrite the tree: ``git checkout``, ``npm install`` (anything under the directory may change).
TREE_WRITERS = {"git": frozenset({"checkout", "reset", "restore", "stash", "apply", "pull", "merge", "rebase",
                                  "switch", "cherry-pick", "revert", "am", "clean", "mv", "rm"})}
#: Package managers' subcommands that write the manifests and lock files (and their own trees, never tracked).
MANIFEST_WRITERS = {
                "npm": frozenset({"install", "i", "ci", "add", "uninstall", "remove", "update", "init", "pkg"}),
                "pnpm": frozenset({"install", "i", "add", "remove", "update", "init"}),
                "yarn": frozenset({"install", "add", "remove", "upgrade", "init"}),
                "bun": frozenset({"install", "add", "remove", "update", "init"}),
                "pip": frozenset({"install", "uninstall"}), "pip3": frozenset({"install", "uninstall"}),
                "cargo": frozenset({"fmt", "fix", "add", "remove", "init", "new"}),
                "go": frozenset({"mod", "get", "work"})}
MANIFESTS = ("package.json", "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml", "bun.lockb",
             "bun.lock", "requirements.txt", "pyproject.toml", "Pipfile", "Pipfile.lock", "poetry.lock", "uv.lock",
             "Cargo.toml", "Cargo.lock", "go.mod", "go.sum", "go.work", "go.work.sum")
#: Inline code (``python -c``, ``node -e``) that may write a file: any of these in it.
_INLINE_WRITES = re.compile(r"write|unlink|rename|remove|rmtree|replace\(|['\"][wa]b?\+?['\"]|truncate|copy")
_INLINE_FLAGS = frozenset({"-c", "-e", "--eval", "-p"})
_PREFIXES = frozenset({"sudo", "env", "time", "nice", "nohup", "command", "exec", "xargs"})
_CONTROL = frozenset({"&&", "||", ";", "|", "&", "(", ")", ";;", "|&"})
_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>"})
#: ``written``: a quoted string (masked before redirections are looked for: its ``>`` is text), a redirection (not
#: an arrow ``=>``/``->``), ``tee`` and PowerShell's content cmdlets, each before its target, quoted or bare.
_QUOTED = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'")
_WRITER = re.compile(r"(?<![=\-<>])(?:&>>?|\d?>>?\|?)|(?<![\w-])tee(?=\s)"
                     r"|(?<![\w-])(?:Set-Content|Add-Content|Out-File)(?:\s+-(?:Path|FilePath|LiteralPath))?(?=\s)",
                     re.IGNORECASE)
_TARGET = re.compile(r"""\s*(?:"([^"\n]*)"|'([^'\n]*)'|([^\s;|&<>'"()]+))""")
_OPTION = re.compile(r"\s+-[\w-]*")
#: A heredoc's opening (its body, up to the delimiter line, is text), and a PowerShell here-string's.
_OPENS = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
_HERE_STRING = ("@'", '@"')
#: ``sed -n``'s script that prints lines 1 to N, and ``head``'s options that give N.
_SED_FIRST = re.compile(r"1,(\d+)p")
_HEAD_LINES = re.compile(r"(?:-n ?|--lines=)(\d+)|-(\d+)")
_GLOB = re.compile(r"[*?\[$`]")
#: A descriptor's number glued to a redirection (``2>``), outside quoted strings (matched first, and kept).
_DESCRIPTOR = re.compile(r"""("(?:[^"\\\n]|\\.)*"|'[^'\n]*')|(?<![\w$-])\d(?=>)""")
#: PowerShell's common parameter that says what to do with a cmdlet's errors (its value follows).
_ERROR_ACTION = frozenset({"-erroraction", "-ea"})
#: Interpreters: the script they run is read, not written (the arguments after it may be outputs).
INTERPRETERS = frozenset({"python", "python3", "node", "bash", "sh", "zsh", "ruby", "perl", "deno", "bun", "tsx",
                          "ts-node", "php"})
#: Test runners: the files they are given are the tests they read (run directly, as ``python -m NAME``, or through
#: ``npx``); ``node --test`` and ``deno test``/``bun test`` are runners too.
TEST_RUNNERS = frozenset({"pytest", "py.test", "unittest", "jest", "vitest", "mocha", "playwright", "ava", "tap"})
_PACKAGE_RUNNERS = frozenset({"npx", "pnpx", "bunx"})


@dataclass
class ShellEffect:
    """What one command did to files: exact writes (path, text or None), a whole read (and whether its output is
    the file's bytes, and the line bound it stops at: whole only where its output holds fewer lines), paths it may
    have changed, the words of runners (a file they name is dropped), and whether it may have changed any file at
    all."""

    writes: list[tuple[str, str | None]] = field(default_factory=list)
    read: str | None = None
    verbatim: bool = False
    read_lines: int | None = None
    changed: list[str] = field(default_factory=list)
    mentioned: list[str] = field(default_factory=list)
    anything: bool = False


def effect(command: str) -> ShellEffect:
    """The effect of ``command`` on files, by the rule in the module docstring."""
    out = ShellEffect()
    rest = command
    for found in reversed(list(_HEREDOC.finditer(command))):
        append, path = found.group(1) or found.group(9), found.group(2) or found.group(10)
        strip, quote, body = found.group(3) or found.group(6), found.group(4) or found.group(7), found.group(11)
        exact = append == ">" and not strip and (bool(quote) or not re.search(r"[$`\\]", body))
        out.writes.insert(0, (path, body + "\n" if exact else None))
        rest = rest[:found.start()] + rest[found.end():]
    try:
        # Each line a command of its own: the separator after the newline, so that a comment ends at its line.
        # A descriptor's number glued to its redirection (``2>``) is the operator's, not a word.
        bare = _DESCRIPTOR.sub(lambda found: found.group(1) or "", rest)
        lexer = shlex.shlex(bare.replace("\\\n", " ").replace("\n", "\n ; "), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        out.anything = True
        return out
    targets, output_kept = _redirected(rest)
    for target in targets:
        if _GLOB.search(target):
            out.anything = True
            return out
        out.changed.append(target)
    segments: list[list[str]] = [[]]
    for word in words:
        if word in _CONTROL:
            segments.append([])
        else:
            segments[-1].append(word)
    for segment in (_without_redirects(s) for s in segments if s):
        if _segment(segment, out):
            out.anything = True
            return out
    if len(segments) == 1 and not out.changed and not out.writes and output_kept:
        _whole_read(_without_redirects(segments[0]), out)
    return out


def _whole_read(words: list[str], out: ShellEffect) -> None:
    """Record in ``out`` the file that the one simple command ``words`` prints whole, if it does."""
    if words[:1] == ["cat"] and len(paths := words[2:] if words[1:2] == ["--"] else words[1:]) == 1:
        if words[1] == "--" or not paths[0].startswith("-"):
            out.read, out.verbatim = paths[0], True
    elif words[:1] == ["Get-Content"]:
        out.read = _content_path(words[1:])
    elif (bounded := _bounded_read(words)) is not None:
        out.read, out.read_lines = bounded
        out.verbatim = True


def _bounded_read(words: list[str]) -> tuple[str, int] | None:
    """(PATH, N) of ``sed -n '1,Np' PATH`` or ``head -n N PATH`` (``-nN``, ``-N``, ``--lines=N``): the first N lines of
    one file, its bytes; None for anything else (another range, an expression, two files)."""
    if len(words) == 4 and words[:2] == ["sed", "-n"] and (found := _SED_FIRST.fullmatch(words[2])):
        bound, path = int(found.group(1)), words[3]
    elif words[:1] == ["head"] and (found := _HEAD_LINES.fullmatch(" ".join(words[1:-1]))) and len(words) > 2:
        bound, path = int(found.group(1) or found.group(2)), words[-1]
    else:
        return None
    return (path, bound) if bound > 0 and not path.startswith("-") else None


def _content_path(args: list[str]) -> str | None:
    """The file ``Get-Content ARGS`` prints whole: one path, beside ``-Raw`` and an ``-ErrorAction`` (its errors
    only); None for anything else (a ``-TotalCount``, a ``-Tail``, two paths)."""
    paths: list[str] = []
    words = iter(args)
    for word in words:
        if word.lower() in _ERROR_ACTION:
            if next(words, None) is None:
                return None
        elif word.lower() != "-raw":
            paths.append(word)
    return paths[0] if len(paths) == 1 and not paths[0].startswith("-") else None


def _without_redirects(segment: list[str]) -> list[str]:
    words: list[str] = []
    skip = False
    for word in segment:
        if skip:
            skip = False
        elif word in _REDIRECTS or word == "<":
            skip = True
        else:
            words.append(word)
    while words and (("=" in words[0] and not words[0].startswith("=")) or words[0] in _PREFIXES):
        words.pop(0)
    if words and words[0] == "timeout" and len(words) > 2:
        words = words[2:]
    return words


def _segment(segment: list[str], out: ShellEffect) -> bool:
    """Record what one simple command changes in ``out``; True when it may have changed any file."""
    if not segment:
        return False
    program = segment[0].rsplit("/", 1)[-1]
    args = segment[1:]
    flags = WRITE_FLAGS.get(program, ())
    writes = any(arg == flag or (flag.startswith("-") and arg.startswith(flag)) for arg in args for flag in flags)
    paths = [arg for arg in args if not arg.startswith("-")]
    if program in COPIERS and paths:
        if _GLOB.search(paths[-1]) or (program != "rsync" and any(_TARGET_OPTION.match(arg) for arg in args)):
            return True
        out.changed.append(paths[-1])
        return False
    if program == "tee":
        return False  # what it writes is ``written``'s
    if (writes and program not in ("find", "ruff") and paths) or program in MUTATORS:
        if not paths or any(_GLOB.search(path) for path in paths):
            return True
        out.changed.extend(paths)
        return False
    if writes or (program in TREE_WRITERS and paths and paths[0] in TREE_WRITERS[program]):
        return True
    if program in MANIFEST_WRITERS and paths and paths[0] in MANIFEST_WRITERS[program]:
        out.changed.extend(MANIFESTS)
        return False
    if program in READ_ONLY or _runs_tests(program, args):
        return False
    inline = next((args[at + 1] for at, arg in enumerate(args[:-1]) if arg in _INLINE_FLAGS), None)
    if inline is not None and _INLINE_WRITES.search(inline):
        return True
    if program in INTERPRETERS and paths:
        args = [arg for arg in args if arg != paths[0]]
    out.mentioned.extend(args)
    return False


def _runs_tests(program: str, args: list[str]) -> bool:
    """Whether ``program args`` runs tests (``TEST_RUNNERS``), whose file arguments it reads."""
    if program in _PACKAGE_RUNNERS:
        named = [arg for arg in args if not arg.startswith("-")]
        return bool(named) and named[0] in TEST_RUNNERS
    if program in INTERPRETERS and "-m" in args[:-1]:
        return args[args.index("-m") + 1] in TEST_RUNNERS
    if program == "node":
        return "--test" in args
    if program in ("deno", "bun"):
        return args[:1] == ["test"]
    return program in TEST_RUNNERS


def written(command: str) -> list[str]:
    """The files ``command`` writes by redirection, ``tee`` or PowerShell's content cmdlets, in order, each once:
    read outside quoted strings, heredoc bodies and here-strings (their ``>`` are text, not redirections); devices,
    descriptors and variables left out. The one reader of these for the working set (``effect``) and the literals
    (``proxy.context.keep.literals``)."""
    return _redirected(command)[0]


def _redirected(command: str) -> tuple[list[str], bool]:
    """``written``, and whether the command's output stays its own: nothing it writes through is an output
    redirection but of its errors alone (``2>``, ``2>>``, not ``2>&1``, which merges them into the output)."""
    out: list[str] = []
    kept = True
    inside = {at for body in bodies(command) for at in range(body.start, body.end)}
    for line in (line for at, line in enumerate(command.splitlines()) if at not in inside):
        masked = _QUOTED.sub(lambda found: found.group(0)[0] * len(found.group(0)), line)
        for found in _WRITER.finditer(masked):
            out += _targets(line, found.end(), many=found.group(0) == "tee")
            kept = kept and _errors_only(masked, found)
    return [path for path in dict.fromkeys(out) if not path.startswith(("/dev/", "&", "$")) and path != "nul"], kept


def _errors_only(masked: str, found: re.Match[str]) -> bool:
    """Whether the writer ``found`` in ``masked`` redirects a command's errors alone: ``2>`` or ``2>>`` whose
    ``2`` is no word's last character (``file2>out`` writes the output of ``cat file2``), not into the output
    (``2>&1``)."""
    before = masked[found.start() - 1] if found.start() else " "
    return (found.group(0) in ("2>", "2>>") and not (before.isalnum() or before in "_$-")
            and not masked[found.end():].lstrip().startswith("&"))


class Body(NamedTuple):
    """A heredoc's or here-string's body: lines ``start`` to ``end`` (exclusive) of ``command.splitlines()``, its
    opening the line before; ``closed`` when its delimiter line follows (else it runs to the command's end)."""

    start: int
    end: int
    closed: bool


def bodies(command: str) -> list[Body]:
    """The heredoc and here-string bodies of ``command``, in order, read line by line: for ``written`` (their text
    is no redirection) and the artifact trail (``artifactparse.command_name`` shows a long command without them)."""
    out: list[Body] = []
    closing: str | None = None
    start = 0
    lines = command.splitlines()
    # The last line each here-string closer opens: one pass, so a command of many openers stays linear.
    last_closer = {closer: at for at, line in enumerate(lines) for closer in ("'@", '"@') if line.startswith(closer)}
    for at, line in enumerate(lines):
        if closing is not None:
            if line.strip() != closing and not (closing in ("'@", '"@') and line.startswith(closing)):
                continue
            out.append(Body(start, at, True))
            closing = None
        if line.lstrip().startswith(_HERE_STRING):
            closing, start = line.lstrip()[1] + "@", at + 1
            continue
        if _closed_here_string(line, at, last_closer):  # ``$page = @"``, ``-Value @'``: its closer ends it
            closing, start = line.rstrip()[-1] + "@", at + 1
            continue
        if (heredoc := _OPENS.search(line)) is not None:
            closing, start = heredoc.group(2), at + 1
    if closing is not None:
        out.append(Body(start, len(lines), False))
    return out


def _closed_here_string(line: str, at: int, last_closer: dict[str, int]) -> bool:
    """Whether ``line`` (line ``at``) opens a PowerShell here-string where an expression goes (``$page = @"``,
    ``Set-Content a -Value @'``: the opener last on its line, as PowerShell requires) that a later line closes
    (``"@`` or ``'@`` opening it; ``last_closer``: the last line each closer opens). Only a closed one counts: a bash
    line may end in ``@'`` too (``echo 'user@'``), and one that no ``'@`` line follows is read as before."""
    end = line.rstrip()
    return end.endswith(_HERE_STRING) and last_closer.get(end[-1] + "@", -1) > at


def _targets(line: str, at: int, *, many: bool) -> list[str]:
    """The target after a writer at ``at`` in ``line``: one, or for ``tee`` every file before the next operator."""
    out: list[str] = []
    while True:
        while (option := _OPTION.match(line, at)) is not None and many:
            at = option.end()
        found = _TARGET.match(line, at)
        if found is None:
            return out
        out.append(next(group for group in found.groups() if group is not None))
        if not many:
            return out
        at = found.end()


def writes_text(command: str) -> bool:
    """Whether ``command`` writes a file's text from a heredoc or here-string (one the literals carry as the file's
    text, ``proxy.context.keep.literals``)."""
    if "\n" not in command:
        return False
    opens = _OPENS.search(command) or any(line.lstrip().startswith(_HERE_STRING) for line in command.splitlines())
    return bool(opens) and bool(written(command))
