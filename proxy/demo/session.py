"""The demo's run: the scripted model, the proxy in front of it, the scripted agent through it, the report.

The proxy is the app ``serve`` runs (``create_app``), served on a free loopback
port as ``ctxproxy run`` serves it (``proxy.server.serving``), in a 6,000-token
window with background compaction off, so the run is the same every time. Its
store is the demo's own (``demo_store_url``: ``demo.db`` beside the default
store, never the user's ``facts.db``): each run adds one session, and the
inspector can be opened on it again later (``ctxproxy serve --store URL
--admin-token T``). The report is read from that store and from what the scripted model was
shown last.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import aiohttp
import orjson
import platformdirs

from proxy.context.log.tiers import TierCounts, plural, tiers_in_log
from proxy.demo.agent import ScriptedAgent
from proxy.demo.model import ScriptedModel
from proxy.demo.script import CONSTRAINT, EDITED, EDITED_LINE
from proxy.keys import signin_links_key, store_key
from proxy.launch.run import new_session
from proxy.savings import SavingsCache, UsageTotals, saved_text
from proxy.sessions import tenant_of
from proxy.settings import Secret, Settings
from proxy.store.base import SessionKey
from proxy.ui.signinlinks import SignInLinks

#: The client key the scripted agent sends: it names the demo's tenant, and goes nowhere (the model takes any).
KEY = "ctxproxy-demo"
WINDOW = 6000


def demo_store_url() -> str:
    return "sqlite:///" + str(Path(platformdirs.user_state_dir("ctxproxy")) / "demo.db")


def demo_settings(upstream: str, store: str, admin_token: str) -> Settings:
    """A small window and short verbatim tail, so every tier comes within ~40 steps; no background compaction."""
    return Settings(upstream=upstream, anthropic_upstream=upstream, gemini_upstream=upstream, store=store,
                    context_window=WINDOW, precompact_threshold=1.0, min_retain_rounds=3, keep_tool_outputs=4,
                    admin_token=Secret(admin_token), summary_max_tokens=1024, log_level="ERROR")


@dataclass
class Report:
    session: str
    tenant: str
    requests: int
    tiers: TierCounts
    totals: UsageTotals
    constraint_kept: bool
    edit_kept: bool
    final: str

    def to_json(self) -> dict[str, object]:
        return {"session": self.session, "tenant": self.tenant, "requests": self.requests,
                "masking": self.tiers.mask, "summaries": self.tiers.summary, "model_free": self.tiers.fallback,
                "client_tokens": self.totals.client_tokens, "model_tokens": self.totals.prompt_tokens,
                "constraint_kept": self.constraint_kept, "edit_kept": self.edit_kept}

    def text(self) -> str:
        t, yes = self.totals, {True: "yes", False: "NO"}
        return "\n".join([
            f"ctxproxy demo: session {self.session} (tenant {self.tenant})",
            f"  {self.requests} requests from the scripted agent, each with the whole conversation",
            f"  compactions: {plural(self.tiers.mask, 'masking batch', 'masking batches')} (old tool outputs "
            f"shortened, no model call), {plural(self.tiers.summary, 'model summary', 'model summaries')}, "
            f"{plural(self.tiers.fallback, 'model-free checkpoint', 'model-free checkpoints')} "
            "(a summary call failed: the proxy kept going without one)",
            f"  tokens: {saved_text(t)}",
            f"  kept in the model's last prompt: the user's constraint verbatim: {yes[self.constraint_kept]}; "
            f"the current text of {EDITED}: {yes[self.edit_kept]}",
            f"  the agent's last word: {self.final}"])


async def _until_stopped() -> None:
    """Until SIGINT (Ctrl-C) or SIGTERM."""
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def run_demo(store: str, serve: bool, out: Callable[[str], None], as_json: bool = False) -> Report:
    """The whole demo; with ``serve``, the inspector stays up on the session until Ctrl-C. ``as_json``: the
    report's figures as a JSON line after its text."""
    from proxy.app import create_app
    from proxy.server import serving

    model = ScriptedModel()
    session = new_session("demo")
    async with serving(model.app(), Settings()) as model_root:  # the same loopback server, for the model
        settings = demo_settings(f"{model_root}/v1", store, secrets.token_urlsafe(32))
        app = create_app(settings)
        links = app[signin_links_key] = SignInLinks()
        async with serving(app, settings) as root:
            agent = ScriptedAgent(f"{root}/s/{session}/v1/chat/completions", KEY)
            out(f"ctxproxy demo: a scripted agent and model through the proxy at {root}, window {WINDOW:,} tokens, "
                f"store {store}")
            async with aiohttp.ClientSession() as client:
                final = await agent.run(client)
            key = SessionKey(tenant_of(KEY), session)
            log = app[store_key]
            shown = orjson.dumps(model.last_prompt).decode()
            report = Report(session, key.tenant, len(agent.turns), await tiers_in_log(log, key),
                            await SavingsCache().totals(log, key), orjson.dumps(CONSTRAINT).decode()[1:-1] in shown,
                            orjson.dumps(EDITED_LINE).decode()[1:-1] in shown, final)
            out(report.text())
            if as_json:
                out(orjson.dumps(report.to_json()).decode())
            if serve:
                page = f"/ui/sessions/{quote(key.tenant, safe='')}/{quote(session, safe='')}"
                out(f"\nThe inspector on this session (sign-in link good once, for 10 minutes):\n"
                    f"  {root}/ui/once/{links.issue(page)}\nCtrl-C to stop.")
                await _until_stopped()
    return report
