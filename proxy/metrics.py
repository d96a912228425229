"""Prometheus metrics, on a registry per app so tests and several apps in one process never collide.

Names and labels are the contract's. Buckets fit what they time: the proxy's own
overhead lives between 0.1 ms and 100 ms, a compaction (an LLM call) between
0.1 s and 5 minutes.

Under ``serve --workers N`` each worker is a process of its own, and ``/metrics``
is answered by whichever worker the kernel hands the scrape to. There the
metrics use prometheus_client's multiprocess mode (``Metrics(multiprocess_dir=…)``):
every worker writes its values to mmap files in that directory, and the scrape
registry is a ``MultiProcessCollector`` over all of them, so counters and
histograms are the exact sums over workers whichever worker answers.
``ctxproxy_sessions_active`` is then a per-worker value summed over live workers
(``livesum``): a session served by k workers in the window counts k times (an
agent on one keep-alive connection stays on one worker). Process metrics
(``process_*``) carry ``worker`` and ``pid`` labels, one series per worker.
"""

from __future__ import annotations

import collections
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from proxy.context.checkpoint import CompactionOutcome
from proxy.context.compactor import CompactionResult
from proxy.context.engine import Trigger
from proxy.dialects import DIALECTS
from proxy.prefixes import CAUSES
from proxy.savings import CacheFigures, summary_cost
from proxy.store.base import Kind, SessionKey, StoredFact

#: The label values the HELP texts list (the contract's): routes, compaction triggers, the in-memory caches.
ROUTES = (*DIALECTS, "passthrough", "admin", "ui")
TRIGGERS = get_args(Trigger)
CACHES = ("states", "recent", "pending", "tokens", "timelines")


def _values(values: Iterable[str]) -> str:
    return ", ".join(values)


OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
UPSTREAM_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
COMPACTION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ACTIVE_WINDOW = 15 * 60.0
#: Bound on the sessions remembered for the active gauge; past it the oldest are forgotten (the gauge saturates).
MAX_TRACKED_SESSIONS = 100_000
#: Written by the ``--workers`` parent into the multiprocess directory, one per worker: its pid.
WORKER_PID_FILE = "worker-{index}.pid"


def write_worker_pid(directory: str | Path, index: int, pid: int) -> None:
    (Path(directory) / WORKER_PID_FILE.format(index=index)).write_text(str(pid))


def _constant(pid: int) -> Callable[[], int]:
    return lambda: pid


class WorkerProcessCollector(Collector):
    """``process_*`` metrics of every worker, read from /proc at scrape time, labelled ``worker`` and ``pid``."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def workers(self) -> list[tuple[str, int]]:
        found = []
        for path in sorted(self.directory.glob(WORKER_PID_FILE.format(index="*"))):
            try:
                pid = int(path.read_text())
            except (OSError, ValueError):
                continue
            found.append((path.stem.removeprefix("worker-"), pid))
        return found

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for index, pid in self.workers():
            for family in ProcessCollector(pid=_constant(pid), registry=None).collect():
                out = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    out.add_sample(sample.name, {**sample.labels, "worker": index, "pid": str(pid)}, sample.value)
        return list(families.values())


class Metrics:
    """``multiprocess_dir``: this process is one worker of several (see the module's docstring).

    The process must have been started with ``PROMETHEUS_MULTIPROC_DIR`` set to that directory:
    prometheus_client reads it once, at import, to decide where values live.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, multiprocess_dir: str | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.multiprocess = multiprocess_dir is not None
        if multiprocess_dir is None:
            ProcessCollector(registry=self.registry)
            r = self.registry
        else:
            if not getattr(values.ValueClass, "_multiprocess", False) or (
                    os.environ.get("PROMETHEUS_MULTIPROC_DIR") != multiprocess_dir):
                raise RuntimeError("multiprocess metrics need PROMETHEUS_MULTIPROC_DIR set to "
                                   f"{multiprocess_dir} before prometheus_client is imported")
            # What /metrics serves: the sum over every worker's files, and each worker's process metrics.
            MultiProcessCollector(self.registry, path=multiprocess_dir)  # type: ignore[no-untyped-call]
            self.registry.register(WorkerProcessCollector(multiprocess_dir))
            r = CollectorRegistry()  # the metric objects themselves; their values are this worker's files
        self.requests = Counter("ctxproxy_requests",
                                f"Requests served, by route ({_values(ROUTES)}) and HTTP status.",
                                ["route", "status"], registry=r)
        self.compactions = Counter("ctxproxy_compactions",
                                   f"Compactions attempted (a masking batch counts as one), by trigger "
                                   f"({_values(TRIGGERS)}) and outcome ({_values(get_args(CompactionOutcome))}).",
                                   ["trigger", "outcome"], registry=r)
        self.compaction_seconds = Histogram("ctxproxy_compaction_seconds", "Time a compaction took.",
                                            buckets=COMPACTION_BUCKETS, registry=r)
        self.compaction_wait_seconds = Histogram(
            "ctxproxy_compaction_wait_seconds", "How long a request past the trigger waited on a compaction "
            "(0: a background summary was ready, or on its way while the view still fit).",
            buckets=COMPACTION_BUCKETS, registry=r)
        self.literals = Counter("ctxproxy_literals", "Exact literals of compacted messages, by what each compaction's "
                                "receipt says of them (outcome: kept by the view, added back by the proxy, dropped "
                                "for budget).",
                                ["outcome"], registry=r)
        self.tokens_before = Counter("ctxproxy_tokens_before_compaction", "View tokens before compactions.",
                                     registry=r)
        self.tokens_after = Counter("ctxproxy_tokens_after_compaction", "View tokens after compactions.", registry=r)
        self.reactive_retries = Counter("ctxproxy_reactive_retries", "Retries after a prompt-too-long answer, by "
                                        "outcome (ok, failed).",
                                        ["outcome"], registry=r)
        self.log_entries = Counter("ctxproxy_log_entries", f"Entries appended to the log, by kind "
                                   f"({_values(get_args(Kind))}).", ["kind"], registry=r)
        self.store_errors = Counter("ctxproxy_store_errors", "Store operations that failed.", registry=r)
        self.upstream_seconds = Histogram("ctxproxy_upstream_seconds", "Time waiting for the upstream.",
                                          buckets=UPSTREAM_BUCKETS, registry=r)
        self.overhead_seconds = Histogram("ctxproxy_overhead_seconds", "Time spent in the proxy, upstream excluded.",
                                          buckets=OVERHEAD_BUCKETS, registry=r)
        self.upstream_prompt_tokens = Counter("ctxproxy_upstream_prompt_tokens",
                                              "Prompt tokens the upstream reported in its replies' usage, cached "
                                              "ones included.", registry=r)
        self.upstream_cached_tokens = Counter("ctxproxy_upstream_cached_tokens",
                                              "Prompt tokens the upstream reported as read from its prompt cache.",
                                              registry=r)
        # Net (proxy.savings): what compaction took out of requests less what its summary calls cost, so a gauge
        # (a summary lowers it); summed over workers, dead ones included, as a counter is.
        self.tokens_saved = Gauge("ctxproxy_tokens_saved_total", "Tokens compaction took out of the requests "
                                  "clients sent, by the proxy's own count, less the tokens its summary calls "
                                  "used (net: below 0 while the summaries have not paid for themselves).",
                                  multiprocess_mode="sum", registry=r)
        self.cost_saved = Gauge("ctxproxy_cost_saved_dollars_total", "Those tokens in dollars: saved ones at the "
                                "model's input price, summary calls at its input and output prices, from "
                                "litellm's bundled map (models it prices only).", multiprocess_mode="sum",
                                registry=r)
        self.prefix_changes = Counter("ctxproxy_prefix_changes", "Requests whose prompt prefix differed from the "
                                      "session's previous request's, by cause: "
                                      f"{_values(CAUSES)} (ttl: the cache had lapsed, not the proxy's doing).",
                                      ["cause"], registry=r)
        self.cache_writes = Counter("ctxproxy_cache_write_tokens", "Tokens written to the upstream's prompt cache: "
                                    "its cache_creation_input_tokens, else the view past the prefix it kept.",
                                    registry=r)
        self.ttl_writes = Counter("ctxproxy_ttl_write_tokens", "Of those, the ones the cache's expiry made: a request "
                                  "after an idle gap past the cache's life (cause ttl) rewrote what it would have "
                                  "read, beyond its new items.", registry=r)
        self.peak_tokens = Counter("ctxproxy_peak_context_tokens", "Each session's peak context, summed (as it grows; "
                                   "per process): the client's largest request, as it sent it, whatever the proxy "
                                   "sent instead. (ctxproxy_cache_write_tokens_total - "
                                   "ctxproxy_ttl_write_tokens_total) over it is the re-write factor, 1.0 when every "
                                   "token was written to the cache once.", registry=r)
        self.sessions_active = Gauge("ctxproxy_sessions_active", "Sessions seen in the last 15 minutes.",
                                     multiprocess_mode="livesum", registry=r)
        if not self.multiprocess:
            self.sessions_active.set_function(self._active_count)
        self._seen: OrderedDict[SessionKey, float] = OrderedDict()
        self.cache_bytes = Gauge("ctxproxy_cache_bytes", f"Bytes the in-memory caches hold, estimated, by cache "
                                 f"({_values(CACHES)}).",
                                 ["cache"], multiprocess_mode="livesum", registry=r)
        #: What each cache holds, in bytes (set by the app): read at every scrape, and by a worker's refresh.
        self.caches: Callable[[], Mapping[str, int]] | None = None
        #: ``labels()`` children of the per-request counters, by label values (``request_served``).
        self._served: dict[tuple[str, int | str], Counter] = {}
        self._entries: dict[str, Counter] = {}

    def request_served(self, route: str, status: int | str) -> None:
        """Count one request under ``ctxproxy_requests{route, status}``.

        ``labels()`` checks and looks up its arguments under a lock on every call; the children are cached here
        instead, once per route and status (a few dozen at most).
        """
        child = self._served.get((route, status))
        if child is None:
            child = self._served[(route, status)] = self.requests.labels(route=route, status=str(status))
        child.inc()

    def facts_appended(self, facts: Sequence[StoredFact]) -> None:
        """One increment per kind, not per fact: a 300,000-message append is not 300,000 label look-ups. A
        ``summary`` entry's cost comes off the savings, as it does in ``/admin/savings``."""
        for kind, count in collections.Counter(fact.kind for fact in facts).items():
            child = self._entries.get(kind)
            if child is None:
                child = self._entries[kind] = self.log_entries.labels(kind=kind)
            child.inc(count)
            if kind == "summary":
                for fact in facts:
                    if (cost := summary_cost(fact)) is not None:
                        self.tokens_saved.dec(cost.tokens)
                        self.cost_saved.dec(cost.dollars or 0.0)

    def compaction_done(self, trigger: str, result: CompactionResult, seconds: float) -> None:
        self.compactions.labels(trigger=trigger, outcome=result.outcome).inc()
        if result.outcome == "ok":
            self.compaction_seconds.observe(seconds)
            self.tokens_before.inc(result.tokens_before)
            self.tokens_after.inc(result.tokens_after)
        if result.checkpoint is not None and result.tier != "mask":  # a masking carries the previous receipt
            receipt = result.checkpoint.literal_receipt
            for outcome in ("kept", "added", "dropped"):
                if receipt.get(outcome):
                    self.literals.labels(outcome=outcome).inc(receipt[outcome])

    def usage_reported(self, prompt_tokens: int | None, cached_tokens: int | None) -> None:
        """Count one upstream reply's usage (the dialect reads the figures out of its own shape)."""
        if prompt_tokens is not None and prompt_tokens > 0:
            self.upstream_prompt_tokens.inc(prompt_tokens)
        if cached_tokens is not None and cached_tokens > 0:
            self.upstream_cached_tokens.inc(cached_tokens)

    def request_saved(self, tokens: int, dollars: float | None) -> None:
        """Count what one logged request saved (``dollars`` None: the model has no price in the bundled map)."""
        if tokens > 0:
            self.tokens_saved.inc(tokens)
        if dollars is not None and dollars > 0:
            self.cost_saved.inc(dollars)

    def prefix_seen(self, cause: str | None, cache: CacheFigures, dollars: float | None, peak_growth: int) -> None:
        """Count one request's prefix change (``cause`` None: unchanged), what it did to the cache and how much it
        raised its session's peak context; the writes the proxy caused (``dollars``) come off the savings, as in
        ``/admin/savings``."""
        if peak_growth > 0:
            self.peak_tokens.inc(peak_growth)
        if cause is not None:
            self.prefix_changes.labels(cause=cause).inc()
        if cache.written:
            self.cache_writes.inc(cache.written)
        if cache.lapsed:
            self.ttl_writes.inc(cache.lapsed)
        if cache.caused:
            self.tokens_saved.dec(cache.caused)
            self.cost_saved.dec(dollars or 0.0)

    def session_seen(self, key: SessionKey, now: float | None = None) -> None:
        new = key not in self._seen
        self._seen[key] = time.monotonic() if now is None else now
        self._seen.move_to_end(key)
        self._prune()  # amortised O(1): without a scraper the map would otherwise grow forever
        if new and self.multiprocess:
            self.sessions_active.set(self._active_count())

    def refresh(self) -> None:
        """Multiprocess mode: store the per-worker active-session count and cache sizes (the workers call it every
        few seconds, so sessions leave the gauge when they go quiet); a no-op otherwise, where the gauges are
        computed per scrape (``measure_caches``)."""
        if self.multiprocess:
            self.sessions_active.set(self._active_count())
            self.measure_caches()

    def measure_caches(self) -> None:
        """Set ``ctxproxy_cache_bytes`` from the caches themselves."""
        if self.caches is not None:
            for cache, size in self.caches().items():
                self.cache_bytes.labels(cache=cache).set(size)

    def _prune(self) -> None:
        cutoff = time.monotonic() - ACTIVE_WINDOW
        while self._seen:
            key, seen = next(iter(self._seen.items()))
            if seen >= cutoff and len(self._seen) <= MAX_TRACKED_SESSIONS:
                break
            del self._seen[key]

    def _active_count(self) -> float:
        self._prune()
        return float(len(self._seen))
