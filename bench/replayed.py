"""The corpus's recorded sessions replayed with ``ctxproxy replay``, each in a window a third of its size.

    python3 -m bench.replayed [--corpus ../shared/corpus/sessions] [--share 3] [--write [--label TEXT]]

For each ``*.json`` session of the shared corpus (read from there, never copied
into the repository): ``python3 -m proxy replay FILE --context-window N --json``
with N the session's whole conversation (the engine's own count of every item)
divided by ``--share``, the built-in summariser that keeps nothing (the default),
and the corpus's probes. Deterministic: the table is the same on every run.
``--write`` replaces the section ``## Replayed corpus, issue 33`` of
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import posixpath
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from bench.latency import write_doc
from proxy.context.keep.artifacts import collect
from proxy.context.keep.literals import strings
from proxy.context.keep.shellwrites import writes_text, written
from proxy.context.keep.toolkinds import shell_command
from proxy.context.keep.workingset import same_file
from proxy.context.view.tokens import TokenCounter
from proxy.replay.probes import KINDS
from proxy.replay.sources import read_file

HEADING = "## Replayed corpus, issue 33"
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "sessions"
LABELS = {"paths": "paths", "commands": "commands", "errors": "error lines", "constraints": "constraints",
          "working_set": "last 3 files (exact)"}


def window_of(path: Path, share: int) -> int:
    recording = read_file(path)
    counter = TokenCounter()
    return sum(counter.message_tokens(recording.dialect, item) for item in recording.items) // share


def replay(path: Path, window: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "proxy", "replay", str(path), "--context-window", str(window),
                           "--json"], check=True, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    report: dict[str, Any] = orjson.loads(done.stdout)
    return report


def own_lines(path: Path) -> set[str]:
    """The corpus's error lines that the agent itself wrote in a call (a line of a file it wrote: an output that
    echoes the command, or a read of that file, shows it again), as opposed to lines only outputs hold."""
    raw = orjson.loads(path.read_bytes())
    written: list[str] = []
    for message in raw.get("messages", ()):
        for call in message.get("tool_calls") or ():
            arguments = call.get("function", {}).get("arguments")
            try:
                strings(orjson.loads(arguments) if isinstance(arguments, str) else arguments, written)
            except orjson.JSONDecodeError:
                written.append(arguments)
    return {line for error in raw.get("probes", {}).get("errors", ())
            if (line := error.get("line", "")) and any(line in text for text in written)}


def _file_key(path: str) -> str:
    """A written path as the rewrites are matched (``same_file``, the working set's rule), separators and case
    folded besides: meridianops writes Windows paths."""
    return posixpath.normpath(path.replace("\\", "/").strip("'\"")).lower()


def superseded(path: Path, commands: Iterable[str]) -> int:
    """How many of ``commands`` (lost whole-file writes) wrote only files that a later call wrote or patched again:
    old versions, which the literals let go (a literal a later entry superseded is not added back)."""
    recording = read_file(path)
    dialect, items = recording.dialect, recording.items
    made: dict[str, int] = {}  # a command's text: the index of the item that last ran it
    writes: defaultdict[str, list[int]] = defaultdict(list)  # a file: the items that wrote or patched it
    for index, item in enumerate(items):
        for call_id in dialect.calls(item):
            found = dialect.call_of(item, call_id)
            if found is not None and (command := shell_command(*found)) is not None:
                made[command] = index
                for target in written(command):
                    writes[_file_key(target)].append(index)
        for artifact in collect(dialect, items, index, index + 1):
            if artifact.kind == "file":
                writes[_file_key(artifact.name)].append(index)

    def later(target: str, after: int) -> bool:
        key = _file_key(target)
        return any(at > after for other, ats in writes.items() if same_file(other, key) for at in ats)

    return sum(1 for command in commands if command in made and (targets := written(command))
               and all(later(target, made[command]) for target in targets))


def losses(reports: list[tuple[Path, int, dict[str, Any]]]) -> str:
    """What the last views lost, by what it is: a command that writes a whole file from a heredoc or here-string
    (its text the file's, which the files in hand carry while the file is among the newest), and of those the ones
    whose files a later call wrote again, or any other command; an error line that the agent itself wrote in a call
    or one only outputs hold; a file of the last three."""
    rows = ["| session | commands lost: whole-file writes | of them, files written again later | other commands | "
            "error lines lost: the agent's own writing | met in an output | last files lost |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for path, _, r in reports:
        missed = r["missed"]
        whole = [command for command in missed["commands"] if writes_text(command)]
        own = own_lines(path)
        echoed = sum(line in own for line in missed["errors"])
        rows.append(f"| {path.stem} | {len(whole)} | {superseded(path, whole) if whole else 0} | "
                    f"{len(missed['commands']) - len(whole)} | {echoed} | {len(missed['errors']) - echoed} | "
                    f"{', '.join(f'`{p}`' for p in missed['working_set'])} |")
    return "\n".join(rows)


def _share(kept: int, of: int) -> str:
    return f"{kept}/{of}" if of else "-"


def table(reports: list[tuple[str, int, dict[str, Any]]]) -> str:
    runs = ["| session | steps | window | last request | last view | largest view | over the window | "
            "summaries | masking batches | prefix changes | cost, proxy | cost, as sent |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    kept = ["| session | " + " | ".join(LABELS[k] for k in KINDS) + " |", "|---|" + "---:|" * len(KINDS)]
    totals = {(way, kind): [0, 0] for way in ("view", "truncation") for kind in KINDS}
    for name, window, r in reports:
        made = r["compactions"]
        money = [f"${v:,.2f}" if v is not None else "n/a" for v in (r["cost"]["view"], r["cost"]["as_sent"])]
        runs.append(f"| {name} | {r['steps']} | {window:,} | {r['tokens']['last_request']:,} | "
                    f"{r['tokens']['last_view']:,} | {r['tokens']['largest_view']:,} | {r['over_window']} | "
                    f"{sum(c['tier'] == 'summary' for c in made)} | {sum(c['tier'] == 'mask' for c in made)} | "
                    f"{r['prefix_changes']} | {money[0]} | {money[1]} |")
        cells = []
        for kind in KINDS:
            view, cut = r["retention"]["view"][kind], r["retention"]["truncation"][kind]
            for way, got in (("view", view), ("truncation", cut)):
                totals[way, kind][0] += got["kept"]
                totals[way, kind][1] += got["of"]
            cells.append(f"{_share(view['kept'], view['of'])} ({_share(cut['kept'], cut['of'])})")
        kept.append(f"| {name} | " + " | ".join(cells) + " |")

    def percent(way: str, kind: str) -> str:
        got, of = totals[way, kind]
        return f"{got}/{of} = {got / of:.0%}" if of else "-"

    kept.append("| **all** | " + " | ".join(f"**{percent('view', k)}** ({percent('truncation', k)})"
                                            for k in KINDS) + " |")
    return "\n".join([*runs, "", *kept])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--share", type=int, default=3, help="the window is the session's size divided by this")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--label", default="before the working set, literals and pins of issue 33",
                        help="what the code measured holds, for the doc's \"Code:\" line")
    args = parser.parse_args()
    reports = []
    for path in sorted(args.corpus.glob("*.json")):
        window = window_of(path, args.share)
        reports.append((path, window, replay(path, window)))
        print(path.stem, file=sys.stderr)
    text = table([(path.stem, window, report) for path, window, report in reports]) + "\n\n" + losses(reports)
    print(text)
    if args.write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        write_doc("\n".join([HEADING, "", DESCRIPTION, "", f"Code: {commit}, {args.label}.", "", text, ""]), HEADING)


DESCRIPTION = (
    "`python3 -m bench.replayed --write`: each of the nine recorded sessions in `../shared/corpus/sessions/` "
    "replayed with `python3 -m proxy replay FILE --context-window N --json`, N a third of the session's whole "
    "conversation (the engine's count of every item), the built-in summariser that keeps nothing (what survives "
    "is the proxy's own doing), the corpus's probes. Deterministic (two runs give the same bytes). A step is one "
    "recorded reply, its request everything before it; a prefix change, a view that does not begin with the "
    "whole previous view; cost, the prompts (a prefix shared with the previous request at the cache-read price) "
    "and replies at litellm's prices, where its map knows the model; as sent, the client's whole requests "
    "without a window. Retention counts the probes the last request itself holds, found verbatim among the last "
    "view's strings (in brackets: plain truncation, the newest messages that fit the window); the last three "
    "files written before the last reply count all three, their exact final text. The last table sorts what the "
    "last views lost: a command that writes a whole file from a heredoc or here-string (and of those, the ones "
    "whose every file a later call wrote or patched again), or another; an error line that the agent itself wrote "
    "in a call (a line of a file it wrote, shown again by the output that ran the write or by a read), or one only "
    "outputs hold.")


if __name__ == "__main__":
    main()
