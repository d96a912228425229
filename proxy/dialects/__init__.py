"""One module per wire API, each a ``Dialect`` (see ``base``): the engine sees only their answers."""

from __future__ import annotations

from proxy.dialects.base import Dialect
from proxy.dialects.chat import DIALECT as CHAT
from proxy.dialects.gemini import DIALECT as GEMINI
from proxy.dialects.messages import DIALECT as MESSAGES
from proxy.dialects.responses import DIALECT as RESPONSES

DIALECTS: dict[str, Dialect] = {d.name: d for d in (CHAT, RESPONSES, MESSAGES, GEMINI)}

__all__ = ["CHAT", "DIALECTS", "GEMINI", "MESSAGES", "RESPONSES", "Dialect"]
