"""What ``serve`` (and ``run``'s embedded proxy) can tell is wrong before it listens, each said in one line.

A mistake found only while serving costs a user a traceback to read (a port in
use, a store that cannot be opened) or, worse, nothing at all: an upstream URL
without a scheme made every request a 500, an unreachable Redis served every
request unlogged. Found at start-up, each is one line on stderr naming the
problem and the fix, and exit status 2 (click's status for a usage error).
An upstream path that is only suspicious (an OpenAI-style upstream without
``/v1``; an Anthropic or Gemini upstream with the version the proxy adds
itself) is a warning, not a refusal: vLLM, gateways and Azure use other
prefixes. These checks run in the commands, not in ``create_app``: a store that
goes away while serving is an outage the proxy rides out, not a mistake.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import click

from proxy.errors import StoreError
from proxy.settings import Settings, redacted
from proxy.store import open_store, sqlite_path
from proxy.upstream import os_error_words

logger = logging.getLogger(__name__)

#: Seconds the store has to answer a ping at start-up (a DNS name that resolves nowhere can take longer).
STORE_PING_SECONDS = 5.0
#: A path segment naming an API version: ``v1``, ``v1beta``, ``v4``…
_VERSION = re.compile(r"^v\d+[a-z0-9]*$")


class StartupError(click.ClickException):
    """A mistake start-up cannot go on with: click prints ``Error: <message>`` (one line) and exits 2."""

    exit_code = 2


@dataclass(frozen=True)
class Upstream:
    """One configured upstream: the flag that sets it, its URL and whether the proxy adds the version itself."""

    flag: str
    url: str
    #: Anthropic and Gemini upstreams are given without the version: the request's path carries it.
    versioned_by_path: bool


def upstreams(settings: Settings) -> list[Upstream]:
    return [Upstream("--upstream", settings.upstream, False),
            Upstream("--anthropic-upstream", settings.anthropic_upstream, True),
            Upstream("--gemini-upstream", settings.gemini_upstream, True)]


def refusal(upstream: Upstream) -> str | None:
    """Why ``upstream`` cannot be called at all (no scheme, not HTTP, no host), with the URL that would do."""
    url = upstream.url
    parts = urlsplit(url)
    if "://" not in url:
        return f"{upstream.flag} {url!r} has no scheme: write http://{url} (or https://…)"
    if parts.scheme.lower() not in {"http", "https"}:
        return f"{upstream.flag} {url!r} is not an http:// or https:// URL: the proxy speaks HTTP to its upstreams"
    if not parts.hostname:
        return f"{upstream.flag} {url!r} names no host: write http://HOST:PORT/…"
    return None


def suspicion(upstream: Upstream) -> str | None:
    """Why ``upstream``'s path looks wrong for its kind, with the likely fix; None when it looks right."""
    parts = urlsplit(upstream.url)
    segments = [s for s in parts.path.split("/") if s]
    root = f"{parts.scheme}://{parts.netloc}"
    if upstream.versioned_by_path:
        if segments and _VERSION.match(segments[-1]):
            fixed = root + "/" + "/".join(segments[:-1]) if segments[:-1] else root
            return (f"{upstream.flag} {upstream.url} ends with /{segments[-1]}, which the proxy adds itself "
                    f"(requests would go to …/{segments[-1]}/{segments[-1]}/…): did you mean {fixed}?")
        return None
    if "/v1/v1" in "/" + "/".join(segments) + "/":
        fixed = upstream.url.rstrip("/").replace("/v1/v1", "/v1")
        return f"{upstream.flag} {upstream.url} has /v1 twice: did you mean {fixed}?"
    if not any(_VERSION.match(s) for s in segments):
        return (f"{upstream.flag} {upstream.url} has no version in its path: most OpenAI-compatible servers want "
                f"{upstream.url.rstrip('/')}/v1")
    return None


def check_upstreams(settings: Settings) -> None:
    """Refuse an upstream that cannot be called; warn, one line each, about one whose path looks wrong."""
    for upstream in upstreams(settings):
        problem = refusal(upstream)
        if problem is not None:
            raise StartupError(problem)
        warning = suspicion(upstream)
        if warning is not None:
            logger.warning("%s", warning)


async def store_problem(url: str) -> str | None:
    """Why the store ``url`` names cannot be used (its cause in words), or None when it opens, answers and can be
    written. A store whose scheme is unknown raises ``StartupError``: no flag makes it usable."""
    try:
        store = await open_store(url)
    except ValueError:
        raise StartupError(f"--store {redacted(url)!r} is not a store URL: use sqlite:///path/to/facts.db, "
                           "redis://host:port/db or rediss://… (?cluster=1 for Redis Cluster)") from None
    except (StoreError, OSError) as exc:
        return _why(exc)
    try:
        async with asyncio.timeout(STORE_PING_SECONDS):
            await store.ping()
    except TimeoutError:
        return f"no answer within {STORE_PING_SECONDS:g} s"
    except (StoreError, OSError) as exc:
        return _why(exc)
    finally:
        await store.aclose()
    if url.startswith("sqlite:"):
        path = sqlite_path(url)
        if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
            return f"{path} is read-only for this user"
    return None


def _why(exc: BaseException) -> str:
    """The root of a store failure in words: the OS error under it (``connection refused``, ``permission denied:
    /var/lib/x``), else the innermost error's text (SQLite's ``unable to open database file``)."""
    innermost = exc
    for _ in range(10):  # a chain of causes is short; a cycle is not followed
        if isinstance(innermost, OSError) and (innermost.errno or innermost.strerror):
            words = os_error_words(innermost)
            return f"{words}: {innermost.filename}" if innermost.filename else words
        deeper = innermost.__cause__ or innermost.__context__
        if deeper is None:
            break
        innermost = deeper
    return str(innermost) or type(innermost).__name__


def check_store(settings: Settings) -> None:
    """Refuse to start on a store that cannot be used; with ``--store-optional``, a Redis that does not answer
    is a loud warning instead (requests are served, but neither logged nor compacted until it answers)."""
    problem = asyncio.run(store_problem(settings.store))
    if problem is None:
        return
    shown = redacted(settings.store)
    if settings.store.startswith("sqlite:"):
        raise StartupError(f"cannot open the store {shown} ({problem}): make its directory writable or name another "
                           "with --store, e.g. --store sqlite:///tmp/ctxproxy.db")
    if not settings.store_optional:
        raise StartupError(f"the store {shown} does not answer ({problem}): start it or fix --store, or pass "
                           "--store-optional to serve unlogged until it answers")
    logger.warning("the store %s does not answer (%s): requests are NOT logged or compacted until it does "
                   "(--store-optional)", shown, problem)


def cannot_listen(settings: Settings, exc: OSError) -> StartupError:
    """The one-line error for a socket that could not be bound, with the flag that fixes it."""
    where = f"port {settings.port} on {settings.host}"
    if exc.errno == errno.EADDRINUSE:
        return StartupError(f"{where} is in use: stop the other process or pass --port N")
    if exc.errno == errno.EACCES:
        return StartupError(f"{where} needs privileges this user lacks: pass --port N above 1023")
    cause = (exc.strerror or str(exc)).lower()
    return StartupError(f"cannot listen on {where} ({cause}): pass a --host this machine has, or another --port")


def check_port(settings: Settings) -> None:
    """Bind ``settings.host:settings.port`` once, as each of ``serve --workers N``'s workers will (address and port
    reuse), and let go: a port in use is then the parent's one line, not N workers' tracebacks."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            probe.bind(address)
    except OSError as exc:
        raise cannot_listen(settings, exc) from None
