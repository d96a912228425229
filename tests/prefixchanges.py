"""The prompt-prefix changes the proxy made in a real agent's run, counted twice: from what the upstream received
(the witness), and as the proxy says (``ctxproxy_prefix_changes_total``, proxy/prefixes.py).

A request changes the prefix when its prompt does not begin with the whole previous prompt: the head (tools,
system prompt) differs, or its items do not start with the previous request's items. Such a change is the proxy's
doing only when the client's own request extends its previous one: a change the client made itself (it edited or
rewound its history) is not counted, whatever the proxy did with it. Cache breakpoints are not content (the
cache holds what they mark), so ``cache_control`` is set aside before comparing.

A change the proxy makes is due when the view stands on a checkpoint it just made (a masking batch, a summary):
``unplanned`` finds the others in the session's log, a view clipped to fit or rebuilt otherwise on the same
checkpoint as the request before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from proxy.store.base import StoredFact
from tests.agents import without_cache_control
from tests.fakescript import Recorded
from tests.tap import Exchange

#: The causes that are the proxy's doing (proxy.prefixes.PROXY_CAUSES).
PROXY_CAUSES = ("compaction", "masking")


@dataclass(frozen=True)
class Door:
    """Where a request body of one API keeps its items and its head, and how an item reads as the model reads it."""

    items: str
    head: tuple[str, ...]
    meaning: Callable[[Any], Any] = lambda item: item

    def prompt(self, body: dict[str, Any]) -> tuple[Any, list[Any]]:
        return (self.meaning([body.get(k) for k in self.head]),
                [self.meaning(item) for item in body.get(self.items) or []])


RESPONSES = Door("input", ("instructions", "tools"))
MESSAGES = Door("messages", ("system", "tools"), without_cache_control)
GEMINI = Door("contents", ("systemInstruction", "tools"))
CHAT = Door("messages", ("tools",))


def extends(previous: tuple[Any, list[Any]], current: tuple[Any, list[Any]]) -> bool:
    """``current`` begins with the whole of ``previous``: a prefix cache holds all of it."""
    (head, items), (new_head, new_items) = previous, current
    return head == new_head and new_items[:len(items)] == items


def proxy_made(upstream: Sequence[dict[str, Any]], sent: Sequence[dict[str, Any]], door: Door) -> list[int]:
    """The requests (indices, one upstream body per client body) whose upstream prompt changed the prefix while
    the client's own request extended its previous one."""
    assert len(upstream) == len(sent), "one upstream turn per client request"
    ups, clients = [door.prompt(b) for b in upstream], [door.prompt(b) for b in sent]
    return [i for i in range(1, len(ups))
            if not extends(ups[i - 1], ups[i]) and extends(clients[i - 1], clients[i])]


def agent_turns(turns: Sequence[Recorded], sent: Sequence[Exchange]) -> tuple[list[Any], list[Any]]:
    """The bodies of the agent's own loop, upstream and as sent: requests offering tools (opencode's title call
    offers none, and is another conversation)."""
    return ([t.body for t in turns if t.status == 200 and t.body.get("tools")],
            [b for b in (x.json() for x in sent) if b.get("tools")])


def reported(metrics: str) -> dict[str, int]:
    """``ctxproxy_prefix_changes_total`` by cause, from a ``/metrics`` page."""
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name == "ctxproxy_prefix_changes":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["cause"]] = int(sample.value)
    return counts


def replies(facts: Sequence[StoredFact]) -> list[dict[str, Any]]:
    """The ``extra`` of each upstream reply in a session's log, one per request (a reply of several items logs the
    same ``extra`` on each)."""
    found: list[dict[str, Any]] = []
    last: tuple[int, bytes] | None = None
    for fact in facts:
        if fact.kind != "message" or fact.source != "upstream" or "prefix" not in fact.extra:
            continue
        figures = orjson.dumps([fact.extra.get(k) for k in ("prefix", "view", "tokens", "usage")])
        if last != (fact.seq - 1, figures):
            found.append(fact.extra)
        last = (fact.seq, figures)
    return found


def unplanned(facts: Sequence[StoredFact]) -> list[int]:
    """The requests (indices into ``replies``) whose prefix the proxy changed without a new checkpoint: the view
    was clipped, or stood on the same checkpoint as the request before."""
    extras = replies(facts)
    return [i for i in range(1, len(extras))
            if extras[i]["prefix"].get("changed") and extras[i]["prefix"].get("cause") in PROXY_CAUSES
            and (extras[i]["view"].get("clipped") or extras[i]["view"].get("key") == extras[i - 1]["view"].get("key"))]
