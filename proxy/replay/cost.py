"""A model's prices, from litellm's bundled cost map (``proxy.context.view.window`` reads it without importing
litellm)."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.context.view.window import model_entry


@dataclass(frozen=True)
class Prices:
    """Dollars per token: uncached input, cache read (the input price where the map has none), output."""

    input: float
    cached: float
    output: float

    def cost(self, uncached: int, cached: int, output: int) -> float:
        return uncached * self.input + cached * self.cached + output * self.output


def _price(entry: dict[str, object], name: str) -> float | None:
    value = entry.get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def prices_for(model: str) -> Prices | None:
    """``model``'s prices, or None when the map has no input price for it."""
    entry = model_entry(model) if model else None
    if entry is None or (price := _price(entry, "input_cost_per_token")) is None:
        return None
    cached = _price(entry, "cache_read_input_token_cost")
    return Prices(price, cached if cached is not None else price, _price(entry, "output_cost_per_token") or 0.0)
