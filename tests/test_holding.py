"""Holding a ready background summary back (proxy.context.view.holding): only over the view the session's last
request stood on, as this process saw it, and only while the provider's cache is warm and nothing forces it."""

from __future__ import annotations

from proxy.context.view.budget import Estimate
from proxy.context.view.holding import ShownCheckpoints
from proxy.context.view.prepared import PreparedView
from proxy.context.view.worth import COLD, WARM, CacheRates
from proxy.store.base import SessionKey

KEY = SessionKey("tenant", "holding")


def view(tokens: int) -> PreparedView:
    return PreparedView([], True, Estimate(tokens, None, None, tokens), None, "none", 12_800, 12_800)


def held(shown: ShownCheckpoints, key: SessionKey = KEY, moment=WARM, tokens: int = 6_000) -> PreparedView | None:
    return shown.held(key, moment, view(3_000), [], view_on=lambda checkpoint: view(tokens), growth=500,
                      rates=CacheRates())


def test_a_ready_summary_waits_only_over_a_view_this_process_sent_while_the_cache_is_warm() -> None:
    shown = ShownCheckpoints(size=2)
    assert held(shown) is None, "a session this process has not served: used at once"
    shown.remember(KEY, None)
    assert held(shown) == view(6_000), "warm, 13 steps from the trigger: the last view's checkpoint stays"
    assert held(shown, moment=COLD) is None, "the cache is cold: it costs no extra write now"
    assert held(shown, tokens=13_000) is None, "past the trigger: forced"
    shown.forget(KEY)
    assert held(shown) is None, "the last view went out of another path (a reactive retry)"
    shown.remember(KEY, None)
    for n in range(2):
        shown.remember(SessionKey("tenant", str(n)), None)
    assert held(shown) is None, "bounded: the least recently seen session is forgotten"
