"""Logging configuration, applied by the CLI only (library modules never configure logging)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, TextIO

import orjson
from aiohttp.http_exceptions import HttpProcessingError


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


class RedactRequestBytes(logging.Filter):
    """Withhold the text of aiohttp's HTTP parsing errors from every log record.

    Their messages quote the offending request bytes (a header line with a
    control character, the first bytes of an oversized line), which may be a
    key. ``proxy.server`` already logs such errors by class alone; this catches
    any other path, on any logger: a record whose exception (or one it was
    raised from) is such an error loses its traceback, and says only the
    error's class and status.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = _parsing_error(record.exc_info[1] if record.exc_info else None)
        if error is not None:
            record.msg = f"{record.getMessage()}: {type(error).__name__} ({error.code}), request bytes withheld"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


def _parsing_error(exc: BaseException | None) -> HttpProcessingError | None:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, HttpProcessingError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class TextFormatter(logging.Formatter):
    """The human line, ``asctime`` in UTC; the date and time to the second are formatted once per second, not for
    every record (the access line is one record per request, and ``strftime`` was a third of its formatting)."""

    _second: int | None = None
    _stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._second, self._stamp = second, time.strftime(self.default_time_format, time.gmtime(second))
        return f"{self._stamp},{int(record.msecs):03d}"


#: The per-request access line's logger (``proxy.http.frontdoor``).
ACCESS_LOGGER = "proxy.access"
#: Access lines are held at most this long, and up to this many characters, before they are written.
ACCESS_FLUSH_SECONDS = 1.0
ACCESS_HELD_CHARS = 64 * 1024


class StderrHandler(logging.StreamHandler[TextIO]):
    """The log's handler: stderr, with access lines written in batches when it is not a terminal.

    One write, a system call, for every proxied request cost 6 to 17 µs of the
    460 µs of CPU a small request takes at 16 concurrent fresh sessions (two
    A/B runs; issue 21). Access lines are therefore held, already formatted,
    until ``ACCESS_HELD_CHARS`` have gathered, ``ACCESS_FLUSH_SECONDS`` have
    passed (a daemon thread writes them), any other record is logged (they go
    before it, so the file keeps its order), or logging shuts down at exit.
    Envoy flushes its file access log the same way (every 10 s by default),
    nginx with ``access_log … buffer= flush=``. A terminal gets each line at
    once: somebody is reading it. A process killed outright loses at most the
    last second's access lines; the fact log and the metrics do not rest on them.
    """

    def __init__(self, stream: TextIO | None = None, flush_seconds: float = ACCESS_FLUSH_SECONDS) -> None:
        super().__init__(stream)
        self.flush_seconds = flush_seconds
        isatty = getattr(self.stream, "isatty", None)
        self.batches = not (callable(isatty) and isatty())
        self._held: list[str] = []
        self._held_chars = 0
        self._flusher: threading.Thread | None = None
        self._closed = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if not self.batches or record.name != ACCESS_LOGGER:
            self._write_held()  # first: the file keeps the records' order
            super().emit(record)
            return
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        self._held.append(line)
        self._held_chars += len(line)
        if self._held_chars >= ACCESS_HELD_CHARS:
            self.flush()
        elif self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_every, name="ctxproxy-log-flush", daemon=True)
            self._flusher.start()

    def flush(self) -> None:
        """Write the held access lines, then flush the stream."""
        self.acquire()
        try:
            self._write_held()
            super().flush()
        finally:
            self.release()

    def _write_held(self) -> None:
        if self._held:
            held, self._held, self._held_chars = "".join(self._held), [], 0
            self.stream.write(held)

    def close(self) -> None:
        self._closed.set()
        super().close()

    def _flush_every(self) -> None:
        while not self._closed.wait(self.flush_seconds):
            try:
                self.flush()
            except (OSError, ValueError):  # stderr closed or gone: nothing left to write to
                return


def default_log_config(level: str, fmt: str) -> dict[str, Any]:
    formatter: dict[str, Any] = (
        {"()": JsonFormatter}
        if fmt == "json"
        else {"()": TextFormatter, "format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    )
    logging.Formatter.converter = time.gmtime
    # Neither format prints the caller's file and line, the thread or the process: records skip finding them
    # (the logging HOWTO's "Optimization"), a fifth of the cost of the access line logged for every request.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "filters": {"redact": {"()": RedactRequestBytes}},
        "handlers": {"stderr": {"()": StderrHandler, "formatter": "default", "filters": ["redact"]}},
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {"aiohttp.access": {"level": "WARNING"}},
    }
