"""Logging configuration, applied by the CLI only (library modules never configure logging)."""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers.

    A record may carry structured fields as ``extra={"fields": {...}}`` (the
    per-request access line does: session, tenant hash, status, view tokens,
    compaction, upstream and overhead milliseconds); they become top-level keys
    beside ``ts``, ``level``, ``logger`` and ``message``, and never replace those.
    The text format ignores them and prints the human line alone.
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if k not in out})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


def default_log_config(level: str, fmt: str) -> dict[str, Any]:
    formatter: dict[str, Any] = (
        {"()": JsonFormatter}
        if fmt == "json"
        else {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    )
    logging.Formatter.converter = time.gmtime
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "default"}},
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {"aiohttp.access": {"level": "WARNING"}},
    }
