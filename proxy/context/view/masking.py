"""Tier 1 of the reductions: old tool outputs give way to a one-line placeholder that names their log entry.

Tool outputs are most of a coding agent's context and the part it needs least
once it has acted on them: replacing all but the last ten with a placeholder
halves an agent's cost at the same solve rate ("The Complexity Trap",
Lindenbauer et al. 2025; SWE-agent, OpenHands and Anthropic's
``clear_tool_uses`` ship versions of it). It needs no model call, so it comes
before a summary (``proxy.context.compactor``) and the summary comes only when
masking cannot bring the view down far enough.

A placeholder reads::

    [output of run {"cmd":"pytest -x"} elided: 312 lines, 9,104 tokens; log entry 57; re-run the tool if you need
    it again]

(one line), the tool's name and a digest of its arguments (from the call the output
answers), the output's size, and the log entry that holds it whole (``message
index N`` for one not logged yet); where the output said what went wrong, its
error lines follow verbatim (``KEPT_ERRORS``): a failure the agent saw stays in
view however old. With ``--recall-tool`` the hint names
``ctxproxy_recall`` instead. Only the output is replaced, through
``ItemModel.with_output``: ids, pairing and every other key (``is_error``,
``cache_control``) stay. An output no larger than twice its placeholder is
left as it is: masking it would save nothing.

Which outputs: a checkpoint's ``masked_until`` masks every output in
``[retain_start_idx, masked_until)``; a new one moves it to just before the
last ``keep`` items holding output (``mask_end``). It moves in batches, not one
output per step, so that the view's prefix changes once per batch and the
provider's prompt cache keeps hitting in between.

A placeholder is a function of the output, its call and its log entry, so the
masked region is byte-identical on every request until the next reduction.
Building one costs a tokenisation of the output, so each is built once and
cached by the chain hash of the conversation up to its item (which names the
item, its call and its log entry at once); a request then costs a dictionary
lookup per masked item.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from proxy.context.items import Answer, Item, ItemModel, get_path, leading_system_count
from proxy.context.keep.errorlines import call_errors
from proxy.context.keep.instructionfiles import read_path
from proxy.context.keep.toolkinds import is_shell
from proxy.context.view.tokens import NON_TEXT_PART_TOKENS, TokenCounter
from proxy.types import Message

PLACEHOLDER = "[output of {name} {arguments} elided: {size}; {where}; {hint}]"
#: Finds a placeholder in an item's text (the inspector marks masked outputs): its log entry, or its index.
PLACEHOLDER_PATTERN = re.compile(r"\[output of .* elided: [\d,]+ lines, [\d,]+ tokens[^;\]]*; "
                                 r"(?:log entry (\d+)|message index (\d+)); ")
RERUN_HINT = "re-run the tool if you need it again"
#: What follows a placeholder when the output said what went wrong: its error lines, verbatim
#: (``proxy.context.keep.errorlines``), so that masking an output never takes a failure out of the view.
KEPT_ERRORS = "\nIts error lines, verbatim:"
RECALL_HINT = "call ctxproxy_recall with entry {seq} to read it again"
#: Characters of a call's arguments a placeholder quotes.
ARGUMENTS_CHARS = 80
#: How far back from an output its call is looked for (a parallel call answers in a run of results).
CALL_SEARCH = 64
#: Share of the window the last ``--keep-tool-outputs`` outputs may take whole; older ones past it are masked.
KEEP_OUTPUTS_SHARE = 0.25
#: An output is masked only when it is larger than this many placeholders.
MIN_RATIO = 2
_NOTHING = object()


def arguments_digest(arguments: Any, limit: int = ARGUMENTS_CHARS) -> str:
    """Compact JSON of a call's arguments (parsed when they are a JSON string), whitespace folded, clipped."""
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            text = arguments
        else:
            text = orjson.dumps(arguments).decode()
    else:
        text = orjson.dumps(arguments, default=str).decode()
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def output_text(value: Any) -> tuple[str, int]:
    """The text of an output (a string or a list of parts) and how many non-text parts it holds."""
    if isinstance(value, str):
        return value, 0
    texts: list[str] = []
    non_text = 0
    for part in value if isinstance(value, list) else ():
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str):
            texts.append(text)
        else:
            non_text += 1
    return "\n".join(texts), non_text


def answer_text(dialect: ItemModel, item: Item, answer: Answer) -> tuple[str, bool]:
    """The text of one result (``ItemModel.answers``: its paths' texts, one line apart, in the order the dialect
    reads them) and whether its API flags it failed (``""`` and False: it states no text)."""
    text = "\n".join(output_text(get_path(item, path))[0] for path in answer.paths)
    return text, any(dialect.result_failed(item, path) for path in answer.paths)


def entry_name(index: int, seqs: Sequence[int]) -> tuple[str, int | None]:
    """``log entry S`` for a logged message, ``message index N`` before it is logged; and the seq."""
    if index < len(seqs):
        return f"log entry {seqs[index]}", seqs[index]
    return f"message index {index}", None


def mask_end(dialect: ItemModel, messages: Sequence[Message], start: int, keep: int, *, budget: int | None = None,
             size: Callable[[int], int] | None = None) -> int:
    """Where masking may reach: the ``keep``-th last item holding tool output (``start`` if there are fewer).

    With a ``budget`` (tokens, ``size`` measuring an item by index) the kept
    outputs must also fit it: ten outputs of 1,000 tokens alone passed the
    background-summary threshold of a 16k window, so a summary always came
    before masking. The last output is always kept, whatever its size.
    Walks back from the end only as far as the first item masking reaches.
    """
    seen = 0
    kept = 0
    for index in range(len(messages) - 1, start - 1, -1):
        if dialect.result_paths(messages[index]):
            if budget is not None and size is not None:
                kept += size(index)
                if seen and kept > budget:
                    return index + 1
            seen += 1
            if seen >= keep:
                return index
    return start


def first_unmasked(dialect: ItemModel, messages: Sequence[Message], retain_start: int | None, masked_until: int) -> int:
    """The first index a new batch would mask: past the system head, the summary and what is masked already."""
    floor = leading_system_count(dialect, messages)
    return max(floor, retain_start or 0, masked_until)


class Masker:
    """Builds and caches masked items; one per engine (the placeholders' hint depends on ``recall``).

    Two bounded caches: masked items by (dialect, prefix hash, seq), which
    name the item, its call and its log entry at once, so a placeholder is
    built (and its output tokenised) once; and whole masked regions by the
    checkpoint's prefix hash and the region's seqs, so a request whose region
    was built before costs one lookup and one pass over its items. ``digests``
    maps ``id()`` of every cached masked item to its hash, so that estimating a
    view finds their token counts without hashing them again.
    """

    def __init__(self, counter: TokenCounter, *, recall: bool = False, maxsize: int = 50_000,
                 regions: int = 2_000) -> None:
        self.counter = counter
        self.recall = recall
        self.maxsize = maxsize
        self.max_regions = regions
        self.digests: dict[int, str] = {}
        self._cache: OrderedDict[tuple[str, str, int], Message | None] = OrderedDict()
        self._regions: OrderedDict[tuple[Any, ...], tuple[Message | None, ...]] = OrderedDict()
        #: ``freed`` sums so far: (dialect, prefix hash before ``start``, start) -> (scanned to, its prefix hash, sum).
        self._freed: OrderedDict[tuple[str, str, int], tuple[int, str, int]] = OrderedDict()

    def item(self, dialect: ItemModel, messages: Sequence[Message], index: int, seqs: Sequence[int],
             keys: Sequence[str]) -> Message:
        """``messages[index]`` as a masked view shows it: itself when it holds no output worth masking.

        ``seqs`` and ``keys`` (prefix hashes) cover the logged prefix; an item
        beyond them is named by its index and built afresh each time.
        """
        key = (dialect.name, keys[index], seqs[index]) if index < min(len(keys), len(seqs)) else None
        found = self._cache.get(key, _NOTHING) if key is not None else _NOTHING
        if found is _NOTHING:
            found = self._build(dialect, messages, index, seqs)
            if key is not None:
                self._remember(key, found, dialect)
        return messages[index] if found is None else found  # type: ignore[return-value]

    def region(self, dialect: ItemModel, messages: Sequence[Message], start: int, end: int, seqs: Sequence[int],
               keys: Sequence[str], scope: str = "") -> list[Message]:
        """``messages[start:end]`` with their outputs masked; ``scope`` (the checkpoint's prefix hash, which names
        their content) and their seqs key the region."""
        end = min(end, len(messages))
        key = (dialect.name, scope, start, end, tuple(seqs[start:end])) if scope else None
        pattern = self._regions.get(key) if key is not None else None
        if pattern is None:
            built = [self.item(dialect, messages, i, seqs, keys) for i in range(start, end)]
            if key is None:
                return built
            pattern = tuple(m if m is not messages[i] else None for i, m in enumerate(built, start))
            self._regions[key] = pattern
            if len(self._regions) > self.max_regions:
                self._regions.popitem(last=False)
            return built
        return [messages[i] if m is None else m for i, m in enumerate(pattern, start)]

    def freed(self, dialect: ItemModel, messages: Sequence[Message], hashes: Sequence[str], start: int, end: int,
              seqs: Sequence[int], keys: Sequence[str], count: Callable[[Message, str | None], int]) -> int:
        """Tokens masking ``messages[start:end]`` would free (``count``: the budget's per-item measure).

        Asked on every request while a batch builds up, so the sum over the
        logged part is remembered (by the prefix hash where it stopped) and
        only what is new is looked at: a run of outputs too small to mask
        costs nothing per step.
        """
        end = min(end, len(messages))
        logged = min(end, len(keys), len(seqs))
        memo_key = (dialect.name, keys[start - 1] if 0 < start <= len(keys) else "", start)
        scanned, chain, total = self._freed.get(memo_key, (start, "", 0))
        if not (start < scanned <= logged and keys[scanned - 1] == chain):
            scanned, total = start, 0
        total += self._freed_in(dialect, messages, hashes, scanned, logged, seqs, keys, count)
        if logged > start:
            self._freed[memo_key] = (logged, keys[logged - 1], total)
            self._freed.move_to_end(memo_key)
            if len(self._freed) > self.max_regions:
                self._freed.popitem(last=False)
        return total + self._freed_in(dialect, messages, hashes, max(logged, start), end, seqs, keys, count)

    def _freed_in(self, dialect: ItemModel, messages: Sequence[Message], hashes: Sequence[str], start: int, end: int,
                  seqs: Sequence[int], keys: Sequence[str], count: Callable[[Message, str | None], int]) -> int:
        total = 0
        for index in range(start, end):
            masked = self.item(dialect, messages, index, seqs, keys)
            if masked is not messages[index]:
                total += count(messages[index], hashes[index]) - count(masked, self.digests.get(id(masked)))
        return total

    def _remember(self, key: tuple[str, str, int], value: Message | None, dialect: ItemModel) -> None:
        self._cache[key] = value
        if value is not None:
            self.digests[id(value)] = dialect.hash(value)
        while len(self._cache) > self.maxsize:
            _, dropped = self._cache.popitem(last=False)
            if dropped is not None:
                self.digests.pop(id(dropped), None)

    def _build(self, dialect: ItemModel, messages: Sequence[Message], index: int,
               seqs: Sequence[int]) -> Message | None:
        item = messages[index]
        paths = dialect.result_paths(item)
        if not paths:
            return None
        owner = {path: answer.call_id for answer in dialect.answers(item) for path in answer.paths}
        where, seq = entry_name(index, seqs)
        hint = RECALL_HINT.format(seq=seq) if self.recall and seq is not None else RERUN_HINT
        out: Item = item
        for path in paths:
            name, raw = self.call(dialect, messages, index, owner.get(path))
            if read_path(name, raw) is not None:
                continue  # an instruction file the agent read stays verbatim (proxy.context.keep.pins)
            arguments = arguments_digest(raw)
            text, non_text = output_text(get_path(item, path))
            tokens = self.counter.text_tokens(text) + non_text * NON_TEXT_PART_TOKENS
            lines = text.count("\n") + 1 if text else 0
            size = f"{lines:,} lines, {tokens:,} tokens" + (f", {non_text} non-text part(s)" if non_text else "")
            placeholder = PLACEHOLDER.format(name=name, arguments=arguments, size=size, where=where, hint=hint)
            failures = call_errors(name, text, is_error=dialect.result_failed(item, path), shell=is_shell(name, raw))
            if failures:
                placeholder += "\n".join([KEPT_ERRORS, *failures])
            if tokens <= MIN_RATIO * self.counter.text_tokens(placeholder):
                continue
            out = dialect.with_output(out, path, placeholder) or out
        return None if out is item else out

    @staticmethod
    def call(dialect: ItemModel, messages: Sequence[Message], index: int, call_id: str | None) -> tuple[str, Any]:
        """The name and arguments of the call ``call_id``, found by walking back from its output."""
        if call_id is not None:
            for i in range(index - 1, max(-1, index - 1 - CALL_SEARCH), -1):
                found = dialect.call_of(messages[i], call_id)
                if found is not None:
                    return found[0], found[1]
        return "a tool", {}
