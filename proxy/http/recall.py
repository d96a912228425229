"""The recall tool (``--recall-tool``): the model reads a masked tool output back from the log.

A request whose view masks tool outputs is offered one more tool,
``ctxproxy_recall(entry)``, in its API's shape; each placeholder names its log
entry and says so. When the model's answer calls it, and only it (reasoning
before the call is fine; text or any other call is not), the proxy answers
from the log, the entry's original output, and calls the upstream again
within the same client request, at most ``MAX_ROUNDS`` times; the client sees
only the final answer. A sixth recall call, or one beside other calls or
text, goes to the client as the model wrote it.

Streams: the events of an answer are held back only while it may still be a
recall call (``Dialect.may_call_only``): the first text, or a call to another
tool, releases everything held and relays the rest as it comes, as a normal
answer; an answer that ends as a recall call was never seen by the client.
What is held is bounded by ``--max-event-bytes``; past it the answer is
relayed as it is.

What a recall reads is bound by what the request's own view hid: only a log entry of the request's own items whose
output that view masked (or clipped) is served. Any other number (an output the view shows whole, an entry of
another lineage of the session, one another credential's linked history added, a summary or checkpoint entry, a
number past the log) gets the same "holds no tool output" answer, without the log being read, so the tool neither
reads nor tells apart what the request never held.

The recall exchange is not logged: the client never sends it back, so the log
(the conversation as the client knows it) has no place for it.

Room: a recalled output gets the room left in the view, its hard limit
(``PreparedView.limit``, the window less the answer's reserve) less the view's
estimate less a margin, re-estimated after each round, since every round adds
the call and its result (the round's reported prompt tokens count when they are
more). An output larger than that is clipped, head and tail around a marker
naming its log entry, as ``proxy.context.view.clipping`` clips; when not even
``MIN_RECALL_TOKENS`` are left, the model is told the output is too large for
the room left, so a recall never sends a view over the window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson

from proxy.context.items import Item, get_path, leading_system_count
from proxy.context.view.budget import ContextBudgetPolicy, Estimate
from proxy.context.view.clipping import CLIP_MARKER, cut_text
from proxy.context.view.masking import output_text
from proxy.context.view.prepared import PreparedView
from proxy.dialects.base import Dialect
from proxy.errors import StoreError
from proxy.http.relay import RelayTiming, event_data
from proxy.http.turn import Turn
from proxy.keys import history_key, store_key
from proxy.savings import dialect_of
from proxy.sse import EventTooLarge, SSESplitter, parse_event
from proxy.store.base import as_seq

NAME = "ctxproxy_recall"
MAX_ROUNDS = 5
DESCRIPTION = ("Read back a tool output that ctxproxy elided from this conversation to save context. Each elided "
               "output is replaced by a line naming its log entry; call this tool alone with that entry number to "
               "see the output again.")
PARAMETERS: dict[str, Any] = {"type": "object", "properties": {"entry": {
    "type": "integer", "description": "The log entry named in the elided output's placeholder."}},
    "required": ["entry"]}
#: Tokens kept spare below the view's limit when a recall is sized, for the estimate's error: this share of the
#: limit, at least ``MIN_MARGIN``.
MARGIN_SHARE = 0.02
MIN_MARGIN = 256
#: A recalled output cut smaller than this says too little to be worth sending: the model is told why instead.
MIN_RECALL_TOKENS = 256


@dataclass(frozen=True)
class RecallCall:
    """An upstream answer that only calls the recall tool: its items, the calls' ids and entries, its usage."""

    items: list[Item]
    calls: list[tuple[str, Any]]
    usage: dict[str, Any] | None


def offered(turn: Turn, view: PreparedView) -> bool:
    """Whether this attempt offers the recall tool: the flag is on, the view masks outputs, rounds are left."""
    checkpoint = view.checkpoint
    return (turn.settings.recall_tool and not turn.settings.shadow and checkpoint is not None and checkpoint.masks
            and turn.recalls < MAX_ROUNDS and "previous_response_id" not in turn.parsed.payload)


def tools_field(turn: Turn) -> dict[str, Any]:
    """The request's ``tools`` with the recall tool added."""
    tools = turn.parsed.payload.get("tools")
    return {"tools": [*(tools if isinstance(tools, list) else []),
                      turn.dialect.tool_definition(NAME, DESCRIPTION, PARAMETERS)]}


def offer(turn: Turn, view: PreparedView) -> dict[str, Any]:
    """The fields this attempt's upstream body adds for the recall tool (``Turn.upstream_body``): none unless
    ``offered``."""
    return tools_field(turn) if offered(turn, view) else {}


def recall_of(dialect: Dialect, items: list[Item], usage: dict[str, Any] | None) -> RecallCall | None:
    """The answer as a recall call, or None when it says anything or calls anything else."""
    calls, says = dialect.reply_calls(items)
    if says or not calls or any(name != NAME for _, name, _ in calls):
        return None
    return RecallCall(items, [(call_id, arguments) for call_id, _, arguments in calls], usage)


def from_body(dialect: Dialect, body: bytes) -> RecallCall | None:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    items, usage, _ = dialect.reply_from_body(parsed)
    return recall_of(dialect, items, usage)


async def hold(resp: aiohttp.ClientResponse, prefix: list[bytes], timing: RelayTiming, limit: int,
               dialect: Dialect) -> tuple[list[bytes], RecallCall | None]:
    """Read on while the stream may still be only a recall call; the chunks read (to relay), or the recall call.

    ``prefix`` holds what was read already (up to the first event that commits
    the answer); it is looked at again from its start.
    """
    splitter, reader = SSESplitter(limit), dialect.reader()
    chunks: list[bytes] = []
    held = 0

    def still_possible(chunk: bytes) -> bool:
        try:
            events = splitter.feed(chunk)
        except EventTooLarge:
            return False
        for raw in events:
            event = parse_event(raw)
            if event is None or not event.data:
                continue
            data = event_data(event.data)
            reader.feed(event.event, data)
            if not dialect.may_call_only(data, NAME):
                return False
        return held <= limit

    for chunk in prefix:
        chunks.append(chunk)
        held += len(chunk)
        if not still_possible(chunk):
            return chunks, None
    timing.wait_started()
    try:
        async for chunk in resp.content.iter_any():
            chunks.append(chunk)
            held += len(chunk)
            if not still_possible(chunk):
                return chunks, None
    finally:
        timing.wait_ended()
    return chunks, recall_of(dialect, reader.items(), reader.usage) if reader.received else None


async def answer(turn: Turn, view: PreparedView, recall: RecallCall) -> PreparedView:
    """The view for the next round: this one, the recall call and its answers from the log, each answer sized to
    the room left, and the view's estimate carried forward to what it now holds."""
    turn.recalls += 1
    dialect = turn.dialect
    prompt = dialect.prompt_tokens(recall.usage) if recall.usage is not None else None
    if recall.usage is not None:
        turn.metrics.usage_reported(prompt, dialect.cached_tokens(recall.usage))
    policy = turn.engine.policy(turn.engine.window_for(turn.parsed.model))
    tool = policy.tools_tokens([dialect.tool_definition(NAME, DESCRIPTION, PARAMETERS)])  # offered, not estimated
    sent = max(view.estimate.tokens + tool, prompt if isinstance(prompt, int) else 0)  # the round just sent
    used = sent + sum(policy.message_tokens(dialect, item) for item in recall.items)
    margin = max(MIN_MARGIN, int(view.limit * MARGIN_SHARE))
    messages = [*view.messages, *recall.items]
    allowed = recallable(turn, view)
    for call_id, arguments in recall.calls:
        framing = policy.message_tokens(dialect, dialect.tool_result(call_id, ""))
        result = dialect.tool_result(call_id, await recalled(turn, arguments, view.limit - used - margin - framing,
                                                             policy, allowed))
        messages.append(result)
        used += policy.message_tokens(dialect, result)
    # A running figure: the sources the view's estimate was taken from describe the view before the recall.
    return replace(view, messages=messages, changed=True, estimate=Estimate(used - tool, None, None, None))


def recallable(turn: Turn, view: PreparedView) -> frozenset[int]:
    """The log entries of the request's own items whose output ``view`` hid: masked by its checkpoint, or clipped.

    Worked out again from what the view was built from (the masker's cache makes it a lookup per masked item):
    the request's items, their entries on the log's tree (``ConversationState.entries_for``, the request's own
    path, whichever lineage the log followed last) and the view's checkpoint.
    """
    state = turn.request.app[history_key].cached(turn.key) or turn.state
    checkpoint = view.checkpoint
    if state is None or checkpoint is None:
        return frozenset()
    dialect, items = turn.dialect, turn.parsed.items
    seqs, keys = state.entries_for(turn.hashes, len(items))
    hidden: set[int] = set()
    if checkpoint.masks:
        start = max(checkpoint.retain_start_idx, leading_system_count(dialect, items))
        for index in range(start, min(checkpoint.masked_until, len(seqs))):
            if turn.engine.masker.item(dialect, items, index, seqs, keys) is not items[index]:
                hidden.add(seqs[index])
    if view.clipped:  # positions in the view as built before clipping: map them back to the request's items
        whole = turn.engine.projection(dialect).build(items, checkpoint, seqs=seqs, keys=keys)
        positions = {id(item): index for index, item in enumerate(items)}
        for at in view.clipped:
            shown = positions.get(id(whole[at])) if at < len(whole) else None
            if shown is not None and shown < len(seqs):
                hidden.add(seqs[shown])
    return frozenset(hidden)


async def recalled(turn: Turn, arguments: Any, room: int, policy: ContextBudgetPolicy,
                   allowed: frozenset[int]) -> str:
    """The output logged at the entry ``arguments`` name, clipped to ``room`` tokens (marker included); or why not.

    Only an entry of ``allowed`` (``recallable``) is read."""
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) else arguments
        entry = parsed["entry"] if isinstance(parsed, dict) else None
    except (orjson.JSONDecodeError, KeyError):
        entry = None
    if type(entry) is not int or entry < 0:
        return f"{NAME} needs an integer 'entry', the log entry a placeholder names."
    if as_seq(entry) is None or entry not in allowed:  # past what a log holds, or not hidden from this request
        return f"Log entry {entry} holds no tool output of this conversation."
    try:
        facts = await turn.request.app[store_key].read(turn.key, after=entry - 1, limit=1)
    except StoreError:
        return f"The log could not be read just now; entry {entry} is still there. Re-run the tool instead."
    fact = facts[0] if facts and facts[0].seq == entry else None
    if fact is None or fact.kind != "message" or fact.message is None:
        return f"Log entry {entry} holds no tool output of this conversation."
    dialect = dialect_of(fact)
    texts = [output_text(get_path(fact.message, path))[0] for path in dialect.result_paths(dict(fact.message))]
    if not texts:
        return f"Log entry {entry} holds no tool output of this conversation."
    text = "\n\n".join(texts)
    tokens = policy.text_tokens(text)
    if tokens <= room:
        return text
    where = f"log entry {entry}"
    cap = room - policy.text_tokens(CLIP_MARKER.format(count=len(text), where=where)) - 2  # the marker's lines
    if cap < MIN_RECALL_TOKENS:
        return (f"The output is in the log at entry {entry}, but it is too large for the room left in this context "
                "window; answer with what you have, or ask the user.")
    return cut_text(text, tokens, cap, policy, where)
