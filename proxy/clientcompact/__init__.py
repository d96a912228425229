"""The client's own compaction, answered by the proxy: recognise it, answer it, and know its traces later.

Claude Code and Codex compact by themselves when their context fills up: they ask the model for a summary
of a conversation the proxy has usually summarised already. The proxy answers such a request from its
checkpoint instead of paying for (and waiting on) another summary call upstream.

- ``recognise``: is this request a client compaction, of which kind, with which user instructions;
- ``answers``: the answer in each client's shape, streamed or not;
- ``boundaries``: the client's summary message at the head of its later requests, and Codex's ``compaction``
  items carried back (their references are signed and checked by ``proxy.secret``);
- ``texts``: the clients' exact texts, with where each was read.

No I/O here: every function takes the request's JSON (plain dicts) and returns data or bytes.
"""

from __future__ import annotations

from proxy.clientcompact.answers import Answer, Envelope, render
from proxy.clientcompact.boundaries import (
    SummaryBoundary,
    compaction_reference,
    compaction_references,
    find_boundary,
)
from proxy.clientcompact.recognise import CODEX_ENDPOINT, CompactionRequest, recognise

__all__ = [
    "CODEX_ENDPOINT",
    "Answer",
    "CompactionRequest",
    "Envelope",
    "SummaryBoundary",
    "compaction_reference",
    "compaction_references",
    "find_boundary",
    "recognise",
    "render",
]
