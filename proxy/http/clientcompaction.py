"""The client's own compaction, answered from the session's checkpoint instead of another summary call upstream.

``proxy.clientcompact`` knows the shapes (what a compaction request looks like in each client, what each
expects back); this module is the wiring:

- ``answer``: a recognised request (Claude Code's summary prompt, Codex's local compaction prompt, its
  ``compaction_trigger`` turn, ``POST /v1/responses/compact``) is answered from the checkpoint that covers the
  conversation, made now only when none is ready (or when the user's own instructions, ``/compact <text>``,
  ask for a rolling update, or when the checkpoint only masks). The client is about to throw its whole history
  away, so the answer is the checkpoint's summary item (with the user's words and the artifact trail) followed
  by the newest items it keeps verbatim, as a transcript, within a quarter of the window. It is logged as a
  ``summary`` entry; Codex's ``compaction`` item carries a reference that holds that entry's message, encrypted
  (``proxy.secret``).
- ``expand``: a ``compaction`` item that comes back in a later request becomes, before anything else sees
  it, the user message the reference carries (or, for an old or oversized one, the entry it names): no
  upstream but OpenAI's could read its ``encrypted_content``. It needs neither the request's tenant nor the
  store, so it survives an OAuth refresh, a restart and a lost store. A forged, altered or unknown reference
  gets a 400.

What an answer holds is bound by what the request's own history proves: only a checkpoint whose whole covered
prefix the request holds (its prefix hash is the request's own) answers, never the session's newest one, which may
cover messages of another lineage or another credential's that the request never showed. So Gemini CLI's
``/compress``, which asks about the older part of its history only, gets a checkpoint made for that part or a
summary made now of its own items. An empty history is a prefix of every conversation and proves nothing: it is
not answered here at all, but goes upstream as the client sent it (the model summarises nothing, as without a
proxy), with no summary, user words or trail of the session.

When no summary can be had, the model-free tier's checkpoint answers (``proxy.context.summary.fallback``). Only when no
checkpoint can be had at all (a conversation too short to summarise) does ``answer`` return None and the request
go upstream as the client sent it: the model writes the summary, as without a proxy.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from proxy.clientcompact import CompactionRequest, Envelope, compaction_references, render
from proxy.constants import HEADER_COMPACTED, HEADER_SESSION, HEADER_VIEW_TOKENS
from proxy.context.checkpoint import Checkpoint
from proxy.context.engine import active_checkpoint
from proxy.context.items import Item
from proxy.context.summary.summarizer import serialise_message
from proxy.context.view.projection import summary_text
from proxy.errors import BadRequest, StoreError
from proxy.http.turn import Turn
from proxy.keys import history_key, secret_key, store_key
from proxy.secret import Reference, is_reference, seal, unseal
from proxy.store.base import NewFact, SessionKey, Tenant


class TenantsOfTheId(Protocol):
    """The other tenants holding the request's session id, read when first needed
    (``proxy.http.continuity.Candidates``)."""

    async def get(self) -> list[Tenant]: ...

#: Characters of one retained item in the answer's transcript, head and tail kept.
TRANSCRIPT_CLIP_CHARS = 2_000
RECENT_HEADING = "## Recent messages, verbatim (oldest first)"
#: Share of the window the answer may take: the client carries it in every later request.
ANSWER_SHARE = 0.25


async def answer(turn: Turn, request: CompactionRequest) -> web.Response | None:
    """The answer to the client's compaction request, or None to let the upstream write it.

    Claude Code's "recent" scope keeps the early messages verbatim and wants only the later part summarised:
    not what a checkpoint holds, so the model writes that one.
    """
    if request.scope == "recent":
        return None
    dialect = turn.dialect
    items = request.conversation(turn.parsed.items)
    if not items:
        return None  # an empty history proves nothing: the upstream answers it, as without a proxy
    same = request.index if request.index is not None else len(items)  # items before it are the request's own
    hashes = [*turn.hashes[:same], *map(dialect.hash, items[same:])]
    # Only a checkpoint whose whole covered prefix the request holds (its prefix hash proves it) answers; the
    # session's newer checkpoints, of this lineage or another, cover what the request never showed.
    checkpoint = active_checkpoint(turn.state, hashes, turn.requester)
    # A client asking about the older part of the conversation its log holds: nothing to log (logging it would
    # rewind the log to that part). Held anywhere in the log's tree, not only on the head's lineage, which a side
    # call (a title call, Gemini CLI's next-speaker check) may have left on a branch of its own.
    logged = request.prefix_only and turn.state is not None and turn.state.locate(hashes)[0] == len(hashes)
    model = turn.parsed.model or ""
    window = turn.engine.window_for(model)
    if checkpoint is None or not checkpoint.summary.strip() or request.instructions:
        # No summary ready (none at all, or a checkpoint that only masks): one is made now, as the client would
        # have waited for its own; when none can be had, the model-free tier's answer stands in.
        result, state = await turn.engine.compact(
            turn.key, items, hashes, trigger="client", dialect=dialect, model=model, complete=turn.summarise,
            window=window, instructions=request.instructions, over_limit=True, fallback=True,
            requester=turn.requester)
        made = result.outcome in ("ok", "fallback", "skipped")
        checkpoint = active_checkpoint(state, hashes, turn.requester) if made else None
        if checkpoint is None or not checkpoint.summarises:
            return None
    text = summary_with_tail(turn, items, checkpoint, int(window * ANSWER_SHARE))
    history = turn.request.app[history_key]
    try:
        # The conversation the answer covers is logged first (usually a no-op), then the answer after it.
        if not logged:
            await history.sync(turn.key, items, hashes, extra_client={"dialect": dialect.name})
        message = dialect.with_summary(None, text)
        seq = await history.append_proxy_fact(turn.key, NewFact(
            kind="summary", index=len(items), source="proxy", message=message,
            extra={"dialect": dialect.name, "client_compaction": request.kind}))
        reference = None
        if request.kind in ("codex_trigger", "codex_endpoint"):
            secret = await turn.request.app[secret_key].get()
            reference = seal(secret, Reference(turn.key.tenant, turn.key.session, seq, checkpoint.prefix_hash,
                                               message))
    except StoreError:
        turn.metrics.store_errors.inc()
        return None  # nothing to name the answer by: the upstream answers instead
    counter = turn.engine.counter
    envelope = Envelope.new(turn.parsed.model or "", input_tokens=sum(counter.message_tokens(dialect, i, h)
                                                                      for i, h in zip(items, hashes, strict=True)),
                            output_tokens=counter.text_tokens(text))
    rendered = render(request, envelope, stream=turn.parsed.stream, summary=text, reference=reference)
    turn.status = 200
    headers = {HEADER_SESSION: turn.key.session, HEADER_COMPACTED: "none", HEADER_VIEW_TOKENS: "0"}
    return web.Response(body=rendered.body, content_type=rendered.content_type.split(";")[0], headers=headers)


def summary_with_tail(turn: Turn, items: list[Item], checkpoint: Checkpoint, budget: int) -> str:
    """The checkpoint's summary item (the summary, what the model-free tier elided, the user's words, the artifact
    trail), then as many of the newest items it keeps verbatim as fit ``budget`` tokens, as a transcript.

    The client carries the answer in every later request, so it is bounded:
    never a transcript of the whole history, which a checkpoint that only
    masks would otherwise make it.
    """
    summary = summary_text(checkpoint)
    count = turn.engine.counter.text_tokens
    room = budget - count(summary) - count(RECENT_HEADING)
    start = checkpoint.retain_start_idx
    opener = checkpoint.round_start_idx
    kept = ([opener] if opener is not None and opener < start else []) + list(range(start, len(items)))
    recent: list[str] = []
    for index in reversed(kept):
        text = serialise_message(turn.dialect, items[index], index, TRANSCRIPT_CLIP_CHARS)
        room -= count(text) + 1
        if room < 0:
            break
        recent.append(text)
    if not recent:
        return summary
    return f"{summary}\n\n{RECENT_HEADING}\n\n" + "\n\n".join(reversed(recent))


async def expand(request: web.Request, key: SessionKey, items: list[Item],
                 candidates: TenantsOfTheId | None) -> tuple[list[Item], list[tuple[int, Reference]]]:
    """``items`` with every ``compaction`` item carrying one of our references replaced by what it stands for,
    and the references read with the index of their item (each proves the session it names as far as that item,
    and no further: ``proxy.http.continuity``).

    An old (v1) reference checks out only under the tenant it was made for: ``key``'s, else one of
    ``candidates`` (the other tenants of the session id, when ``key`` is the request's own).
    """
    found = [(i, token) for i, token in compaction_references(items) if is_reference(token) or not token]
    if not found:
        return items, []
    app = request.app
    secret = await app[secret_key].get()
    expanded: list[Item] = list(items)
    references: list[tuple[int, Reference]] = []
    for index, token in found:
        reference = unseal(secret, token, [key.tenant])
        if reference is None and candidates is not None and token.startswith("ctxproxy.v1."):
            reference = unseal(secret, token, [tenant.name for tenant in await candidates.get()])
        message = None if reference is None else reference.message
        if reference is not None and message is None:
            facts = await app[store_key].read(SessionKey(reference.tenant, reference.session),
                                              after=reference.seq - 1, limit=1)
            if facts and facts[0].kind == "summary":
                message = facts[0].message
        if reference is None or message is None:
            raise BadRequest(f"input[{index}] is a compaction item this proxy did not make.", param=f"input[{index}]",
                             code="invalid_compaction_reference")
        expanded[index] = dict(message)
        references.append((index, reference))
    return expanded, references
