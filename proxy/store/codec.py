"""The one on-disk form of a fact, shared by every backend.

A fact is stored as canonical JSON: ``orjson`` with sorted keys, so the same
fact always yields the same bytes (stable hashes, diffable dumps, and a log that
any language can read). The object carries its format version under ``"v"`` so
a future layout can be read beside this one; a reader meeting a version it does
not know refuses rather than guessing. Kind-specific fields (``NewFact.extra``)
live under ``"x"`` so they can never shadow a core field. Never pickle: the log
outlives the code that wrote it.

The backend's own identifier (SQLite row seq, Redis stream id) is not part of
the body; it is supplied again on decode. A fact's ``key`` (idempotence, see
``fact_key``) is written only when set, so facts without one keep the bytes they
always had. A fact's ``digest`` is the SHA-1 of its bytes: SHA-1 because Redis's
Lua computes the same (``redis.sha1hex``) inside the append script; it names an
entry, it does not secure anything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

import orjson

from proxy.constants import FACT_FORMAT
from proxy.errors import StoreError, UnencodableFact
from proxy.store.base import Kind, NewFact, Source, StoredFact

_KINDS = frozenset({"message", "rewind", "summary", "checkpoint", "retire"})
_SOURCES = frozenset({"client", "upstream", "proxy"})


def _default(obj: object) -> object:
    # orjson serializes only real dicts; facts may carry read-only mappings.
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"cannot store {type(obj).__name__} in a fact")


def encode(fact: NewFact, seq: int, ts: float) -> bytes:
    """Canonical JSON bytes of ``fact`` appended as ``seq`` at ``ts``; ``UnencodableFact`` if it cannot be written.

    orjson reads 1024 levels of nesting but writes only 254, and an upstream's
    reply is not checked the way a client's request is, so a message can reach
    this point unwritable.
    """
    body = {
        "v": FACT_FORMAT,
        "seq": seq,
        "kind": fact.kind,
        "index": fact.index,
        "source": fact.source,
        "message": fact.message,
        "ts": ts,
        "hash": fact.hash,
        "x": fact.extra,
    }
    if fact.key is not None:
        body["key"] = fact.key
    try:
        return orjson.dumps(body, default=_default, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:
        raise UnencodableFact(f"{fact.kind} fact cannot be encoded: {exc}") from None


def check_encodable(message: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
    """Raise ``UnencodableFact`` unless a fact holding ``message`` and ``extra`` could be encoded.

    For a reply, before anything keeps it to retry later: a reply that cannot
    be written now never can be.
    """
    try:
        orjson.dumps({"message": message, "x": extra}, default=_default)  # as deep as ``encode`` places them
    except orjson.JSONEncodeError as exc:
        raise UnencodableFact(f"message cannot be encoded: {exc}") from None


def digest(raw: bytes | str) -> str:
    """The SHA-1 (hex) of a fact's stored bytes: ``StoredFact.digest``, and what Redis's append script compares."""
    return hashlib.sha1(raw.encode() if isinstance(raw, str) else raw).hexdigest()


def fact_key(fact: NewFact, after: int) -> str:
    """A key naming ``fact`` planned to follow seq ``after - 1``: a hash of its content and that position.

    The same fact planned at the same point of the log gets the same key, so
    planning it again after a retry (the first append landed, its reply was
    lost) finds it logged; a fact with the same content planned elsewhere in the
    log is another fact.
    """
    return hashlib.sha256(encode(replace(fact, key=None), after, 0.0)).hexdigest()[:32]


def decode(fact_id: str, raw: bytes | str) -> StoredFact:
    """Rebuild a ``StoredFact`` from stored bytes; ``StoreError`` if they are not a fact this code can read."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise StoreError(f"fact {fact_id} is not valid JSON") from exc
    if not isinstance(body, dict) or body.get("v") != FACT_FORMAT:
        version = body.get("v") if isinstance(body, dict) else None
        raise StoreError(f"fact {fact_id} has unknown format {version!r} (this build reads {FACT_FORMAT})")
    try:
        if body["kind"] not in _KINDS or body["source"] not in _SOURCES:
            raise ValueError(f"kind {body['kind']!r} / source {body['source']!r}")
        return StoredFact(
            id=fact_id,
            seq=int(body["seq"]),
            kind=cast(Kind, body["kind"]),
            index=body["index"],
            source=cast(Source, body["source"]),
            message=body["message"],
            ts=float(body["ts"]),
            hash=body.get("hash"),
            extra=body.get("x") or {},
            key=body.get("key"),
            digest=digest(raw),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"fact {fact_id} is malformed: {exc}") from exc


#: Kinds whose facts ``written`` builds from the fact itself: what they carry is plain JSON already (a message as
#: the client or the upstream sent it), so the stored fact is the same either way. The proxy's own facts
#: (summaries, checkpoints) are read back from their bytes, as a reader of the log will see them.
_PLAIN_KINDS = frozenset({"message", "rewind"})


def written(fact: NewFact, fact_id: str, seq: int, ts: float, raw: bytes) -> StoredFact:
    """The ``StoredFact`` of ``fact``, just appended as ``raw`` (its ``encode``), without parsing ``raw`` back."""
    if fact.kind not in _PLAIN_KINDS:
        return decode(fact_id, raw)
    return StoredFact(id=fact_id, seq=seq, kind=fact.kind, index=fact.index, source=fact.source,
                      message=fact.message, ts=ts, hash=fact.hash, extra=fact.extra, key=fact.key,
                      digest=digest(raw))


def counts(facts: Sequence[NewFact]) -> tuple[int, int]:
    """How many of ``facts`` are messages and checkpoints: the per-session tallies both backends keep."""
    messages = sum(1 for f in facts if f.kind == "message")
    checkpoints = sum(1 for f in facts if f.kind == "checkpoint")
    return messages, checkpoints
