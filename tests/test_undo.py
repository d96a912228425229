"""Undoing a compaction: a ``retire`` entry, through the admin API and the CLI, on each store.

After an undo the next view is the one the retired checkpoint replaced (the
checkpoint it was made from, or the whole history), the log keeps every entry
it had, an undo while a compaction runs is refused (409) and logs nothing, a
compaction planned before an undo that landed anyway appends nothing, and
nothing is reduced again before the view passes the trigger.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from proxy.cli import main
from proxy.context.engine import UNDONE
from proxy.context.log.lineage import ConversationState
from proxy.context.log.undo import retire_fact
from proxy.keys import compactions_key, engine_key, history_key, store_key
from proxy.sessions import tenant_of
from proxy.settings import Secret
from proxy.store.base import FactLog, NewFact, SessionKey, StoredFact
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import MASKING_OFF, read_log
from tests.test_admin import ADMIN, TENANT_KEY, TOKEN, chat, error_of
from tests.test_admin import TENANT as ADMIN_TENANT
from tests.test_background import WINDOW, compactions
from tests.test_compaction_e2e import prose, send, tool_call
from tests.test_ui import TENANT as UI_TENANT
from tests.test_ui import TOKEN as UI_TOKEN
from tests.test_ui import agent_session, form_token, page, session_path, sign_in, ui_proxy

AGENT_TENANT = tenant_of("sk-e2e")  # the key tests.test_compaction_e2e.send uses


async def view_of(proxy: Any, tenant: str, session: str) -> dict[str, Any]:
    resp = await proxy.get(f"/admin/sessions/{tenant}/{session}/view", headers=ADMIN)
    assert resp.status == 200, await resp.text()
    view: dict[str, Any] = await resp.json()
    return view


def but_compacting_costs(view: dict[str, Any]) -> dict[str, Any]:
    """A view with its usage's savings left out: an undone compaction's summary call was made, and is still counted
    against them (``proxy.savings``)."""
    costs = ("saved_tokens", "cost_saved", "summary_calls", "summary_tokens", "summary_cost")
    return {**view, "usage": {name: value for name, value in view["usage"].items() if name not in costs}}


async def view_of_ui(proxy: Any, session: str) -> dict[str, Any]:
    """The admin view of a session of ``tests.test_ui``'s tenant, with its admin token."""
    resp = await proxy.get(f"/admin/sessions/{UI_TENANT}/{session}/view",
                           headers={"Authorization": f"Bearer {UI_TOKEN}"})
    assert resp.status == 200, await resp.text()
    view: dict[str, Any] = await resp.json()
    return view


async def compact(proxy: Any, tenant: str, session: str) -> dict[str, Any]:
    resp = await proxy.post(f"/admin/sessions/{tenant}/{session}/compact", headers=ADMIN)
    result: dict[str, Any] = await resp.json()
    assert result["outcome"] == "ok", result
    return result


async def uncompact(proxy: Any, tenant: str, session: str, body: Any = None) -> Any:
    return await proxy.post(f"/admin/sessions/{tenant}/{session}/uncompact", headers=ADMIN,
                            data=orjson.dumps(body) if body is not None else None)


async def rounds(proxy: Any, fake: FakeUpstream, session: str, messages: list[dict[str, Any]], count: int,
                 seed: int) -> list[dict[str, Any]]:
    """``count`` more user rounds of ``messages`` through the proxy (tenant ``ADMIN_TENANT``)."""
    rng = random.Random(seed)
    for n in range(count):
        messages.append({"role": "user", "content": f"Round {seed}.{n}: " + prose(rng, 220)})
        fake.script.append(Reply(content=prose(rng, 160)))
        resp = await chat(proxy, messages, session)
        messages.append((await resp.json())["choices"][0]["message"])
    return messages


def kinds(facts: list[StoredFact]) -> list[str]:
    return [f.kind for f in facts]


async def test_an_undo_gives_back_the_view_the_compaction_replaced(make_proxy, fake: FakeUpstream) -> None:
    proxy = await make_proxy(admin_token=Secret(TOKEN), min_retain_rounds=1)
    key = SessionKey(ADMIN_TENANT, "undo")
    messages = await rounds(proxy, fake, "undo", [{"role": "system", "content": "You are helpful."}], 4, seed=1)
    whole = await view_of(proxy, ADMIN_TENANT, "undo")
    assert whole["checkpoint"] is None
    made = await compact(proxy, ADMIN_TENANT, "undo")
    assert (await view_of(proxy, ADMIN_TENANT, "undo"))["messages"] != whole["messages"]
    before = await read_log(proxy.app[store_key], key)
    assert kinds(before)[-2:] == ["summary", "checkpoint"]

    resp = await uncompact(proxy, ADMIN_TENANT, "undo")
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"retired": [before[-1].seq], "entry": before[-1].seq + 1, "checkpoint": None}

    after = await read_log(proxy.app[store_key], key)
    assert after[:-1] == before, "the log keeps every entry: the undo is one more"
    assert (after[-1].kind, after[-1].source, after[-1].extra) == ("retire", "proxy",
                                                                     {"checkpoint_seq": before[-1].seq})
    assert before[-1].extra["checkpoint"] == made["checkpoint"]
    assert but_compacting_costs(await view_of(proxy, ADMIN_TENANT, "undo")) == but_compacting_costs(whole)

    # The next request sends the whole history upstream, and compacts nothing: it fits.
    fake.script.append(Reply(content="Back to where we were."))
    resp = await chat(proxy, [*messages, {"role": "user", "content": "go on"}], "undo")
    assert resp.headers["X-Ctxproxy-Compacted"] == "none"
    assert fake.requests[-1]["messages"] == [*whole["messages"], {"role": "user", "content": "go on"}]


async def test_undos_take_back_checkpoints_newest_first_and_then_refuse(make_proxy, fake: FakeUpstream) -> None:
    proxy = await make_proxy(admin_token=Secret(TOKEN), min_retain_rounds=1)
    messages = await rounds(proxy, fake, "stack", [{"role": "system", "content": "You are helpful."}], 4, seed=2)
    first = await compact(proxy, ADMIN_TENANT, "stack")
    await rounds(proxy, fake, "stack", messages, 3, seed=3)
    once = await view_of(proxy, ADMIN_TENANT, "stack")
    assert once["checkpoint"] == first["checkpoint"]
    second = await compact(proxy, ADMIN_TENANT, "stack")
    assert second["checkpoint"] != first["checkpoint"]
    facts = await read_log(proxy.app[store_key], SessionKey(ADMIN_TENANT, "stack"))
    first_seq, second_seq = [f.seq for f in facts if f.kind == "checkpoint"]

    resp = await uncompact(proxy, ADMIN_TENANT, "stack")
    assert await resp.json() == {"retired": [second_seq], "entry": second_seq + 1, "checkpoint": first_seq}
    assert but_compacting_costs(await view_of(proxy, ADMIN_TENANT, "stack")) == but_compacting_costs(once)

    resp = await uncompact(proxy, ADMIN_TENANT, "stack", {"checkpoint": second_seq})
    assert resp.status == 409 and (await error_of(resp))["code"] == "nothing_to_undo"
    resp = await uncompact(proxy, ADMIN_TENANT, "stack", {"checkpoint": 0})  # a message entry
    assert resp.status == 409 and "not a checkpoint" in (await error_of(resp))["message"]

    resp = await uncompact(proxy, ADMIN_TENANT, "stack", {"checkpoint": first_seq})
    assert (await resp.json())["checkpoint"] is None
    whole = await view_of(proxy, ADMIN_TENANT, "stack")
    assert whole["checkpoint"] is None and whole["messages"] == messages

    resp = await uncompact(proxy, ADMIN_TENANT, "stack")
    assert resp.status == 409 and (await error_of(resp))["code"] == "nothing_to_undo"
    log = await read_log(proxy.app[store_key], SessionKey(ADMIN_TENANT, "stack"))
    assert kinds(log)[-2:] == ["retire", "retire"], "a refused undo logs nothing"


async def test_undoing_an_older_compaction_takes_back_the_later_ones_made_from_it(make_proxy, fake) -> None:
    proxy = await make_proxy(admin_token=Secret(TOKEN), min_retain_rounds=1)
    messages = await rounds(proxy, fake, "older", [{"role": "system", "content": "You are helpful."}], 4, seed=6)
    await compact(proxy, ADMIN_TENANT, "older")
    await rounds(proxy, fake, "older", messages, 3, seed=7)
    await compact(proxy, ADMIN_TENANT, "older")
    facts = await read_log(proxy.app[store_key], SessionKey(ADMIN_TENANT, "older"))
    first_seq, second_seq = [f.seq for f in facts if f.kind == "checkpoint"]
    # The second summary folds the first's: undoing only the first would leave its words in the view.
    resp = await uncompact(proxy, ADMIN_TENANT, "older", {"checkpoint": first_seq})
    assert await resp.json() == {"retired": [first_seq, second_seq], "entry": facts[-1].seq + 1, "checkpoint": None}
    view = await view_of(proxy, ADMIN_TENANT, "older")
    assert view["checkpoint"] is None and view["messages"] == messages
    resp = await uncompact(proxy, ADMIN_TENANT, "older", {"checkpoint": second_seq})
    assert resp.status == 409 and "undone already" in (await error_of(resp))["message"]


@pytest.mark.parametrize("body", [b"[1]", b"{not json", b'{"checkpoint": "4"}', b'{"checkpoint": -1}',
                                  b'{"checkpoint": true}', b'{"checkpoint": 99999999999999999999999}'])
async def test_an_undo_refuses_a_malformed_body(make_proxy, fake, body: bytes) -> None:
    proxy = await make_proxy(admin_token=Secret(TOKEN))
    await chat(proxy, [{"role": "user", "content": "x"}], "s1")
    resp = await proxy.post(f"/admin/sessions/{ADMIN_TENANT}/s1/uncompact", data=body, headers=ADMIN)
    assert resp.status == 400
    assert (await error_of(resp))["type"] == "invalid_request_error"


async def test_an_undo_of_an_unknown_session_is_404_and_needs_the_admin_token(make_proxy, fake) -> None:
    proxy = await make_proxy(admin_token=Secret(TOKEN))
    resp = await uncompact(proxy, ADMIN_TENANT, "nobody")
    assert resp.status == 404 and "nobody" in (await error_of(resp))["message"]
    await chat(proxy, [{"role": "user", "content": "x"}], "s1")
    assert (await uncompact(proxy, ADMIN_TENANT, "s1")).status == 409  # known, but nothing to undo
    resp = await proxy.post(f"/admin/sessions/{ADMIN_TENANT}/s1/uncompact",
                            headers={"Authorization": "Bearer sk-tenant-a"})
    assert resp.status == 401


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), env={"CTXPROXY_STORE": None, "CTXPROXY_CONTEXT_WINDOW": None})


async def test_the_cli_undo_reaches_a_running_proxy_and_the_cli_view(make_proxy, fake: FakeUpstream,
                                                                     store_url: str) -> None:
    proxy = await make_proxy(admin_token=Secret(TOKEN), min_retain_rounds=1)
    messages = await rounds(proxy, fake, "cli", [{"role": "system", "content": "You are helpful."}], 4, seed=4)
    whole = await view_of(proxy, ADMIN_TENANT, "cli")
    await compact(proxy, ADMIN_TENANT, "cli")
    seq = (await read_log(proxy.app[store_key], SessionKey(ADMIN_TENANT, "cli")))[-1].seq

    # The CLI is another process's HistoryManager on the same store, with its own event loop.
    result = await asyncio.to_thread(cli, "sessions", "uncompact", "cli", "--store", store_url)
    assert result.exit_code == 0, result.output
    assert result.output == (f"Undid the compaction at entry #{seq} (retired by entry #{seq + 1}); "
                             "the next view is built from the whole history.\n")
    shown = await asyncio.to_thread(cli, "sessions", "view", "cli", "--store", store_url, "--json")
    assert orjson.loads(shown.output)["messages"] == whole["messages"]
    transcript = (await asyncio.to_thread(cli, "sessions", "log", "cli", "--store", store_url)).output
    assert transcript.rstrip().endswith(f"── retire: the compaction at entry {seq} is undone ──")
    again = await asyncio.to_thread(cli, "sessions", "uncompact", "cli", "--store", store_url)
    assert again.exit_code == 1 and "no compaction left to undo" in again.output

    # The proxy reads what another process appended once its cached state is older than ``fresh_for``: the next
    # request after a quiet second (made quiet at once here) sends the whole history again.
    proxy.app[history_key].fresh_for = 0.0
    fake.script.append(Reply(content="ok"))
    resp = await chat(proxy, [*messages, {"role": "user", "content": "next"}], "cli")
    assert resp.headers["X-Ctxproxy-Compacted"] == "none"
    assert fake.requests[-1]["messages"] == [*whole["messages"], {"role": "user", "content": "next"}]


class AgentRun:
    """An agent's tool steps through a proxy that summarises in the background past 0.6 of a 16k window, with one
    manual compaction made before the first background one (the checkpoint the tests undo)."""

    def __init__(self, proxy: Any, fake: FakeUpstream) -> None:
        self.proxy, self.fake = proxy, fake
        self.key = SessionKey(AGENT_TENANT, "bg")
        self.engine = proxy.app[engine_key]
        self.rng = random.Random(5)
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                               {"role": "user", "content": "Refactor the parser module."}]
        self.n = 0
        self.early: dict[str, Any] = {}

    @classmethod
    async def start(cls, make_proxy: Any, fake: FakeUpstream) -> AgentRun:
        fake.window = WINDOW
        run = cls(await make_proxy(admin_token=Secret(TOKEN), context_window=WINDOW, precompact_threshold=0.6,
                                   **MASKING_OFF), fake)  # the summary path
        while True:  # steps until a manual compaction has something to summarise, before any background one
            await run.step()
            resp = await run.proxy.post(f"/admin/sessions/{AGENT_TENANT}/bg/compact", headers=ADMIN)
            run.early = await resp.json()
            if run.early["outcome"] == "ok":
                break
        assert compactions(run.proxy, "background") == 0
        return run

    async def step(self) -> Any:
        self.fake.script.append(tool_call(self.n))
        self.n += 1
        resp, reply = await send(self.proxy, self.messages, "bg", stream=False)
        self.messages.extend([reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                                      "content": prose(self.rng, 300)}])
        return resp

    async def until_background(self) -> Any:
        """Steps until one starts a background compaction; that step's response."""
        while True:
            resp = await self.step()
            if self.engine.background.running(self.key) is not None:
                return resp

    async def nothing_recorded_after_the_undo(self) -> None:
        facts = await read_log(self.proxy.app[store_key], self.key)
        assert facts[-1].kind == "retire", "the summary planned before the undo was not recorded"
        assert [f.extra["checkpoint"] for f in facts if f.kind == "checkpoint"] == [self.early["checkpoint"]]
        assert compactions(self.proxy, "background") == 1
        assert self.engine.background.running(self.key) is None


async def test_an_undo_while_a_compaction_runs_is_refused_and_after_one_none_starts_ahead_again(
        make_proxy, fake: FakeUpstream) -> None:
    run = await AgentRun.start(make_proxy, fake)
    fake.summary_gate = asyncio.Event()  # the background summary is held until the undo was answered
    asked = len(fake.summary_requests)
    while len(fake.summary_requests) == asked:  # until the summary call is out: the job planned on the checkpoint
        started = await run.step()  # at last the step whose view passed the soft threshold and started it
    assert run.engine.background.running(run.key) is not None
    before = await read_log(run.proxy.app[store_key], run.key)
    resp = await uncompact(run.proxy, AGENT_TENANT, "bg")
    assert resp.status == 409 and (await error_of(resp))["code"] == "compaction_running"
    assert await read_log(run.proxy.app[store_key], run.key) == before, "a refused undo logs nothing"
    fake.summary_gate.set()
    await run.engine.background.join(run.key)
    facts = await read_log(run.proxy.app[store_key], run.key)
    early, made = [f.seq for f in facts if f.kind == "checkpoint"]
    resp = await uncompact(run.proxy, AGENT_TENANT, "bg")  # tried again once it is done: it undoes that one
    assert await resp.json() == {"retired": [made], "entry": facts[-1].seq + 1, "checkpoint": early}

    # Until the view passes the trigger nothing is summarised ahead of need, not even past the view that started
    # the held summary (over the soft threshold, then).
    summaries, threshold = len(fake.summary_requests), run.engine.policy(WINDOW).threshold(None)
    tokens = 0
    while tokens <= int(started.headers["X-Ctxproxy-View-Tokens"]):
        resp = await run.step()
        tokens = int(resp.headers["X-Ctxproxy-View-Tokens"])
        assert resp.headers["X-Ctxproxy-Compacted"] == "none" and tokens <= threshold
        assert run.engine.background.running(run.key) is None and len(fake.summary_requests) == summaries


async def test_a_background_compaction_that_waited_for_the_lock_past_an_undo_makes_nothing(
        make_proxy, fake: FakeUpstream) -> None:
    run = await AgentRun.start(make_proxy, fake)
    store = run.proxy.app[store_key]
    assert await store.try_lock(run.key, "compact", "another-replica", 60.0)  # the job waits for it
    await run.until_background()
    resp = await uncompact(run.proxy, AGENT_TENANT, "bg")
    assert resp.status == 409, "another replica's compaction holds the lock: the undo waits for none"
    # A retire logged past the lock all the same (its holder lost the lease to a store outage): still the newer
    # decision, which the compaction planned before it does not overrule.
    await run.proxy.app[history_key].append_planned(run.key, lambda state: [retire_fact(state, None)])
    asked = len(fake.summary_requests)
    await store.unlock(run.key, "compact", "another-replica")
    await run.engine.background.join(run.key)
    await run.nothing_recorded_after_the_undo()
    assert len(fake.summary_requests) == asked, "no summary was asked for: the undo came first"
    last = list(run.proxy.app[compactions_key].events(run.key))[-1]
    assert (last.trigger, last.outcome, last.detail) == ("background", "skipped", UNDONE)


# ---- the inspector's undo button, over HTTP (the browser's part: tests/test_ui_browser.py) --------------------------


async def test_the_inspector_undoes_only_for_a_signed_in_form_with_its_token(make_proxy, fake) -> None:
    proxy = await ui_proxy(make_proxy, min_retain_rounds=1)
    await agent_session(proxy, fake, "ui", 3)
    headers = {"Authorization": f"Bearer {UI_TOKEN}"}
    whole = await view_of_ui(proxy, "ui")
    assert (await (await proxy.post(f"/admin/sessions/{UI_TENANT}/ui/compact", headers=headers)).json())[
        "outcome"] == "ok"
    key = SessionKey(UI_TENANT, "ui")
    seq = (await read_log(proxy.app[store_key], key))[-1].seq
    action = session_path("ui") + "/uncompact"

    resp = await proxy.post(action, data={"checkpoint": str(seq)}, allow_redirects=False)
    assert resp.status == 401, "signed out: the sign-in form, nothing undone"
    await sign_in(proxy)
    html = await page(proxy, session_path("ui"))
    assert f'action="{action}"' in html and f'name="checkpoint" value="{seq}"' in html
    for forged in ({"checkpoint": str(seq)}, {"checkpoint": str(seq), "csrf_token": "forged"}):
        resp = await proxy.post(action, data=forged, allow_redirects=False)
        assert resp.status == 403
    for bad in ("9" * 5000, "-1", "\u0661", ""):  # int() would refuse the first with a ValueError: a 500
        resp = await proxy.post(action, data={"checkpoint": bad, "csrf_token": form_token(html)},
                                allow_redirects=False)
        assert resp.status == 400, bad
    assert (await read_log(proxy.app[store_key], key))[-1].seq == seq, "a refused form logs nothing"

    resp = await proxy.post(action, data={"checkpoint": str(seq), "csrf_token": form_token(html)},
                            allow_redirects=False)
    assert resp.status == 303 and resp.headers["Location"] == f"{session_path('ui')}#e{seq + 1}"
    assert (await read_log(proxy.app[store_key], key))[-1].extra == {"checkpoint_seq": seq}
    assert but_compacting_costs(await view_of_ui(proxy, "ui")) == but_compacting_costs(whole)
    html = await page(proxy, session_path("ui"))
    assert 'class="mark outcome-retired tier-summary"' in html and f"undone by entry #{seq + 1}" in html
    assert "1 checkpoints (1 undone)" in html
    assert 'form class="undo"' not in html
    resp = await proxy.post(action, data={"checkpoint": str(seq), "csrf_token": form_token(html)},
                            allow_redirects=False)
    assert resp.status == 409 and "undone already" in await resp.text()


# ---- the fold and the codec ---------------------------------------------------------------------------------------


def checkpoint_payload(retain: int) -> dict[str, Any]:
    return {"v": 3, "summary": f"s{retain}", "retain_start_idx": 0, "prefix_hash": "", "round_start_idx": None,
            "tokens_before": 10, "tokens_after": 5, "model": "m", "created_at": 0.0, "masked_until": 0}


async def test_a_retire_entry_is_stored_and_folded_on_each_backend(store: FactLog) -> None:
    key = SessionKey("t", "fold")
    facts = [NewFact(kind="message", index=0, source="client", message={"role": "user", "content": "hi"}, hash="h0"),
             NewFact(kind="checkpoint", index=0, source="proxy", extra={"checkpoint": checkpoint_payload(1)}),
             NewFact(kind="checkpoint", index=0, source="proxy", extra={"checkpoint": checkpoint_payload(2)}),
             NewFact(kind="retire", index=None, source="proxy", extra={"checkpoint_seq": 2}),
             NewFact(kind="retire", index=None, source="proxy", extra={"checkpoint_seq": 0}),  # not a checkpoint
             NewFact(kind="checkpoint", index=0, source="proxy", extra={"checkpoint": checkpoint_payload(3)}),
             NewFact(kind="retire", index=None, source="proxy", extra={"checkpoint_seq": 1})]
    await store.append(key, 0, facts, 1.0)
    stored = await store.read(key)
    assert [(f.kind, dict(f.extra)) for f in stored] == [(f.kind, dict(f.extra)) for f in facts]
    state = ConversationState()
    for fact in stored[:3]:
        state.apply(fact)
    assert state.checkpoint is not None and state.checkpoint["summary"] == "s2" and not state.undone
    state.apply(stored[3])
    assert state.checkpoint is not None and state.checkpoint["summary"] == "s1"
    assert state.checkpoint_seq_for(state.hashes) == 1 and state.retired == {2} and state.undone
    state.apply(stored[4])
    assert state.last_retire == 3, "a retire naming no live checkpoint changes nothing"
    state.apply(stored[5])
    assert state.checkpoint is not None and state.checkpoint["summary"] == "s3" and not state.undone
    state.apply(stored[6])
    assert state.checkpoint is None and state.retired == {1, 2, 5} and state.undone, "1 and the live ones after it"


# ---- lineages, and an undo during a foreground compaction ---------------------------------------------------------


async def test_undoing_one_lineages_compaction_leaves_the_other_lineages_checkpoint_in_force(make_proxy,
                                                                                           fake: FakeUpstream) -> None:
    proxy = await make_proxy(admin_token=Secret(TOKEN), min_retain_rounds=1)
    start = await rounds(proxy, fake, "two", [{"role": "system", "content": "You are helpful."}], 1, seed=21)
    first = await rounds(proxy, fake, "two", list(start), 4, seed=22)
    await compact(proxy, ADMIN_TENANT, "two")
    second = await rounds(proxy, fake, "two", list(start), 4, seed=23)  # a rewind: the second lineage
    in_force = await view_of(proxy, ADMIN_TENANT, "two")
    assert in_force["checkpoint"] is None, "the first lineage's checkpoint covers what this one does not hold"
    await compact(proxy, ADMIN_TENANT, "two")
    in_force = await view_of(proxy, ADMIN_TENANT, "two")
    facts = await read_log(proxy.app[store_key], SessionKey(ADMIN_TENANT, "two"))
    first_seq, _ = [f.seq for f in facts if f.kind == "checkpoint"]

    resp = await uncompact(proxy, ADMIN_TENANT, "two", {"checkpoint": first_seq})
    # The answer names what the first lineage's view uses now: the whole history.
    assert await resp.json() == {"retired": [first_seq], "entry": facts[-1].seq + 1, "checkpoint": None}
    assert await view_of(proxy, ADMIN_TENANT, "two") == in_force, "the other lineage's checkpoint stays in force"
    fake.script.append(Reply(content="On the second lineage."))
    await chat(proxy, [*second, {"role": "user", "content": "next"}], "two")
    assert fake.requests[-1]["messages"] == [*in_force["messages"], {"role": "user", "content": "next"}]
    fake.script.append(Reply(content="Back on the first."))
    await chat(proxy, [*first, {"role": "user", "content": "next"}], "two")
    assert fake.requests[-1]["messages"] == [*first, {"role": "user", "content": "next"}], "its own was undone"


async def foreground_compaction_held(make_proxy: Any, fake: FakeUpstream, window: int,
                                     session: str) -> tuple[Any, list[dict[str, Any]], dict[str, Any], Any]:
    """A proxy with a ``window``-token upstream, a session compacted once (that compaction's answer), and rounds
    until one passes the trigger and waits for its own summary, held at the gate: the proxy, the messages, the
    first compaction, and the waiting request."""
    fake.window = window
    proxy = await make_proxy(admin_token=Secret(TOKEN), min_retain_rounds=1, context_window=window, **MASKING_OFF)
    messages = await rounds(proxy, fake, session, [{"role": "system", "content": "You are helpful."}], 7, seed=31)
    early = await compact(proxy, ADMIN_TENANT, session)
    fake.summary_gate = asyncio.Event()
    rng = random.Random(32)
    while True:
        messages.append({"role": "user", "content": prose(rng, 220)})
        fake.script.append(Reply(content=prose(rng, 160)))
        fake.summary_asked.clear()
        request = asyncio.ensure_future(chat(proxy, messages, session))
        asked = asyncio.ensure_future(fake.summary_asked.wait())
        await asyncio.wait([request, asked], return_when=asyncio.FIRST_COMPLETED)
        if asked.done():
            return proxy, messages, early, request
        asked.cancel()
        messages.append((await (await request).json())["choices"][0]["message"])


async def test_an_undo_during_a_foreground_compaction_never_sends_a_view_over_the_window(make_proxy,
                                                                                        fake: FakeUpstream) -> None:
    window = 6_000
    proxy, messages, early, request = await foreground_compaction_held(make_proxy, fake, window, "fg")
    sent = len(fake.prompt_tokens)
    resp = await uncompact(proxy, ADMIN_TENANT, "fg")  # lands while the summary is held
    assert resp.status == 409 and (await error_of(resp))["code"] == "compaction_running"
    fake.summary_gate.set()
    answered = await request
    assert fake.refused == 0 and max(fake.prompt_tokens[sent:]) <= window
    assert answered.headers["X-Ctxproxy-Compacted"] == "proactive"
    messages.append((await answered.json())["choices"][0]["message"])

    # Undone once it is done, as far as the first compaction: the next view is the whole history, over the
    # window, and the next request compacts again rather than send it.
    resp = await uncompact(proxy, ADMIN_TENANT, "fg", {"checkpoint": early_seq(await read_log(
        proxy.app[store_key], SessionKey(ADMIN_TENANT, "fg")), early)})
    assert resp.status == 200 and (await resp.json())["checkpoint"] is None
    assert (await view_of(proxy, ADMIN_TENANT, "fg"))["estimate"] > window
    fake.script.append(Reply(content="Compacted again."))
    resp = await chat(proxy, [*messages, {"role": "user", "content": "go on"}], "fg")
    assert resp.headers["X-Ctxproxy-Compacted"] == "proactive"
    assert fake.refused == 0 and max(fake.prompt_tokens[sent:]) <= window


async def test_an_undo_past_the_lock_during_a_foreground_compaction_still_sends_a_view_that_fits(
        make_proxy, fake: FakeUpstream) -> None:
    window = 6_000
    proxy, _, _, request = await foreground_compaction_held(make_proxy, fake, window, "past")
    sent = len(fake.prompt_tokens)
    # A retire logged without the lock (its holder lost the lease to a store outage) overrules the compaction the
    # request waits for: the request compacts again on what it left, rather than send the whole history.
    key = SessionKey(ADMIN_TENANT, "past")
    await proxy.app[history_key].append_planned(key, lambda state: [retire_fact(state, None)])
    fake.summary_gate.set()
    answered = await request
    assert fake.refused == 0 and max(fake.prompt_tokens[sent:]) <= window
    assert answered.headers["X-Ctxproxy-Compacted"] == "proactive"
    facts = await read_log(proxy.app[store_key], key)
    kinds_after = [f.kind for f in facts[[f.kind for f in facts].index("retire"):]]
    assert kinds_after[:3] == ["retire", "summary", "checkpoint"], "made again after the undo"


def early_seq(facts: list[StoredFact], made: dict[str, Any]) -> int:
    """The seq of the checkpoint entry an admin compaction answered with."""
    return next(f.seq for f in facts if f.kind == "checkpoint" and f.extra["checkpoint"] == made["checkpoint"])


# ---- an undo right after a side call ------------------------------------------------------------------------------


async def side_call(proxy: Any, fake: FakeUpstream, session: str, messages: list[dict[str, Any]]) -> None:
    """A title call under the run's session: the run's first user message alone, on a branch of its own that the
    log's head moves to."""
    fake.script.append(Reply(content="A five-word title here."))
    await chat(proxy, messages[:2], session)


async def test_an_undo_right_after_a_side_call_reports_the_runs_view(make_proxy, fake: FakeUpstream) -> None:
    """Two compactions of the run, then a title call, which leaves the log's head on a branch of its own: the undo
    addresses the run's compaction, retiring the newest, and says the run's view uses the first checkpoint again
    (not what the title call's branch uses: none), and the run's next request gets that view."""
    proxy = await make_proxy(admin_token=Secret(TOKEN), min_retain_rounds=1)
    messages = await rounds(proxy, fake, "sides", [{"role": "system", "content": "You are helpful."}], 4, seed=32)
    await compact(proxy, ADMIN_TENANT, "sides")
    await rounds(proxy, fake, "sides", messages, 3, seed=33)
    once = await view_of(proxy, ADMIN_TENANT, "sides")
    await compact(proxy, ADMIN_TENANT, "sides")
    await side_call(proxy, fake, "sides", messages)
    facts = await read_log(proxy.app[store_key], SessionKey(ADMIN_TENANT, "sides"))
    first_seq, second_seq = [f.seq for f in facts if f.kind == "checkpoint"]

    resp = await uncompact(proxy, ADMIN_TENANT, "sides")
    assert await resp.json() == {"retired": [second_seq], "entry": facts[-1].seq + 1, "checkpoint": first_seq}
    fake.script.append(Reply(content="Where the first summary left us."))
    await chat(proxy, [*messages, {"role": "user", "content": "go on"}], "sides")
    assert fake.requests[-1]["messages"] == [*once["messages"], {"role": "user", "content": "go on"}]



async def tool_rounds(proxy: Any, fake: FakeUpstream, session: str, messages: list[dict[str, Any]], count: int,
                      seed: int) -> list[dict[str, Any]]:
    """``rounds``, each request offering a tool, as a real client's run does (its side calls offer none)."""
    rng = random.Random(seed)
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    for n in range(count):
        messages.append({"role": "user", "content": f"Round {seed}.{n}: " + prose(rng, 220)})
        fake.script.append(Reply(content=prose(rng, 160)))
        body = {"model": "gpt-4o", "messages": messages, "tools": tools}
        resp = await proxy.post("/v1/chat/completions", data=orjson.dumps(body),
                                headers={"Authorization": f"Bearer {TENANT_KEY}", "X-Session-Id": session})
        assert resp.status == 200, await resp.text()
        messages.append((await resp.json())["choices"][0]["message"])
    return messages


async def test_the_admin_view_and_compaction_right_after_a_side_call_address_the_run(make_proxy,
                                                                                     fake: FakeUpstream) -> None:
    """A run (offering tools) compacts, then a title call (offering none) leaves the log's head on a branch of its
    own: the session's view is still the run's projection (its checkpoint, its newest message), and a manual
    compaction compacts the run's lineage, whose next request then goes upstream with the new checkpoint."""
    proxy = await make_proxy(admin_token=Secret(TOKEN), min_retain_rounds=1)
    messages = await tool_rounds(proxy, fake, "runs", [{"role": "system", "content": "You are helpful."}], 4, seed=34)
    first = await compact(proxy, ADMIN_TENANT, "runs")
    await tool_rounds(proxy, fake, "runs", messages, 3, seed=35)
    before = await view_of(proxy, ADMIN_TENANT, "runs")
    await side_call(proxy, fake, "runs", messages)

    shown = await view_of(proxy, ADMIN_TENANT, "runs")
    assert shown["checkpoint"] == first["checkpoint"]
    assert shown["messages"] == before["messages"]
    second = await compact(proxy, ADMIN_TENANT, "runs")
    assert second["checkpoint"]["retain_start_idx"] > first["checkpoint"]["retain_start_idx"]
    twice = await view_of(proxy, ADMIN_TENANT, "runs")
    assert twice["checkpoint"] == second["checkpoint"]
    await tool_rounds(proxy, fake, "runs", messages, 1, seed=36)
    assert fake.requests[-1]["messages"] == [*twice["messages"], messages[-2]]
