"""``--shadow``: the proxy computes, compacts and logs the view of every request, and forwards the client's request
unchanged; the log and the inspector hold the view it would have sent."""

from __future__ import annotations

import random
import re
from typing import Any

import orjson
from click.testing import CliRunner

from proxy.cli import main
from proxy.keys import store_key
from proxy.settings import Settings
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import read_log
from tests.test_compaction_e2e import prose
from tests.test_ui import KEY, TENANT, TOOLS, page, session_path, sign_in, ui_proxy


async def run(proxy: Any, fake: FakeUpstream, session: str, steps: int) -> list[bytes]:
    """A tool loop of ``steps`` requests; the bodies the client sent, in order."""
    rng = random.Random(3)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Port the parser. FACT-Otter9 is the build flag."}]
    sent: list[bytes] = []
    for n in range(steps):
        fake.script.append(Reply(tool_calls=[{"id": f"call_{n}", "type": "function",
                                              "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]))
        body = orjson.dumps({"model": "gpt-4o", "messages": messages, "tools": TOOLS, "stream": n % 2 == 1})
        sent.append(body)
        resp = await proxy.post("/v1/chat/completions", data=body,
                                headers={"Authorization": f"Bearer {KEY}", "X-Session-Id": session})
        assert resp.status == 200, await resp.text()
        await resp.read()
        messages += [{"role": "assistant", "content": None, "tool_calls": [
                         {"id": f"call_{n}", "type": "function",
                          "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
                     {"role": "tool", "tool_call_id": f"call_{n}", "content": prose(rng, 400)}]
    return sent


async def test_the_upstream_gets_the_clients_bytes_while_the_log_and_inspector_hold_the_view(make_proxy,
                                                                                             fake) -> None:
    # The same run without the flag first: the views it sends are what the shadow run must log.
    control = await ui_proxy(make_proxy, context_window=4000, min_retain_rounds=2)
    plain = await run(control, fake, "plain", 12)
    assert fake.bodies != plain
    view_sent = fake.requests[-1]["messages"]
    assert view_sent != orjson.loads(plain[-1])["messages"], "the run compacts"
    fake.bodies.clear()

    proxy = await ui_proxy(make_proxy, context_window=4000, min_retain_rounds=2, shadow=True)
    await sign_in(proxy)
    sent = await run(proxy, fake, "sh", 12)

    assert sent == plain and fake.bodies == sent  # every request went upstream byte for byte as the client sent it
    facts = await read_log(proxy.app[store_key], SessionKey(TENANT, "sh"))
    assert any(f.kind == "checkpoint" for f in facts), "the proxy compacted, for the log only"
    last = [f for f in facts if f.kind == "message" and f.source == "upstream"][-1]
    assert last.extra["view"]["shadow"] is True
    assert last.extra["view"]["length"] == len(view_sent)  # the view the proxy would have sent
    tokens = last.extra["tokens"]
    assert tokens["client"] == tokens["view"] > tokens["shadow_view"]  # nothing was saved: it all went upstream

    html = await page(proxy, f"{session_path('sh')}/requests/{last.seq}?fragment=1")
    assert "Shadow view: what the proxy would have sent" in html
    shown = re.search(r"view of ([0-9,]+) messages", html)
    assert shown is not None and int(shown[1].replace(",", "")) == len(view_sent)
    for message in view_sent:  # the inspector shows the view the control run sent, item by item
        text = message.get("content") or ""
        assert html_text(text[:60]) in html


def html_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def test_the_flag_and_its_variable() -> None:
    assert Settings.from_env({"CTXPROXY_SHADOW": "true"}).shadow is True
    assert Settings.from_env({}).shadow is False
    assert "--shadow" in CliRunner().invoke(main, ["serve", "--help"]).output
