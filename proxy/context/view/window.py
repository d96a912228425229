"""Context window and prices per model, from the model map litellm ships as a plain JSON file: the one reader of
it (the savings, the replay lab and the cache cost model all price through ``model_prices``).

litellm is a dependency for its data, not its code: importing it costs seconds,
so the map is located with ``importlib.util.find_spec`` (which does not import a
top-level package) and read directly, lazily, once per process. A model the map
does not know yields ``None`` and the caller falls back to ``--context-window``.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

T = TypeVar("T")

MODEL_MAP_FILE = "model_prices_and_context_window_backup.json"
#: Anthropic bills a cache write at 1.25 times the input price (used where the map names no write price).
ANTHROPIC_WRITE_FACTOR = 1.25


@dataclass(frozen=True)
class ModelPrices:
    """Dollars per token: uncached input, output (0 where the map has none), and the prompt cache's write and read
    (None where unknown: the map names none, and for a write, the model is not Anthropic's)."""

    input: float
    output: float
    cache_write: float | None
    cache_read: float | None


@functools.cache
def litellm_dir() -> Path | None:
    """The installed litellm package directory, found without importing litellm."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def bundled_model_map() -> Mapping[str, Any]:
    """litellm's model map, or an empty map when litellm or its file is missing or unreadable.

    A broken or absent map must not stop the proxy: every model then simply
    uses the configured default window.
    """
    root = litellm_dir()
    if root is None:
        return {}
    try:
        data = orjson.loads((root / MODEL_MAP_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _window_of(entry: Any) -> int | None:
    if not isinstance(entry, dict):
        return None
    for field in ("max_input_tokens", "max_tokens"):
        value = entry.get(field)
        # bool is an int subclass; the map's "sample_spec" entry holds prose here.
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _cost(entry: Any, field: str) -> float | None:
    if not isinstance(entry, dict):
        return None
    value = entry.get(field)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def _price_of(entry: Any) -> float | None:
    return _cost(entry, "input_cost_per_token")


def _output_price_of(entry: Any) -> float | None:
    return _cost(entry, "output_cost_per_token")


def _lookup(model: str, pick: Callable[[Any], T | None], model_map: Mapping[str, Any] | None) -> T | None:
    """The first figure ``pick`` finds for ``model``: the exact name, then with routing prefixes stripped.

    Clients name models with whatever routing prefix their gateway uses
    (``openrouter/openai/gpt-4o`` → ``openai/gpt-4o`` → ``gpt-4o``) while the
    map lists most under the bare name.
    """
    entries = bundled_model_map() if model_map is None else model_map
    name = model.strip()
    while name:
        found = pick(entries.get(name))
        if found is not None:
            return found
        _, slash, rest = name.partition("/")
        name = rest if slash else ""
    return None


def context_window_for(model: str, model_map: Mapping[str, Any] | None = None) -> int | None:
    """Input window of ``model`` in tokens, or ``None`` when the map does not know it."""
    return _lookup(model, _window_of, model_map)


def input_price_for(model: str, model_map: Mapping[str, Any] | None = None) -> float | None:
    """Dollars per uncached input token of ``model`` (the map's ``input_cost_per_token``), or ``None``."""
    return _lookup(model, _price_of, model_map)


def output_price_for(model: str, model_map: Mapping[str, Any] | None = None) -> float | None:
    """Dollars per output token of ``model`` (the map's ``output_cost_per_token``), or ``None``."""
    return _lookup(model, _output_price_of, model_map)


def model_entry(model: str, model_map: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """``model``'s whole entry in the map (prices, window, features), or ``None`` when the map does not know it."""
    return _lookup(model, lambda entry: entry if isinstance(entry, dict) else None, model_map)


def model_prices(model: str, model_map: Mapping[str, Any] | None = None) -> ModelPrices | None:
    """``model``'s prices, or ``None`` when the map has no input price for it."""
    entry = model_entry(model, model_map)
    price = _price_of(entry)
    if entry is None or price is None:
        return None
    write = _cost(entry, "cache_creation_input_token_cost")
    if write is None and (entry.get("litellm_provider") == "anthropic" or "claude" in model):
        write = price * ANTHROPIC_WRITE_FACTOR
    return ModelPrices(price, _output_price_of(entry) or 0.0, write, _cost(entry, "cache_read_input_token_cost"))
