"""Each item is checked once, where it is new to its conversation (``Dialect.checked_hash``): what a request shares
with the conversation's previous request was checked then; anything that differs from it is checked again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.app import create_app
from proxy.context.log.history import REUSE_FROM_BYTES
from proxy.dialects.chat import ChatDialect
from proxy.settings import Settings
from tests.test_errors import _closed_port

#: Enough text that a request is kept to compare the next one with (``HistoryManager.hashes_for``).
LONG = "Read the repository and fix the failing tests. " * (REUSE_FROM_BYTES // 40)


def chat(items: list[Any]) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"model": "m", "messages": items}


def messages(items: list[Any]) -> tuple[str, dict[str, Any]]:
    return "/v1/messages", {"model": "m", "max_tokens": 5, "messages": items}


def gemini(items: list[Any]) -> tuple[str, dict[str, Any]]:
    return "/v1beta/models/gemini-test:generateContent", {"contents": items}


# Each door's conversation, an item in it (not the first), and that item made malformed in a way its hash does not
# see: a check skipped for an item with the same hash, or at the same place, would let it through.
DOORS = [
    (chat, [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": LONG},
            {"role": "assistant", "content": "Looking."}, {"role": "user", "content": "Go on."}],
     2, {"role": "assistant", "content": "Looking.", "tool_calls": {}}, "messages[2].tool_calls"),
    (messages, [{"role": "user", "content": LONG}, {"role": "assistant", "content": []},
                {"role": "user", "content": "Go on."}],
     1, {"role": "assistant", "content": 5}, "messages[1].content"),
    (gemini, [{"role": "user", "parts": [{"text": LONG}]}, {"role": "model", "parts": [{"text": "Looking."}]},
              {"role": "user", "parts": [{"text": "Go on."}]}],
     2, {"role": 0, "parts": [{"text": "Go on."}]}, "contents[2].role"),
]


async def closed_proxy(aiohttp_client: Any, tmp_path: Path) -> Any:
    """The proxy with every upstream unreachable: a request it takes is a 502, one it refuses a 400."""
    closed = f"http://127.0.0.1:{_closed_port()}"
    return await aiohttp_client(create_app(Settings(upstream=closed + "/v1", anthropic_upstream=closed,
                                                    gemini_upstream=closed, store=f"sqlite:///{tmp_path}/f.db")))


@pytest.mark.parametrize(("door", "items", "index", "malformed", "param"), DOORS, ids=["chat", "messages", "gemini"])
async def test_an_item_made_malformed_after_a_valid_request_is_a_400(
        aiohttp_client: Any, tmp_path: Path, door: Any, items: list[Any], index: int, malformed: Any,
        param: str) -> None:
    proxy = await closed_proxy(aiohttp_client, tmp_path)
    headers = {"X-Session-Id": "checked"}

    async def send(sent: list[Any]) -> Any:
        path, body = door(sent)
        return await proxy.post(path, data=orjson.dumps(body), headers=headers)

    assert (await send(items)).status == 502, "taken, and kept to compare the next request with"
    edited = [*items[:index], malformed, *items[index + 1:]]
    refused = await send(edited)
    assert refused.status == 400, await refused.text()
    assert param in await refused.text()
    assert (await send([*items, items[-1]])).status == 502, "the valid conversation is still taken"


async def test_a_request_checks_only_the_items_new_to_its_conversation(
        aiohttp_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[Any] = []
    item_problem = ChatDialect.item_problem

    def spy(self: ChatDialect, item: Any) -> Any:
        checked.append(item)
        return item_problem(self, item)

    monkeypatch.setattr(ChatDialect, "item_problem", spy)
    proxy = await closed_proxy(aiohttp_client, tmp_path)
    history = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": LONG}]
    for step in range(20):
        call = {"id": f"call_{step}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        history += [{"role": "assistant", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"call_{step}", "content": f"output {step}"}]

    async def send(sent: list[Any]) -> list[Any]:
        checked.clear()
        resp = await proxy.post("/v1/chat/completions", data=orjson.dumps({"model": "m", "messages": sent}),
                                headers={"X-Session-Id": "spied"})
        assert resp.status == 502, await resp.text()
        return list(checked)

    assert len(await send(history)) > len(history), "a first request checks every item"
    step = [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Thanks."}]
    # The first item is hashed for every request (it names the previous request's place); then only what is new.
    assert await send([*history, *step]) == [history[0], *step]
    edited = [*history[:5], {**history[5], "content": "output 1 "}, *history[6:], *step]
    assert await send(edited) == [history[0], *edited[5:]], "from the first item that differs, every item"
