"""Prometheus metrics, on a registry per app so tests and several apps in one process never collide.

Names and labels are the contract's. Buckets fit what they time: the proxy's own
overhead lives between 0.1 ms and 100 ms, a compaction (an LLM call) between
0.1 s and 5 minutes.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.process_collector import ProcessCollector

from proxy.context.compactor import CompactionResult
from proxy.store.base import SessionKey, StoredFact

OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
UPSTREAM_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
COMPACTION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ACTIVE_WINDOW = 15 * 60.0


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        ProcessCollector(registry=self.registry)
        r = self.registry
        self.requests = Counter("ctxproxy_requests", "Requests served, by route and status.", ["route", "status"],
                                registry=r)
        self.compactions = Counter("ctxproxy_compactions", "Compactions attempted.", ["trigger", "outcome"],
                                   registry=r)
        self.compaction_seconds = Histogram("ctxproxy_compaction_seconds", "Time a compaction took.",
                                            buckets=COMPACTION_BUCKETS, registry=r)
        self.tokens_before = Counter("ctxproxy_tokens_before_compaction", "View tokens before compactions.",
                                     registry=r)
        self.tokens_after = Counter("ctxproxy_tokens_after_compaction", "View tokens after compactions.", registry=r)
        self.reactive_retries = Counter("ctxproxy_reactive_retries", "Retries after a prompt-too-long answer.",
                                        ["outcome"], registry=r)
        self.log_entries = Counter("ctxproxy_log_entries", "Facts appended to the log.", ["kind"], registry=r)
        self.store_errors = Counter("ctxproxy_store_errors", "Store operations that failed.", registry=r)
        self.upstream_seconds = Histogram("ctxproxy_upstream_seconds", "Time waiting for the upstream.",
                                          buckets=UPSTREAM_BUCKETS, registry=r)
        self.overhead_seconds = Histogram("ctxproxy_overhead_seconds", "Time spent in the proxy, upstream excluded.",
                                          buckets=OVERHEAD_BUCKETS, registry=r)
        self.sessions_active = Gauge("ctxproxy_sessions_active", "Sessions seen in the last 15 minutes.", registry=r)
        self.sessions_active.set_function(self._active_count)
        self._seen: OrderedDict[SessionKey, float] = OrderedDict()

    def facts_appended(self, facts: Sequence[StoredFact]) -> None:
        for fact in facts:
            self.log_entries.labels(kind=fact.kind).inc()

    def compaction_done(self, trigger: str, result: CompactionResult, seconds: float) -> None:
        self.compactions.labels(trigger=trigger, outcome=result.outcome).inc()
        if result.outcome == "ok":
            self.compaction_seconds.observe(seconds)
            self.tokens_before.inc(result.tokens_before)
            self.tokens_after.inc(result.tokens_after)

    def session_seen(self, key: SessionKey, now: float | None = None) -> None:
        self._seen[key] = time.monotonic() if now is None else now
        self._seen.move_to_end(key)

    def _active_count(self) -> float:
        cutoff = time.monotonic() - ACTIVE_WINDOW
        while self._seen:
            key, seen = next(iter(self._seen.items()))
            if seen >= cutoff:
                break
            del self._seen[key]
        return float(len(self._seen))
