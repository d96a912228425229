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

from proxy.context.checkpoint import Checkpoint
from proxy.demo.agent import ScriptedAgent
from proxy.demo.model import ScriptedModel
from proxy.demo.script import CONSTRAINT, EDITED, EDITED_LINE
from proxy.keys import signin_links_key, store_key
from proxy.launch.run import new_session
from proxy.savings import SavingsCache, UsageTotals, saved_text
from proxy.sessions import tenant_of
from proxy.settings import Secret, Settings
from proxy.store.base import FactLog, SessionKey
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
class Tiers:
    """The session's compactions, read from its checkpoint entries."""

    masking: int = 0
    summary: int = 0
    model_free: int = 0


@dataclass
class Report:
    session: str
    tenant: str
    requests: int
    tiers: Tiers
    totals: UsageTotals
    constraint_kept: bool
    edit_kept: bool
    final: str

    def to_json(self) -> dict[str, object]:
        return {"session": self.session, "tenant": self.tenant, "requests": self.requests,
                "masking": self.tiers.masking, "summaries": self.tiers.summary, "model_free": self.tiers.model_free,
                "client_tokens": self.totals.client_tokens, "model_tokens": self.totals.prompt_tokens,
                "constraint_kept": self.constraint_kept, "edit_kept": self.edit_kept}

    def text(self) -> str:
        t, yes = self.totals, {True: "yes", False: "NO"}
        return "\n".join([
            f"ctxproxy demo: session {self.session} (tenant {self.tenant})",
            f"  {self.requests} requests from the scripted agent, each with the whole conversation",
            f"  compactions: {self.tiers.masking} masking batches (old tool outputs shortened, no model call), "
            f"{self.tiers.summary} model summaries, {self.tiers.model_free} model-free checkpoints "
            "(a summary call failed: the proxy kept going without one)",
            f"  tokens: {saved_text(t)}",
            f"  kept in the model's last prompt: the user's constraint verbatim: {yes[self.constraint_kept]}; "
            f"the current text of {EDITED}: {yes[self.edit_kept]}",
            f"  the agent's last word: {self.final}"])


async def tiers_of(store: FactLog, key: SessionKey) -> Tiers:
    """Each checkpoint's tier, from what it changed in the one it was made from: a new elision is the model-free
    tier's, a new summary a model's, only more outputs masked a masking batch's."""
    tiers = Tiers()
    made: dict[int, Checkpoint] = {}
    after = -1
    while page := await store.read(key, after=after, limit=500):
        after = page[-1].seq
        for fact in page:
            if fact.kind != "checkpoint":
                continue
            checkpoint = made[fact.seq] = Checkpoint.from_json(fact.extra["checkpoint"])
            made_from = fact.extra.get("made_from")
            previous = made.get(made_from) if isinstance(made_from, int) else None
            if checkpoint.elision and checkpoint.elision != (previous.elision if previous else ""):
                tiers.model_free += 1
            elif checkpoint.summary != (previous.summary if previous else ""):
                tiers.summary += 1
            else:
                tiers.masking += 1
    return tiers


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
            report = Report(session, key.tenant, len(agent.turns), await tiers_of(log, key),
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
