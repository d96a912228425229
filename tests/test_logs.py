"""The log's handler (``proxy.logs.StderrHandler``): access lines in batches, nothing lost and nothing out of order.

Off a terminal, the per-request access lines are held and written together; any
other record writes them first, a daemon thread writes them within a second,
and a process that exits (SIGTERM included) writes what it still holds.
"""

from __future__ import annotations

import io
import logging
import threading
from pathlib import Path

import aiohttp

from proxy.logs import ACCESS_HELD_CHARS, ACCESS_LOGGER, StderrHandler, TextFormatter
from tests.fakeupstream import FakeUpstream
from tests.proxyproc import ProxyProcess


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Watched(io.StringIO):
    """Sets ``written`` at the first write: what the flushing thread is waited on with."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()

    def write(self, text: str) -> int:
        self.written.set()
        return super().write(text)


def _handler(stream: io.StringIO, flush_seconds: float = 3600.0) -> StderrHandler:
    handler = StderrHandler(stream, flush_seconds=flush_seconds)
    handler.setFormatter(TextFormatter("%(name)s: %(message)s"))
    return handler


def _record(name: str, message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, (), None)


def test_access_lines_wait_for_the_next_other_record_and_go_before_it() -> None:
    stream = io.StringIO()
    handler = _handler(stream)
    try:
        handler.handle(_record(ACCESS_LOGGER, "chat one"))
        handler.handle(_record(ACCESS_LOGGER, "chat two"))
        assert stream.getvalue() == ""
        handler.handle(_record("proxy.app", "the store came back", logging.WARNING))
        assert stream.getvalue().splitlines() == [f"{ACCESS_LOGGER}: chat one", f"{ACCESS_LOGGER}: chat two",
                                                  "proxy.app: the store came back"]
    finally:
        handler.close()


def test_held_access_lines_are_written_on_flush_and_once_enough_have_gathered() -> None:
    stream = io.StringIO()
    handler = _handler(stream)
    try:
        handler.handle(_record(ACCESS_LOGGER, "chat one"))
        handler.flush()  # what logging.shutdown does at exit
        assert stream.getvalue() == f"{ACCESS_LOGGER}: chat one\n"
        line = "x" * 1000
        for _ in range(ACCESS_HELD_CHARS // 1000 - 1):
            handler.handle(_record(ACCESS_LOGGER, line))
        before = stream.getvalue()
        handler.handle(_record(ACCESS_LOGGER, line))  # past ACCESS_HELD_CHARS with its prefix and newline
        assert len(stream.getvalue()) > len(before) == len(f"{ACCESS_LOGGER}: chat one\n")
    finally:
        handler.close()


def test_a_terminal_gets_each_access_line_at_once() -> None:
    stream = Terminal()
    handler = _handler(stream)
    try:
        assert not handler.batches
        handler.handle(_record(ACCESS_LOGGER, "chat one"))
        assert stream.getvalue() == f"{ACCESS_LOGGER}: chat one\n"
    finally:
        handler.close()


def test_held_access_lines_are_written_by_the_flushing_thread_with_nothing_else_logged() -> None:
    stream = Watched()
    handler = _handler(stream, flush_seconds=0.01)
    try:
        handler.handle(_record(ACCESS_LOGGER, "chat one"))
        assert stream.written.wait(timeout=10)
        assert stream.getvalue() == f"{ACCESS_LOGGER}: chat one\n"
    finally:
        handler.close()


async def test_a_proxy_stopped_with_sigterm_has_written_every_access_line(aiohttp_server, tmp_path: Path) -> None:
    """``ctxproxy serve`` as a user runs it, its stderr a file: every access line is in the file once it exited
    (written by the flushing thread or at exit, whichever came first)."""
    upstream = await aiohttp_server(FakeUpstream().app())
    proxy = ProxyProcess(str(upstream.make_url("/v1")), f"sqlite:///{tmp_path / 'facts.db'}", tmp_path)
    await proxy.start()
    try:
        async with aiohttp.ClientSession() as http:
            for session in ("first", "second"):
                body = {"model": "gpt-4o", "messages": [{"role": "user", "content": f"hello {session}"}]}
                async with http.post(f"{proxy.url}/v1/chat/completions", json=body,
                                     headers={"Authorization": "Bearer sk-logs", "X-Session-Id": session}) as resp:
                    assert resp.status == 200
    finally:
        proxy.stop()
    lines = [line for line in proxy.log_bytes().decode().splitlines() if f" {ACCESS_LOGGER}: " in line]
    assert [line.split(f" {ACCESS_LOGGER}: ")[1].split(" status=")[0] for line in lines] == [
        "chat session=first", "chat session=second"]
