"""The user's own words: carried verbatim past every summary, within their budget, whatever the summariser keeps."""

from __future__ import annotations

import random
from typing import Any

import orjson

from proxy.context.keep.userwords import FOLDED, HEADING, LONG_TOKENS, carry, render
from proxy.context.view.budget import ContextBudgetPolicy
from proxy.context.view.clipping import CLIP_MARKER
from proxy.dialects import CHAT, MESSAGES
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.fakeupstream import FakeUpstream, Reply
from tests.proxyfixtures import read_log
from tests.test_compaction_e2e import prose

MEASURE = ContextBudgetPolicy()


def conversation(texts: list[str]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for text in texts:
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
    return messages


def test_newly_summarised_user_messages_are_carried_but_not_the_reinserted_opener() -> None:
    messages = conversation(["use tabs", "no network", "python 3.11 only"])
    first = carry(CHAT, messages, (), start=1, end=5, opener=3, previous_opener=None, seqs=range(10, 20),
                  measure=MEASURE, budget=1000)
    assert first == ((1, 11, MEASURE.text_tokens("use tabs"), "use tabs", 1),), "the opener is still in view"
    second = carry(CHAT, messages, first, start=5, end=7, opener=None, previous_opener=3, seqs=range(10, 20),
                   measure=MEASURE, budget=1000)
    assert [e[3] for e in second] == ["use tabs", "no network", "python 3.11 only"], "the old opener joins, in order"
    assert render(second) == (f"{HEADING}\n\n[log entry 11]\nuse tabs\n\n[log entry 13]\nno network\n\n"
                              "[log entry 15]\npython 3.11 only")


def test_aiders_files_message_is_not_the_users_words() -> None:
    """aider writes it (its files' text, which the files in hand carry); the user's own message beside it stays."""
    files = ("I have *added these files to the chat* so you can go ahead and edit them.\n\n*Trust this message as the "
             "true contents of these files!*\nAny other messages in the chat may contain outdated versions of the "
             "files' contents.\n\napp.py\n```\nx = 1\n```\n")
    messages = conversation([files, "add a test"])
    carried = carry(CHAT, messages, (), start=1, end=5, opener=None, previous_opener=None, seqs=range(10, 20),
                    measure=MEASURE, budget=1000)
    assert [e[3] for e in carried] == ["add a test"]


def test_only_the_newest_environment_snapshot_of_each_kind_is_carried() -> None:
    """A client's environment state, resent when it changes (gjc's workspace tree, Codex's environment context), is
    superseded by the next of its kind, carried or still in view; a message that mixes it with words is words."""
    def tree(n: int) -> str:
        return (f"<system-reminder>\n<workspace-tree>\n- src/ ({n} files)\n</workspace-tree>\nToday is 2026-07-14, "
                "and the current working directory is '~/tmp'.\n</system-reminder>")

    def env(cwd: str) -> str:
        return f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>bash</shell>\n</environment_context>"

    mixed = env("/b") + "\nand keep it short"
    messages = conversation([env("/a"), tree(1), "use tabs", tree(2), mixed, tree(3), env("/c"), "next"])
    first = carry(CHAT, messages, (), start=1, end=9, opener=None, previous_opener=None, seqs=range(10, 30),
                  measure=MEASURE, budget=1000)
    assert [e[3] for e in first] == ["use tabs"], "each superseded by a newer one of its kind still in view"
    second = carry(CHAT, messages, first, start=9, end=15, opener=None, previous_opener=None, seqs=range(10, 30),
                   measure=MEASURE, budget=1000)
    assert [e[3] for e in second] == ["use tabs", mixed, tree(3), env("/c")]


def test_tool_results_are_not_user_words() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "fix it"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "secret.txt"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "done"}]}]
    carried = carry(MESSAGES, messages, (), start=0, end=4, opener=None, previous_opener=None, seqs=[], measure=MEASURE,
                    budget=1000)
    assert [(e[0], e[1], e[3]) for e in carried] == [(0, -1, "fix it")]
    assert render(carried).endswith("[message index 0]\nfix it"), "named by its index until it is logged"


def test_over_the_budget_the_oldest_long_messages_are_clipped_first() -> None:
    rng = random.Random(2)
    long_old, long_new = prose(rng, 600), prose(rng, 600)
    messages = conversation([long_old, "keep me", long_new, "and me"])
    carried = carry(CHAT, messages, (), start=1, end=9, opener=None, previous_opener=None, seqs=range(100),
                    measure=MEASURE, budget=800)
    texts = [e[3] for e in carried]
    assert texts[1] == "keep me" and texts[3] == "and me", "short messages stay whole"
    assert texts[2] == long_new, "the newer long one stays whole while clipping the older is enough"
    assert texts[0] != long_old and "full text in the fact log, log entry 1 …]" in texts[0]
    assert texts[0].startswith(long_old[:100]) and texts[0].endswith(long_old[-100:]), "head and tail kept"
    assert sum(e[2] + 8 for e in carried) <= 800


def test_a_message_clipped_again_starts_from_its_original() -> None:
    rng = random.Random(3)
    messages = conversation([prose(rng, 600), prose(rng, 600), prose(rng, 600)])
    first = carry(CHAT, messages, (), start=1, end=3, opener=None, previous_opener=None, seqs=range(100),
                  measure=MEASURE, budget=400)
    second = carry(CHAT, messages, first, start=3, end=7, opener=None, previous_opener=None, seqs=range(100),
                   measure=MEASURE, budget=400)
    assert second[0][3].count("elided by ctxproxy") == 1
    assert second[0][2] <= LONG_TOKENS + 40
    assert sum(e[2] + 8 for e in second) <= 400


def test_thousands_of_messages_fold_the_oldest_into_one_line() -> None:
    messages = conversation([f"note {i}" for i in range(3000)])
    carried = carry(CHAT, messages, (), start=1, end=len(messages), opener=None, previous_opener=None,
                    seqs=range(len(messages)), measure=MEASURE, budget=2000)
    assert carried[0][4] > 1 and carried[0][3].startswith("[… ") and "from log entry 1 on" in carried[0][3]
    assert carried[0][4] + len(carried) - 1 == 3000, "every message is either shown or counted in the fold"
    assert carried[-1][3] == "note 2999"
    assert sum(e[2] + 8 for e in carried) <= 2000
    assert FOLDED.split("{")[0] in render(carried)
    assert CLIP_MARKER.split("{")[0] not in carried[-1][3]


CONSTRAINTS = [f"Constraint {i}: every file you create in step {i} must start with the header 'owner: team-{i}'"
               f" and never import module_{i * 7}." for i in range(30)]


async def test_thirty_constraints_survive_many_compactions_by_a_summariser_that_ignores_them(
        make_proxy: Any, fake: FakeUpstream) -> None:
    """The fake's summariser keeps FACT-… tokens only: the constraints are lost to it, never to the view."""
    window = 16_000
    proxy = await make_proxy(context_window=window, min_retain_rounds=2)
    fake.window = window
    rng = random.Random(30)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent."}]
    for constraint in CONSTRAINTS:
        messages.append({"role": "user", "content": constraint})
        # honest usage: replies of 1,300 words (about 1,300 tokens) compact only three times in 30 rounds
        fake.script.append(Reply(content=prose(rng, 2200)))
        resp = await proxy.post("/v1/chat/completions", data=orjson.dumps({"model": "m", "messages": messages}),
                                headers={"Authorization": "Bearer sk-words", "X-Session-Id": "words"})
        assert resp.status == 200
        messages.append((await resp.json())["choices"][0]["message"])

    facts = await read_log(proxy.app[store_key], SessionKey(tenant_of("sk-words"), "words"))
    summaries = [f for f in facts if f.kind == "summary"]
    assert len(summaries) >= 4, "compacted many times"
    assert not any("Constraint" in f.extra["checkpoint"]["summary"] for f in facts if f.kind == "checkpoint"), (
        "the summariser dropped every one of them")
    last_view = "\n".join(str(m["content"]) for m in fake.requests[-1]["messages"])
    for constraint in CONSTRAINTS:
        assert constraint in last_view, constraint
    assert fake.refused == 0
