"""What the proxy saved: per request, folded per session from its log, net of what compacting cost, in dollars.

Each upstream reply the proxy logs carries ``tokens: {"client": C, "view": V}``
and ``model`` (the one the upstream answered with): the proxy's own count
(``Estimate.local``) of the request the client sent and of the view that went
upstream instead, both by the same estimator, so ``C - V`` is what compaction
took out of that request whatever the upstream's tokenizer. Per request:

- gross saved = ``C - V`` (never below 0);
- the model saw the upstream's ``usage`` prompt tokens where it reported them, else ``V``;
- the client sent what the model saw plus what was saved;
- gross dollars = saved times the model's ``input_cost_per_token`` in litellm's bundled
  map: the uncached list price, so an upper bound where the client's own history would
  have been read from a prompt cache. A model the map does not know adds tokens only.

Compacting is not free: each ``summary`` entry carries what its model calls
cost as the upstream reported it (``usage``, ``model``, ``calls``), and their
input and output tokens are the costs (in dollars at that model's input and
output list prices). What the proxy reports as saved (``saved_tokens``,
``cost_saved``, and the metrics) is net: gross less costs, below 0 while the
summaries have not yet paid for themselves. A summary call whose answer was not
kept leaves no entry, and is not counted.

Nor is changing the prompt's prefix: each reply entry says how its view's prefix
compared with its conversation's previous view (``prefix``: ``changed``, ``cause``,
``kept_tokens``; ``proxy.prefixes``), and the tokens the request wrote to the
prompt cache are the upstream's ``cache_creation_input_tokens`` (Anthropic) or,
where the upstream reports none (OpenAI, Gemini), an estimate: the view's tokens
past the prefix it kept. The writes of a request whose prefix the proxy changed
(cause ``compaction`` or ``masking``; not ``client`` nor ``ttl``) are a cost of
compacting too, at the model's cache-write price (the map's
``cache_creation_input_token_cost``, else 1.25 times the input price for an
Anthropic model, else the input price: a token the cache no longer serves is
billed as plain input), and come off the net figures: those writes less the request's
new items (``prefix.added_tokens``: the previous reply and the client's new
messages, which an unchanged prefix would have written as well; in the
upstream's tokens, ``CacheFigures.ratio``), never below 0.

The re-write factor is the issue's "cache-creation tokens over peak context"
as bench/lastingcost.py measures it: the session's cache writes, less those
an expired cache made (cause ``ttl``, beyond the request's new items: the
TTL's doing, nobody's choice), over the peak context as the client sent it
(its largest request, ``tokens.client``, in the writes' units: the proxy
counts the client's items, and an upstream that reports its writes counts
them with its own tokenizer, so the part of the request the view left out is
scaled by what the session's last unchanged request wrote, its new items, over
the proxy's count of them, ``context_of``). That is the
conversation's size, which a warm cache writes once, token by token: 1.0 when
no token was written twice. Over the largest prompt the proxy sent (the
view's peak) a session longer than its window could never come near 1.0.

The log is append-only, so ``SavingsCache`` folds a session once and then only
what was appended since.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.context.log.tiers import plural
from proxy.context.view.window import input_price_for, model_prices, output_price_for
from proxy.dialects import CHAT, DIALECTS, Dialect
from proxy.prefixes import CAUSES, PROXY_CAUSES
from proxy.store.base import FactLog, SessionInfo, SessionKey, StoredFact

#: Sessions whose folds ``SavingsCache`` keeps (a few hundred bytes each).
MAX_CACHED = 10_000
PAGE = 500


def dialect_of(fact: StoredFact) -> Dialect:
    """The API an entry came through; entries written before dialects existed are Chat Completions."""
    return DIALECTS.get(str(fact.extra.get("dialect", CHAT.name)), CHAT)


def request_tokens(fact: StoredFact) -> tuple[int, int] | None:
    """(client, view) of the request an upstream reply answered, when the proxy recorded them."""
    tokens = fact.extra.get("tokens")
    if not isinstance(tokens, Mapping):
        return None
    client, view = tokens.get("client"), tokens.get("view")
    return (client, view) if isinstance(client, int) and isinstance(view, int) else None


def dollars_saved(model: str | None, saved: int) -> float | None:
    """``saved`` tokens at ``model``'s input price, or None for a model the bundled map has no price for."""
    price = input_price_for(model) if model else None
    return saved * price if price is not None else None


def cache_write_price(model: str | None) -> float | None:
    """Dollars per token written to ``model``'s prompt cache, or None where unpriced: the map's write price (1.25
    times the input price for an Anthropic model it names none for), else the input price (OpenAI's and Gemini's
    implicit caches charge no write premium, but a token no longer read from the cache is billed as plain input)."""
    prices = model_prices(model) if model else None
    if prices is None:
        return None
    return prices.cache_write if prices.cache_write is not None else prices.input


def prefix_fields(prefix: object) -> tuple[bool, str | None, int, int] | None:
    """(changed, cause, kept_tokens, added_tokens) of a reply entry's ``prefix``, or None for one logged without
    it (``added_tokens`` 0 where an entry predates it: its caused writes are then an upper bound)."""
    if not isinstance(prefix, Mapping) or not isinstance(kept := prefix.get("kept_tokens"), int):
        return None
    cause, added = prefix.get("cause"), prefix.get("added_tokens")
    return (bool(prefix.get("changed")), cause if isinstance(cause, str) else None, kept,
            added if isinstance(added, int) else 0)


def cache_writes(usage: Mapping[str, Any] | None, view_tokens: int, kept_tokens: int | None) -> int | None:
    """Tokens one request wrote to the prompt cache: the upstream's ``cache_creation_input_tokens`` where it reports
    them, else the view past the prefix it kept (None where neither is known)."""
    reported = usage.get("cache_creation_input_tokens") if usage is not None else None
    if isinstance(reported, int):
        return reported
    return max(0, view_tokens - kept_tokens) if kept_tokens is not None else None


def in_write_units(tokens: int, usage: Mapping[str, Any] | None, prompt: int | None, view_tokens: int) -> int:
    """``tokens`` of the proxy's count in the units of the request's cache writes: where the upstream reported them,
    its tokenizer's (scaled by the request's ``prompt``, reported, over ``view_tokens``, the proxy's count of the
    same prompt); else the proxy's own, the units the writes were estimated in."""
    return round(tokens * prompt / view_tokens) if _reported(usage) and prompt and view_tokens else tokens


def _reported(usage: Mapping[str, Any] | None) -> bool:
    return usage is not None and isinstance(usage.get("cache_creation_input_tokens"), int)


@dataclass(frozen=True)
class CacheFigures:
    """What one request did to the prompt cache, in the units of its writes (``in_write_units``)."""

    #: Tokens it wrote (``cache_writes``; 0 where unknown).
    written: int
    #: Of those, the ones a prefix change made beyond the request's new items (the previous reply and the client's
    #: new messages, which the unchanged prompt would have written too), never below 0: ``caused`` when the proxy
    #: changed the prefix (``compaction``, ``masking``), ``lapsed`` when the cache had expired (``ttl``).
    caused: int
    lapsed: int
    #: The client's request: the re-write factor's peak context is the session's largest.
    context: int
    #: The upstream's tokens per token of the proxy's count of the client's own items (``context_of``).
    ratio: float | None


def cache_figures(usage: Mapping[str, Any] | None, prompt: int | None, client: int, view_tokens: int,
                  prefix: tuple[bool, str | None, int, int] | None, ratio: float | None = None) -> CacheFigures:
    """One request's ``CacheFigures``: ``prompt`` the upstream's count of it (None: unreported), ``client`` and
    ``view_tokens`` the proxy's counts of what the client sent and of the view, ``prefix`` its ``prefix_fields``,
    ``ratio`` the session's so far (``CacheFigures.ratio``)."""
    written = cache_writes(usage, view_tokens, prefix[2] if prefix is not None else None) or 0
    beyond = 0
    if prefix is not None and prefix[0] and (prefix[1] in PROXY_CAUSES or prefix[1] == "ttl"):
        new = round(prefix[3] * ratio) if ratio is not None and _reported(usage) else None
        beyond = max(0, written - (new if new is not None else in_write_units(prefix[3], usage, prompt, view_tokens)))
    proxys = prefix is not None and prefix[1] in PROXY_CAUSES
    if _reported(usage) and prefix is not None and not prefix[0] and written and prefix[3]:
        ratio = written / prefix[3]  # what an unchanged prompt wrote is the client's new items: their two counts
    return CacheFigures(written, beyond if proxys else 0, 0 if proxys else beyond,
                        context_of(usage, prompt, client, view_tokens, ratio), ratio)


def context_of(usage: Mapping[str, Any] | None, prompt: int | None, client: int, view_tokens: int,
               ratio: float | None) -> int:
    """The client's request in the units of the writes. Where the upstream reported them, it counted the view
    (``prompt``); what the client sent beyond the view (``client - view_tokens``, the proxy's count: what
    compaction took out, the client's own items) is scaled by ``ratio``, the two counts of the client's items that
    the session's last unchanged request wrote (its new items), else by the prompt's (a summary's text and a tool
    output's tokenize differently: scaling all by the prompt's was 30% off on the fake's tokenizer)."""
    if not _reported(usage) or not prompt or not view_tokens:  # writes estimated: the proxy's count, as theirs
        return client
    return prompt + round(max(0, client - view_tokens) * (ratio if ratio is not None else prompt / view_tokens))


@dataclass(frozen=True)
class SummaryCost:
    """What one ``summary`` entry's calls cost: their tokens in and out, and the dollars (None: unpriced)."""

    calls: int
    tokens: int
    dollars: float | None


def summary_cost(fact: StoredFact) -> SummaryCost | None:
    """The cost a ``summary`` entry records (``proxy.context.summary.callusage``), or None for any other entry and for a
    summary logged without one (before summaries carried it, or a client compaction's answer, which made no call).

    The cache writes a summary induces (the next request's prefix is new to the prompt cache) are counted with
    that request (``cache_writes``, cause ``compaction``).
    """
    if fact.kind != "summary" or not isinstance(calls := fact.extra.get("calls"), int):
        return None
    usage, model = fact.extra.get("usage"), fact.extra.get("model")
    model = model if isinstance(model, str) else None
    if not isinstance(usage, Mapping):
        return SummaryCost(calls, 0, None)
    dialect = dialect_of(fact)
    tokens_in, tokens_out = dialect.prompt_tokens(usage) or 0, dialect.output_tokens(usage) or 0
    price_in = input_price_for(model) if model else None
    price_out = output_price_for(model) if model else None
    dollars = tokens_in * price_in + tokens_out * price_out if price_in is not None and price_out is not None else None
    return SummaryCost(calls, tokens_in + tokens_out, dollars)


def _add(total: float | None, more: float | None) -> float | None:
    return total if more is None else (total or 0.0) + more


@dataclass
class UsageTotals:
    """A session's requests (its logged replies, every branch) and summaries: what the upstream reported, what
    compaction took out of the requests (gross) and what its summary calls cost."""

    replies: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    client_tokens: int = 0
    model_tokens: int = 0
    gross_saved_tokens: int = 0
    #: None while no request was of a model the bundled map prices.
    gross_cost_saved: float | None = None
    summary_calls: int = 0
    summary_tokens: int = 0
    #: None while no summary was made by a model the bundled map prices.
    summary_cost: float | None = None
    #: Tokens written to the prompt cache (reported or estimated), those of them the cache's expiry made (cause
    #: ``ttl``, beyond the requests' new items), and the client's largest request: the re-write factor.
    cache_write_tokens: int = 0
    ttl_write_tokens: int = 0
    peak_tokens: int = 0
    #: Prefix changes by cause (``proxy.prefixes.CAUSES``), and the cache writes of those the proxy caused.
    prefix_changes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    caused_write_tokens: int = 0
    #: None while no caused write was of a model the bundled map prices.
    caused_write_cost: float | None = None
    #: The session's ``CacheFigures.ratio`` so far.
    _ratio: float | None = None
    #: The seq and the figures of the last entry counted: every item of one reply carries its reply's figures.
    _last: tuple[int, Any, Any, Any] = (-2, None, None, None)

    @property
    def saved_tokens(self) -> int:
        """Net: what compaction took out of the requests less its summary calls and the cache writes it caused."""
        return self.gross_saved_tokens - self.summary_tokens - self.caused_write_tokens

    @property
    def cost_saved(self) -> float | None:
        """Net dollars: the gross less the priced summary calls and caused cache writes (None while none is priced)."""
        if self.gross_cost_saved is None and self.summary_cost is None and self.caused_write_cost is None:
            return None
        return (self.gross_cost_saved or 0.0) - (self.summary_cost or 0.0) - (self.caused_write_cost or 0.0)

    @property
    def rewrite_factor(self) -> float | None:
        """The cache writes, less those the cache's expiry made, over the peak context as the client sent it (its
        largest request): 1.0 when each token of the conversation was written once, whatever the proxy sent
        instead (None while no write is known: replies logged before the prefix was recorded, by an upstream that
        reports none)."""
        if not self.peak_tokens or not self.cache_write_tokens:
            return None
        return (self.cache_write_tokens - self.ttl_write_tokens) / self.peak_tokens

    def add(self, fact: StoredFact) -> None:
        if (cost := summary_cost(fact)) is not None:
            self.summary_calls += cost.calls
            self.summary_tokens += cost.tokens
            self.summary_cost = _add(self.summary_cost, cost.dollars)
            return
        if fact.kind != "message" or fact.source != "upstream":
            return
        usage, tokens = fact.extra.get("usage"), request_tokens(fact)
        usage = usage if isinstance(usage, Mapping) else None
        if usage is None and tokens is None:
            return
        figures = (usage, fact.extra.get("view"), tokens)
        same_reply = self._last == (fact.seq - 1, *figures)
        self._last = (fact.seq, *figures)
        if same_reply:
            return
        dialect = dialect_of(fact)
        self.replies += 1
        prompt = dialect.prompt_tokens(usage) if usage is not None else None
        self.prompt_tokens += prompt or 0
        self.cached_tokens += (dialect.cached_tokens(usage) if usage is not None else None) or 0
        if tokens is None:  # logged before the proxy recorded its counts: the upstream's figures only
            self.model_tokens += prompt or 0
            self.client_tokens += prompt or 0
            self.peak_tokens = max(self.peak_tokens, prompt or 0)
            self.cache_write_tokens += cache_writes(usage, 0, None) or 0
            return
        client, view = tokens
        saved = max(0, client - view)
        seen = prompt if prompt is not None else view
        self.model_tokens += seen
        self.client_tokens += seen + saved
        self.gross_saved_tokens += saved
        model = fact.extra.get("model")
        model = model if isinstance(model, str) else None
        self.gross_cost_saved = _add(self.gross_cost_saved, dollars_saved(model, saved))
        prefix = prefix_fields(fact.extra.get("prefix"))
        cache = cache_figures(usage, prompt, client, view, prefix, self._ratio)
        self._ratio = cache.ratio
        self.cache_write_tokens += cache.written
        self.ttl_write_tokens += cache.lapsed
        self.peak_tokens = max(self.peak_tokens, cache.context)
        if prefix is None or not prefix[0] or prefix[1] not in self.prefix_changes:
            return
        self.prefix_changes[prefix[1]] += 1
        if prefix[1] in PROXY_CAUSES:
            self.caused_write_tokens += cache.caused
            price = cache_write_price(model)
            self.caused_write_cost = _add(self.caused_write_cost, cache.caused * price if price is not None else None)

    def merge(self, other: UsageTotals) -> None:
        """Add another session's totals (for a total over sessions)."""
        for name in ("replies", "prompt_tokens", "cached_tokens", "client_tokens", "model_tokens",
                     "gross_saved_tokens", "summary_calls", "summary_tokens", "cache_write_tokens", "ttl_write_tokens",
                     "peak_tokens", "caused_write_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for cause, count in other.prefix_changes.items():
            self.prefix_changes[cause] = self.prefix_changes.get(cause, 0) + count
        self.gross_cost_saved = _add(self.gross_cost_saved, other.gross_cost_saved)
        self.summary_cost = _add(self.summary_cost, other.summary_cost)
        self.caused_write_cost = _add(self.caused_write_cost, other.caused_write_cost)

    def to_json(self) -> dict[str, Any]:
        """The figures: ``saved_tokens`` and ``cost_saved`` net, the gross and the summary calls' costs beside."""
        return {"replies": self.replies, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "client_tokens": self.client_tokens, "model_tokens": self.model_tokens,
                "saved_tokens": self.saved_tokens, "cost_saved": self.cost_saved,
                "gross_saved_tokens": self.gross_saved_tokens, "gross_cost_saved": self.gross_cost_saved,
                "summary_calls": self.summary_calls, "summary_tokens": self.summary_tokens,
                "summary_cost": self.summary_cost, "cache_write_tokens": self.cache_write_tokens,
                "ttl_write_tokens": self.ttl_write_tokens, "peak_tokens": self.peak_tokens,
                "rewrite_factor": self.rewrite_factor,
                "prefix_changes": dict(self.prefix_changes), "caused_write_tokens": self.caused_write_tokens,
                "caused_write_cost": self.caused_write_cost}


def saved_text(totals: UsageTotals) -> str:
    """One line for people: sent against seen, cached, saved net and its price (tokens only for an unpriced
    model), the summary calls and cache writes it is net of, and the prefix changes by cause; a session where the
    proxy cost more than it saved says so."""
    text = (f"{totals.client_tokens:,} tokens sent by the client, {totals.model_tokens:,} seen by the model "
            f"({totals.cached_tokens:,} cached), {totals.saved_tokens:,} saved")
    text += f", about ${totals.cost_saved:,.2f}" if totals.cost_saved is not None else ""
    if totals.summary_calls:
        calls = plural(totals.summary_calls, "summary call", "summary calls")
        text += (f" (net: {totals.gross_saved_tokens:,} taken out of requests, {totals.summary_tokens:,} spent on "
                 f"{calls})")
    if totals.caused_write_tokens:
        text += f"; cache writes caused: {totals.caused_write_tokens:,} tokens"
        text += f", ${totals.caused_write_cost:,.2f}" if totals.caused_write_cost is not None else ""
    if changes := ", ".join(f"{count} {cause}" for cause, count in totals.prefix_changes.items() if count):
        text += f"; prefix changes: {changes}"
    if totals.rewrite_factor is not None:
        text += f"; re-write factor {totals.rewrite_factor:.2f}"
    net = totals.cost_saved if totals.cost_saved is not None else totals.saved_tokens
    if net < 0 and (totals.summary_calls or totals.caused_write_tokens):
        text += "; the proxy cost more than it saved"
    return text


@dataclass
class _Fold:
    next_seq: int = 0
    last_id: str = ""
    totals: UsageTotals = field(default_factory=UsageTotals)


class SavingsCache:
    """Per-session totals, each caught up with its log on use; a log that lost the last entry folded is refolded."""

    def __init__(self, size: int = MAX_CACHED) -> None:
        self.size = size
        self._folds: OrderedDict[SessionKey, _Fold] = OrderedDict()

    async def totals(self, store: FactLog, key: SessionKey, entries: int | None = None) -> UsageTotals:
        """``entries``: the log's length when the caller knows it (``SessionInfo.entries``): nothing new is read."""
        fold = self._folds.pop(key, None) or _Fold()
        if fold.next_seq > 0 and (entries is None or entries != fold.next_seq):
            last = await store.read(key, after=fold.next_seq - 2, limit=1)
            if not last or last[0].id != fold.last_id:
                fold = _Fold()
        while entries is None or fold.next_seq < entries:
            facts = await store.read(key, after=fold.next_seq - 1, limit=PAGE)
            for fact in facts:
                fold.totals.add(fact)
            if facts:
                fold.next_seq, fold.last_id = facts[-1].seq + 1, facts[-1].id
            if len(facts) < PAGE:
                break
        self._folds[key] = fold
        while len(self._folds) > self.size:
            self._folds.popitem(last=False)
        return fold.totals

    async def of(self, store: FactLog, info: SessionInfo) -> UsageTotals:
        return await self.totals(store, SessionKey(info.tenant, info.session), info.entries)
