"""The engine's whole knowledge of a wire format: a few questions about one item.

An *item* is one entry of a conversation exactly as its API sent it: a Chat
Completions message, a Responses API input item, an Anthropic message. The
engine (history, budget, compactor, summariser, projection) never looks inside
one; it asks the conversation's ``ItemModel``:

- ``role``: ``system`` (stays at the head, never summarised), ``user`` (opens a
  turn: a round boundary), ``assistant``, ``tool`` (a result), ``other``;
- ``calls`` / ``results``: the ids that pair a call with its result
  (``tool_call_id``, ``call_id``, ``tool_use_id``);
- ``travels_with_next``: the item must never be separated from the one after it
  (a Responses ``reasoning`` item);
- ``identity``: the part that survives a client's echo, for the item's hash;
- ``text``: what the model reads, for token counts and the summariser;
- ``with_summary``: how the summary enters the view (folded into a user item);
- ``result_paths`` / ``with_output`` / ``call_of``: where an item holds tool output, how a placeholder takes its
  place (ids and pairing kept), and the name and arguments of the call it answers (masking, clipping);
- ``answers``: each result an item holds, in order: the call it answers and where its text is (none, one or
  several paths, read in order), so that ids and outputs pair exactly even where a result states no text;
- ``result_failed``: whether the API marks an output as a failed call (Anthropic's ``is_error``, Gemini's
  ``error`` field), the one flag the trail, the files in hand and the literals read beside the output's words;
- ``user_text``: the user's own words in an item, carried verbatim past a summary.

Everything else stays in the item's native JSON, untouched: encrypted
reasoning and thinking signatures survive because nothing here rebuilds an
item it does not have to. The implementations live in ``proxy.dialects``.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from proxy.types import Message

Item = Message
Role = Literal["system", "user", "assistant", "tool", "other"]
#: Where an item holds tool output (``ItemModel.result_paths``): keys and list positions from the item down.
Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Answer:
    """One result an item holds (``ItemModel.answers``): the key of the call it answers (as ``results`` gives it)
    and where its text is, in the order the engine reads it (empty: the result states no text)."""

    call_id: str
    paths: tuple[Path, ...]


def get_path(item: Any, path: Path) -> Any:
    for step in path:
        item = item[step]
    return item


def set_path(item: Any, path: Path, value: Any) -> Any:
    """A copy of ``item`` with ``value`` at ``path``; everything off the path is shared, not copied."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(item, list):
        copy = list(item)
        copy[int(head)] = set_path(item[int(head)], rest, value)
        return copy
    return {**item, head: set_path(item[head], rest, value)}


class ItemModel(abc.ABC):
    """One API's answers to the engine's questions about an item. Stateless; one instance per API."""

    #: The dialect's name as the log records it: ``chat``, ``responses``, ``messages``.
    name: str

    @abc.abstractmethod
    def role(self, item: Item) -> Role:
        """The item's part in a turn."""

    def calls(self, item: Item) -> tuple[str, ...]:
        """Ids of the tool calls this item makes."""
        return ()

    def results(self, item: Item) -> tuple[str, ...]:
        """Ids of the tool calls this item answers."""
        return ()

    def answers(self, item: Item) -> tuple[Answer, ...]:
        """Each result the item holds, in the order of ``results``: the call it answers and where its text is.
        Readers pair ids and outputs through this, never by zipping ``results`` with ``result_paths``: a result
        with no text (a Gemini ``functionResponse`` whose ``response`` is ``{}``) would shift every pair after it.
        This default serves APIs whose item answers one call (Chat, Responses): all its output is that call's. An
        API that answers several calls in one item says which output is whose (Messages, Gemini); here they get
        none, as none can be told apart."""
        ids = self.results(item)
        paths = tuple(self.result_paths(item)) if len(ids) == 1 else ()
        return tuple(Answer(call_id, paths) for call_id in ids)

    def travels_with_next(self, item: Item) -> bool:
        """Whether the item is invalid without the item that follows it."""
        return False

    @abc.abstractmethod
    def identity(self, item: Item) -> Any:
        """The identity-bearing part of the item, in a form that survives the client's round trip."""

    @abc.abstractmethod
    def text(self, item: Item) -> tuple[str, int]:
        """What the model reads of the item, and how many non-text parts (images, files) it carries."""

    def transcript(self, item: Item, clip: Callable[[str], str]) -> str:
        """The item's text for the summariser, long parts passed through ``clip`` (which keeps head and tail)."""
        text, non_text = self.text(item)
        text = clip(text)
        if non_text:
            return f"{text}\n[{non_text} non-text part(s)]" if text else f"[{non_text} non-text part(s)]"
        return text

    @abc.abstractmethod
    def with_summary(self, item: Item | None, text: str) -> Item:
        """``text`` as the leading part of ``item`` (a user item) or, with None, a user item holding only it."""

    def system_with_summary(self, item: Item | None, text: str) -> Item | None:
        """``text`` appended to ``item`` (the last leading system item, or None: a new one); None if the API
        keeps its system prompt outside the items, and the summary then leads a user item instead."""
        return None

    def result_paths(self, item: Item) -> list[Path]:
        """Where the item holds tool output (a string or a list of parts), for masking and clipping: only paths
        the item has (a tool message may come without its content). Which output answers which call is
        ``answers``'s word."""
        return []

    def with_output(self, item: Item, path: Path, text: str) -> Item | None:
        """``item`` with the output at ``path`` (one of ``result_paths``) replaced by ``text``, ids and pairing kept;
        None where the API takes no text in its place."""
        return set_path(item, path, text)  # type: ignore[no-any-return]

    def result_failed(self, item: Item, path: Path) -> bool:
        """Whether ``item`` marks the output at ``path`` (one of ``result_paths``) as a failed call's. Where the
        API has no such mark (Chat, Responses) none is guessed here: the words of the output are read for one
        (``proxy.context.keep.artifactparse``)."""
        return False

    def call_of(self, item: Item, call_id: str) -> tuple[str, Any] | None:
        """The tool name and arguments of the call ``call_id`` made by ``item``; None if ``item`` does not make it."""
        return None

    def user_text(self, item: Item) -> str | None:
        """The words the user typed in ``item`` (None: none), carried verbatim into the summary when it leaves
        the verbatim tail. Tool output is never user words, even where the API puts it in a user message."""
        return self.text(item)[0] if self.role(item) == "user" else None

    @abc.abstractmethod
    def prompt_tokens(self, usage: Mapping[str, Any]) -> int | None:
        """Prompt tokens the upstream counted in a reply's ``usage``, cached ones included."""

    @abc.abstractmethod
    def cached_tokens(self, usage: Mapping[str, Any]) -> int | None:
        """The part of ``prompt_tokens`` served from the provider's prompt cache."""

    @abc.abstractmethod
    def output_tokens(self, usage: Mapping[str, Any]) -> int | None:
        """Tokens the upstream generated (hidden reasoning included: it is billed as output)."""

    def count_key(self, item: Item, digest: str) -> str:
        """The key a token count is cached under: the hash, unless the item holds text its identity leaves out."""
        return digest

    def hash(self, item: Item) -> str:
        """32 hex digits of the canonical JSON of ``identity``, prefixed by the dialect so APIs never collide."""
        payload = orjson.dumps(self.identity(item), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
        return hashlib.blake2b(self._prefix + payload, digest_size=16).hexdigest()

    @property
    def _prefix(self) -> bytes:
        return b"ctxproxy-" + self.name.encode() + b"-v1\x00"


def leading_system_count(model: ItemModel, items: Sequence[Item]) -> int:
    """Number of system items at the head: they are always in view and never summarised."""
    count = 0
    for item in items:
        if model.role(item) != "system":
            break
        count += 1
    return count


def round_start_for(model: ItemModel, items: Sequence[Item], index: int) -> int | None:
    """The user item opening the round that ``index`` falls inside.

    ``None`` when ``index`` is itself a round boundary (a user item, or the end
    of the conversation) or when no user item precedes it.
    """
    if index >= len(items) or model.role(items[index]) == "user":
        return None
    for i in range(index - 1, -1, -1):
        if model.role(items[i]) == "user":
            return i
    return None


def cut_points(model: ItemModel, items: Sequence[Item], start: int = 0) -> list[int]:
    """Indices ``i >= start`` where a conversation may be split into ``items[:i]`` and ``items[i:]``.

    A split is valid when no call made before it is answered after it, the item
    before it does not travel with the next, and the item at it is not a result,
    nor a system item past the head: a system entry between turns (Claude Code's
    "Today's date is …", its nudge after silent tool steps) belongs with what it
    follows, so the smallest tail is still the last step, never the entry alone.
    Calls still open at the end of the conversation do not block a split after
    them (the client is about to answer them).
    """
    answered_at: dict[str, int] = {}
    for index, item in enumerate(items):
        for call_id in model.results(item):
            answered_at.setdefault(call_id, index)
    points: list[int] = []
    open_until = -1  # last index holding a result of a call made so far
    head = leading_system_count(model, items)
    for index, item in enumerate(items):
        after_pair = index == 0 or not model.travels_with_next(items[index - 1])
        role = model.role(item)
        opens = role != "tool" and (role != "system" or index <= head)
        if index >= start and index > open_until and after_pair and opens:
            points.append(index)
        for call_id in model.calls(item):
            open_until = max(open_until, answered_at.get(call_id, -1))
    return points
