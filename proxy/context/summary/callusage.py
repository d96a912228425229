"""What a summary's model calls cost, as the upstream reported it: the price of a compaction (``proxy.savings``).

A summary may take several calls (chunks folded in turn, a retry after an
unusable answer, condensing a summary that grew too long). Their usage objects
are kept in the upstream's own shape, summed field by field, so the ``summary``
entry carries what the upstream reported without the engine reading any wire
format: the dialect reads the figures out of it where they are counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def summed(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    """Two usage objects of one API added field by field: numbers summed, objects recursively; any other value
    (a tier name, a list of per-modality details) is the first one's, or the second's where the first has none."""
    out = dict(first)
    for name, value in second.items():
        mine = out.get(name)
        if isinstance(mine, int | float) and not isinstance(mine, bool) and isinstance(value, int | float) \
                and not isinstance(value, bool):
            out[name] = mine + value
        elif isinstance(mine, Mapping) and isinstance(value, Mapping):
            out[name] = summed(mine, value)
        elif name not in out:
            out[name] = value
    return out


@dataclass(frozen=True)
class CallUsage:
    """The usage of ``calls`` summary calls: the upstream's usage objects summed (None: it reported none) and the
    model it answered with (None: it named none)."""

    reported: Mapping[str, Any] | None
    model: str | None
    calls: int = 1

    def plus(self, other: CallUsage | None) -> CallUsage:
        """This and ``other``'s calls together; the model is the last one named."""
        if other is None:
            return self
        if self.reported is None or other.reported is None:
            reported = self.reported if other.reported is None else other.reported
        else:
            reported = summed(self.reported, other.reported)
        return CallUsage(reported, other.model or self.model, self.calls + other.calls)

    def to_extra(self) -> dict[str, Any]:
        """The fields a ``summary`` entry carries: ``usage`` as reported, ``model``, and ``calls``."""
        extra: dict[str, Any] = {"calls": self.calls}
        if self.reported is not None:
            extra["usage"] = dict(self.reported)
        if self.model is not None:
            extra["model"] = self.model
        return extra


def added(total: CallUsage | None, more: CallUsage | None) -> CallUsage | None:
    """``total`` with ``more`` counted in; None while neither is known."""
    return more if total is None else total.plus(more)
