"""The real aider, 30 user turns of file edits, through the proxy in a 16k window that does not hold them.

aider (tests/agents.py ``run_aider``: its history summary out of reach, so the proxy does the compacting) has three
files in its chat and is typed 30 messages, each asking the scripted model (tests/fakeaider.py) for a step that
adds a function to one of them with a SEARCH/REPLACE block and a few hundred tokens of explanation. aider sends
the whole of every file in its chat with every request, after its history, so its prompt grows by each answer and
by each function added: its last request is about 27,000 tokens. Through the recording tap and the proxy (the run
named by the URL's ``/s/SESSION`` prefix, as ``ctxproxy run aider`` names it), the strict fake refuses any prompt
over 16,000 tokens; the run must reach its last turn with every edit on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.agents import run_aider
from tests.fakeaider import FILES, FakeAider, file_of, function, start, user_message
from tests.fakescript import Script, final_text
from tests.prefixchanges import CHAT, PROXY_CAUSES, proxy_made, reported
from tests.test_agents_prefix import metrics, session_logs
from tests.test_agents_proxy import rig

STEPS = 30
WINDOW = 16_000
SESSION = "aider-edits"
#: 30 turns take aider about 15 s here; room for a busy machine.
TIMEOUT = 240.0


async def test_aider_edits_files_for_thirty_turns_through_the_proxy_in_a_16k_window(
        aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeAider(Script(steps=STEPS), WINDOW)
    parts = await rig(aiohttp_server, tmp_path, fake, WINDOW, "known")
    work = tmp_path / "work"
    work.mkdir()
    for name in FILES:
        (work / name).write_text(start(name))
    run = await run_aider(f"{parts.url}/s/{SESSION}/v1", tmp_path,
                          [user_message(k, STEPS) for k in range(1, STEPS + 1)], list(FILES), timeout=TIMEOUT)

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert final_text(STEPS) in run.stdout, run.stdout[-3000:]
    sent = parts.tap.exchanges
    assert [(x.path_qs, x.status) for x in sent] == [(f"/s/{SESSION}/v1/chat/completions", 200)] * STEPS
    client = [x.json() for x in sent]
    assert fake.window.count(*client[-1]["messages"]) > WINDOW, "the run does not fit the window"
    turns = fake.turns()
    assert [(t.status, (t.tokens or 0) <= WINDOW) for t in turns] == [(200, True)] * STEPS, "nothing over the window"
    assert {r.kind for r in fake.requests} == {"turn", "summary"}
    for name in FILES:
        functions = "".join(function(k) for k in range(1, STEPS + 1) if file_of(k) == name)
        assert (work / name).read_text() == functions + start(name)
    logs = await session_logs(parts.store)
    assert len(logs) == 1 and any(f.kind == "checkpoint" for f in logs[0]), "the proxy compacted on the way"
    # Issue #33: aider's files message is a whole read of each file it holds, so once compaction took it out of
    # the view, the summary item's files in hand carry the newest one's text. The last request went out before
    # step 30's edit: the file step 29 edited is as it is on disk now, and the model can still quote it.
    newest = (work / file_of(STEPS - 1)).read_text()
    assert file_of(STEPS) != file_of(STEPS - 1)
    assert any(newest in str(m.get("content")) for m in turns[-1].body["messages"]), "the newest file's text"

    # Issue #34 counts the prefix changes the proxy makes where the client's own request extends its previous one.
    # aider never does: it sends the files in its chat after its history, each time with their new text, so every
    # request rewrites its own prompt from the previous request's files message on, and each change is the
    # client's (cause "client" in ctxproxy_prefix_changes_total). None is left for the proxy to be charged with.
    changed = proxy_made([t.body for t in turns], client, CHAT)
    counted = reported(await metrics(parts.proxy))
    assert changed == [] and sum(counted.get(cause, 0) for cause in PROXY_CAUSES) == 0, counted
    assert counted.get("client") == STEPS - 1, counted
