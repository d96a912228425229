"""What the model sees: the seed's ProjectionBuilder / build_model_view.

The view is rebuilt from the conversation and the active checkpoint on every
call and never written back, so a checkpoint can be replaced and nothing is
lost. It is read-only towards its inputs: messages that pass through unchanged
are the caller's own objects (no copies on the hot path); a message that must
change (the one carrying the summary) is a new dict.

With a checkpoint the view is: leading system/developer messages, the summary,
the opening user message of the current round when the checkpoint split that
round, then ``messages[retain_start_idx:]``. The compactor only splits before a
user message or before an assistant message (never between a tool call and its
results), which is what keeps the view well-formed.

Where the summary goes must also suit strict chat templates (Mistral, Gemma,
Llama-2 style on vLLM answer 400 otherwise): no two user messages in a row and
no system message after the first other one. So with placement ``user`` the
summary leads the first retained user message (the round's opener, re-inserted,
or the message at ``retain_start_idx``); only when the tail starts with an
assistant message is it a user message of its own, which then alternates. With
``system`` it is appended to the last leading system message. Either way the
text is a function of the checkpoint and the conversation's own messages, so it
stays byte-identical from one step to the next until the next compaction, and
the upstream's prompt cache keeps hitting.

Tool outputs in ``messages[retain_start_idx:masked_until]`` are masked
(``proxy.context.view.masking``): their placeholders are a function of the log, so
the masked region is byte-identical from step to step too. A checkpoint that
only masks (no summary, no user words carried) adds no summary item. The
summary item ends with the user's own words, carried verbatim by the proxy
(``proxy.context.keep.userwords``). Other tool results are passed through whole;
when a view cannot fit the window they are clipped by ``proxy.context.view.clipping``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from proxy.context.checkpoint import Checkpoint
from proxy.context.items import ItemModel, leading_system_count
from proxy.context.keep.pins import render as render_pins
from proxy.context.keep.userwords import render as render_user_words
from proxy.context.view.masking import Masker
from proxy.context.view.tokens import TokenCounter
from proxy.types import Message

SummaryPlacement = Literal["user", "system"]
#: Ends the summary where it leads a user message, so the model sees where the user's own words start.
SUMMARY_END = "\n\n[ctxproxy] End of the summary. The user's message:\n\n"
SUMMARY_HEADER = (
    "[ctxproxy] Summary of earlier work in this conversation. The messages it replaces were compacted "
    "to keep the conversation within the context window; the conversation continues after this summary."
)


@dataclass(frozen=True)
class FrozenEnds:
    """Where a view's frozen prefix ends, as positions in the view: the item holding the summary (``summary``; it
    leads a user item, or ends the system item with placement ``system``) and the last item of the masked region
    (``masked``); None where the view has none. Everything up to either is byte-identical from request to request
    until the next reduction, so that is where a provider's explicit cache breakpoint pays
    (``Dialect.cache_hints``)."""

    summary: int | None = None
    masked: int | None = None


#: A view the client's conversation as sent, or one with neither a summary nor masked outputs.
NOTHING_FROZEN = FrozenEnds()


def summary_text(checkpoint: Checkpoint) -> str:
    """The summary item's text: the header, the model's summary, the marker of what the model-free tier elided,
    the pins, the user's words, the artifact trail, the literals the rest lacked, then the files in hand ("" when it
    has none of them). All but the model's summary are the proxy's own, stated exactly from the log."""
    parts = [part for part in (checkpoint.summary.strip(), checkpoint.elision, render_pins(checkpoint.pins),
                               render_user_words(checkpoint.user_words), checkpoint.trail, checkpoint.literals_text,
                               checkpoint.files) if part]
    return "\n\n".join([SUMMARY_HEADER, *parts]) if parts else ""


class ProjectionBuilder:
    """Builds model views for one API (``dialect``) with one placement of the summary.

    ``masker`` builds (and caches) masked items; without one, a fresh one with
    its own small cache serves this builder.
    """

    def __init__(self, dialect: ItemModel, *, summary_placement: SummaryPlacement = "user",
                 masker: Masker | None = None) -> None:
        if summary_placement not in ("user", "system"):
            raise ValueError(f"summary_placement must be 'user' or 'system', got {summary_placement!r}")
        self.dialect = dialect
        self.summary_placement = summary_placement
        self.masker = masker if masker is not None else Masker(TokenCounter(maxsize=1_000), maxsize=1_000)

    def build(self, messages: Sequence[Message], checkpoint: Checkpoint | None, *, seqs: Sequence[int] = (),
              keys: Sequence[str] = ()) -> list[Message]:
        """The view; ``seqs`` and ``keys`` (the log's seqs and prefix hashes of the logged prefix) name and key the
        masked outputs, and matter only to a checkpoint that masks."""
        return self.layout(messages, checkpoint, seqs=seqs, keys=keys)[0]

    def layout(self, messages: Sequence[Message], checkpoint: Checkpoint | None, *, seqs: Sequence[int] = (),
               keys: Sequence[str] = ()) -> tuple[list[Message], FrozenEnds]:
        """The view (``build``) and where its frozen prefix ends in it."""
        if checkpoint is None:
            return list(messages), NOTHING_FROZEN
        model = self.dialect
        system_end = leading_system_count(model, messages)
        text = summary_text(checkpoint)
        round_start = checkpoint.round_start_idx
        body: list[Message] = []
        if round_start is not None and system_end <= round_start < checkpoint.retain_start_idx:
            body.append(messages[round_start])
        start = max(checkpoint.retain_start_idx, system_end)
        masked: int | None = None  # the last masked item's place in ``body``
        if checkpoint.masked_until > start:
            body.extend(self.masker.region(model, messages, start, checkpoint.masked_until, seqs, keys,
                                           checkpoint.prefix_hash))
            masked, start = len(body) - 1, checkpoint.masked_until
        body.extend(messages[start:])
        head = list(messages[:system_end])
        if not text:
            return [*head, *body], FrozenEnds(masked=_shifted(masked, len(head)))
        if self.summary_placement == "system":
            merged = model.system_with_summary(head[-1] if head else None, text)
            if merged is not None:
                at = max(len(head) - 1, 0)
                return [*head[:-1], merged, *body], FrozenEnds(at, _shifted(masked, at + 1))
        if body and model.role(body[0]) == "user":
            body[0] = model.with_summary(body[0], text + SUMMARY_END)
        else:
            body.insert(0, model.with_summary(None, text))
            masked = _shifted(masked, 1)
        return [*head, *body], FrozenEnds(len(head), _shifted(masked, len(head)))


def _shifted(index: int | None, by: int) -> int | None:
    return None if index is None else index + by


def build_model_view(
    dialect: ItemModel,
    messages: Sequence[Message],
    checkpoint: Checkpoint | None,
    *,
    summary_placement: SummaryPlacement = "user",
) -> list[Message]:
    """The messages to send upstream for ``messages`` under ``checkpoint`` (see the module docstring)."""
    return ProjectionBuilder(dialect, summary_placement=summary_placement).build(messages, checkpoint)
