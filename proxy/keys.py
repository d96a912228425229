"""Every AppKey of the aiohttp application, in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import ClientSession, web

if TYPE_CHECKING:
    from proxy.compactions import RecentCompactions
    from proxy.context.engine import ContextEngine
    from proxy.context.log.history import HistoryManager
    from proxy.http.continuity import Links
    from proxy.metrics import Metrics
    from proxy.prefixes import PrefixTracker
    from proxy.savings import SavingsCache
    from proxy.secret import ServerSecret
    from proxy.settings import Settings
    from proxy.store.base import FactLog
    from proxy.throttle import FailureThrottle
    from proxy.tracing import Tracing
    from proxy.ui.signinlinks import SignInLinks
    from proxy.ui.timeline import TimelineCache

settings_key: web.AppKey[Settings] = web.AppKey("settings")
metrics_key: web.AppKey[Metrics] = web.AppKey("metrics")
client_key: web.AppKey[ClientSession] = web.AppKey("client", ClientSession)
store_key: web.AppKey[FactLog] = web.AppKey("store")
history_key: web.AppKey[HistoryManager] = web.AppKey("history")
prefixes_key: web.AppKey[PrefixTracker] = web.AppKey("prefixes")
engine_key: web.AppKey[ContextEngine] = web.AppKey("engine")
compactions_key: web.AppKey[RecentCompactions] = web.AppKey("compactions")
timelines_key: web.AppKey[TimelineCache] = web.AppKey("timelines")
secret_key: web.AppKey[ServerSecret] = web.AppKey("secret")
links_key: web.AppKey[Links] = web.AppKey("links")
throttle_key: web.AppKey[FailureThrottle] = web.AppKey("throttle")
savings_key: web.AppKey[SavingsCache] = web.AppKey("savings")
#: One-time sign-in links to the inspector (``ctxproxy demo``); absent where no command issues them.
signin_links_key: web.AppKey[SignInLinks] = web.AppKey("signin_links")
tracing_key: web.AppKey[Tracing] = web.AppKey("tracing")
