"""Shared type aliases."""

from __future__ import annotations

from typing import Any

#: One Chat Completions message as the client or upstream sent it (parsed JSON object).
Message = dict[str, Any]
JSON = Any
