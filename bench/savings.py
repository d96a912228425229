"""What recording the savings costs a request: the proxy's count of the client's whole request.

Run: ``python3 -m bench.savings``. A request whose view differs from what the
client sent (a compacted session: most requests of a long run) also counts the
client's whole request (``Turn.request_tokens``), so that the log can say what
was saved. Every message's count is cached by its hash (``TokenCounter``), so on
a warm cache the work is one cache look-up and one addition per message; this
measures it for histories of 100 to 10,000 messages of about 300 characters,
against the same count of a 60-message view (what a compacted request sends).
The proxy names the session to the sum (``TokenCounter.count_many``'s ``session``):
a step one message longer than the last is then summed from where the two part,
which the last column measures.
"""

from __future__ import annotations

import random
import statistics
import time

from proxy.context.view.budget import ContextBudgetPolicy
from proxy.dialects import CHAT

SIZES = (100, 1_000, 5_000, 10_000)
REPEATS = 200
#: Steps of one message each after the last request, timed by ``per_step``.
STEPS = 50
VIEW = 60


def history(n: int, rng: random.Random) -> list[dict[str, str]]:
    words = "the proxy keeps every message and sends the model a compacted view of them".split()
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": " ".join(rng.choices(words, k=50))}
            for i in range(n)]


def per_call(policy: ContextBudgetPolicy, messages: list[dict[str, str]], hashes: list[str]) -> float:
    """Median microseconds of one warm estimate of ``messages``."""
    policy.estimate(CHAT, messages, source=(messages, hashes))  # warms the per-hash cache
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        policy.estimate(CHAT, messages, source=(messages, hashes))
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def per_step(policy: ContextBudgetPolicy, messages: list[dict[str, str]], hashes: list[str]) -> float:
    """Median microseconds of the sum of a session's request one message longer than its last, by session."""
    start = len(messages) - STEPS - 1
    policy.estimate(CHAT, messages, source=(messages, hashes))  # warms the per-hash cache
    policy.estimate(CHAT, messages[:start], source=(messages[:start], hashes[:start]), session="s")
    times = []
    for n in range(start + 1, len(messages)):
        step, digests = messages[:n], hashes[:n]  # the hash strings are the last request's, as hashes_for gives
        started = time.perf_counter()
        policy.estimate(CHAT, step, source=(step, digests), session="s")
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def main() -> None:
    rng = random.Random(7)
    policy = ContextBudgetPolicy(1_000_000)
    view = history(VIEW, rng)
    print(f"| messages | whole request (µs) | {VIEW}-message view (µs) | one step after the last, by session (µs) |")
    print("|---:|---:|---:|---:|")
    view_us = per_call(policy, view, [CHAT.hash(m) for m in view])
    for n in SIZES:
        messages = history(n + STEPS, rng)
        hashes = [CHAT.hash(m) for m in messages]
        us = per_call(policy, messages[:n], hashes[:n])
        step_us = per_step(policy, messages, hashes)
        print(f"| {n:,} | {us:,.0f} | {view_us:,.0f} | {step_us:,.0f} |")


if __name__ == "__main__":
    main()
