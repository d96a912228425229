"""A model's prices, from litellm's bundled cost map (``proxy.context.view.window`` reads it without importing
litellm)."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.context.view.window import model_prices


@dataclass(frozen=True)
class Prices:
    """Dollars per token: uncached input, cache read (the input price where the map has none), output."""

    input: float
    cached: float
    output: float

    def cost(self, uncached: int, cached: int, output: int) -> float:
        return uncached * self.input + cached * self.cached + output * self.output


def prices_for(model: str) -> Prices | None:
    """``model``'s prices, or None when the map has no input price for it."""
    prices = model_prices(model) if model else None
    if prices is None:
        return None
    return Prices(prices.input, prices.cache_read if prices.cache_read is not None else prices.input, prices.output)
