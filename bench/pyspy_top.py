"""The top entries of a py-spy profile of ctxproxy, as Markdown: ``python3 -m bench.pyspy_top FILE [N]``.

``FILE`` is what ``py-spy record -f raw`` wrote (one collapsed stack per line, then its sample count), e.g.
from ``python3 -m bench.hotpath --proxy-wrapper 'py-spy record -r 250 -f raw -o /tmp/prof-{key}.raw --'``.
Stacks that are not request work are left out: startup (imports, the app's startup hooks, the tokenizer's
load) and threads waiting for work. Shares are of the samples left; "self" is time in the function itself,
"inclusive" with what it calls; the last table splits the samples by the main parts of a request (the
event loop's own C code, uvloop with its socket calls, shows as ``run (proxy/server.py)``).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

#: A stack with any of these is not request work.
STARTUP = ("<module>", "_find_and_load", "bundled_encoding", "_make_server", "Application.startup",
           "CleanupContext._on_startup")
#: (group, what marks a frame of it): a sample goes to the group of its innermost frame that has one.
GROUPS = (
    ("store: Redis client", ("redis/", "redisclient.py", "RedisFactLog", "PooledRedis")),
    ("store: SQLite", ("sqlite",)),
    ("access log", ("logging/", "_account")),
    ("history: sync, state, log", ("history.py", "lineage.py", "planning.py", "codec.py", "continuity")),
    ("view and estimate", ("engine.py", "projection", "budget.py", "tokens.py", "tiktoken")),
    ("parse and hash", ("parse_json", "Dialect.parse", "hash (", "hashes_for", "chain_hash", "body.py")),
    ("upstream request (aiohttp client)", ("aiohttp/client", "aiohttp/connector", "client_proto")),
    ("answer to the client", ("relay.py", "web_response", "http_writer")),
    ("HTTP server (aiohttp)", ("web_protocol", "web_app", "web_request", "http_parser", "streams.py")),
)


def _frame(name: str) -> str:
    return re.sub(r":\d+\)", ")", name)


def load(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [_frame(f) for f in stack.split(";")]
        waiting = frames[0].startswith("Thread._bootstrap") and not any("_WorkItem.run" in f for f in frames)
        startup = any(any(mark in f for mark in STARTUP) and "__main__" not in f for f in frames)
        if not waiting and not startup:
            stacks.append((frames, int(count)))
    return stacks


def report(path: Path, n: int) -> str:
    stacks = load(path)
    total = sum(c for _, c in stacks) or 1
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    groups: Counter[str] = Counter()
    for frames, count in stacks:
        own[frames[-1]] += count
        for f in set(frames):
            inclusive[f] += count
        group = next((name for f in reversed(frames) for name, marks in GROUPS if any(m in f for m in marks)),
                     "event loop, sockets and the rest")
        groups[group] += count
    ours = [(f, c) for f, c in inclusive.most_common() if "(proxy/" in f and not f.startswith(
        ("run (", "serve (", "<module>", "error_middleware", "client_key_middleware", "front_door"))][:n]
    lines = [f"{total:,} samples.", "", "| self | function |", "| ---: | --- |"]
    lines += [f"| {100 * c / total:.1f} % | `{f}` |" for f, c in own.most_common(n)]
    lines += ["", "| inclusive | ctxproxy function |", "| ---: | --- |"]
    lines += [f"| {100 * c / total:.1f} % | `{f}` |" for f, c in ours]
    lines += ["", "| inclusive | part of the request |", "| ---: | --- |"]
    lines += [f"| {100 * c / total:.1f} % | {g} |" for g, c in groups.most_common()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    print(report(Path(args[0]), int(args[1]) if len(args) > 1 else 15))


if __name__ == "__main__":
    main()
