"""The demo's scripted agent: a Chat Completions client that runs each tool call the model makes.

It keeps the whole conversation, as a real agent does, and sends it all on
every turn; the proxy decides what the model sees. Tool calls run against the
in-memory ``Workspace``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from proxy.demo.model import MODEL
from proxy.demo.script import SYSTEM, TASK, Workspace
from proxy.demo.tools import TOOLS

#: More turns than the script has steps: a model that never stops is stopped.
MAX_TURNS = 100


@dataclass
class Turn:
    """One request as the agent saw it: the proxy's compaction header and its view estimate."""

    compacted: str
    view_tokens: int


@dataclass
class ScriptedAgent:
    url: str
    key: str
    workspace: Workspace = field(default_factory=Workspace)
    messages: list[dict[str, Any]] = field(default_factory=lambda: [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}])
    turns: list[Turn] = field(default_factory=list)

    async def run(self, client: aiohttp.ClientSession) -> str:
        """Turns until the model answers in text; that text."""
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        for _ in range(MAX_TURNS):
            body = {"model": MODEL, "messages": self.messages, "tools": TOOLS}
            async with client.post(self.url, data=orjson.dumps(body), headers=headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"the proxy answered {resp.status}: {raw[:300]!r}")
                self.turns.append(Turn(resp.headers.get("X-Ctxproxy-Compacted", "none"),
                                       int(resp.headers.get("X-Ctxproxy-View-Tokens", "0"))))
            message = orjson.loads(raw)["choices"][0]["message"]
            self.messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                return str(message.get("content") or "")
            for call in calls:
                function = call["function"]
                output = self.workspace.run(function["name"], orjson.loads(function["arguments"]))
                self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        raise RuntimeError(f"the scripted model did not finish in {MAX_TURNS} turns")
