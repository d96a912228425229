"""Talking to the upstream: which headers cross, which credential goes, and how failures are named.

Hop-by-hop headers (RFC 9110 §7.6.1) never cross a proxy; ``Host`` and
``Content-Length`` are recomputed. The client's credential goes upstream as it
came unless ``--upstream-key`` is set. Then every credential header the client
sent is dropped (``CREDENTIAL_HEADERS``: with ``--client-keys`` any of them may
hold the key to this proxy) and the proxy's key goes alone: as ``api-key`` if
the client used that header (Azure OpenAI's style), else as ``Authorization:
Bearer``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.constants import CREDENTIAL_HEADERS
from proxy.errors import UpstreamTimeout, UpstreamUnreachable
from proxy.settings import Settings

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
        "TE", "Trailer", "Trailers", "Transfer-Encoding", "Upgrade",
    )
)
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length"}
_RESPONSE_DROP = HOP_BY_HOP | {"content-length", "date", "server"}

logger = logging.getLogger(__name__)

#: (flag, host) pairs whose 404 was explained in the log already: once per upstream and process is enough.
_EXPLAINED_404: set[tuple[str, str]] = set()


def _connection_listed(headers: Mapping[str, str]) -> set[str]:
    """Headers named in ``Connection`` are hop-by-hop too."""
    return {t.strip().lower() for t in headers.get("Connection", "").split(",") if t.strip()}


def request_headers(incoming: Mapping[str, str], settings: Settings, *, identity: bool,
                    anthropic: bool = False, gemini: bool = False) -> CIMultiDict[str]:
    """Headers to send upstream. ``identity`` asks for an uncompressed body the proxy can parse.

    Every header but hop-by-hop ones goes on (Claude Code's entitlements depend
    on ``anthropic-beta``, ``x-app``, ``user-agent``…). With a configured key
    for that upstream, every client credential header is dropped and the key
    goes alone: ``x-api-key`` to the Anthropic upstream (``anthropic``),
    ``x-goog-api-key`` to the Gemini upstream (``gemini``);
    ``api-key`` to an OpenAI upstream if the client used that header (Azure
    style), else ``Authorization: Bearer``.
    """
    drop = _REQUEST_DROP | _connection_listed(incoming)
    out: CIMultiDict[str] = CIMultiDict((k, v) for k, v in incoming.items() if k.lower() not in drop)
    own = settings.anthropic_upstream_key if anthropic else settings.gemini_upstream_key if gemini else None
    if anthropic or gemini:
        if own is not None:
            for name in CREDENTIAL_HEADERS:
                out.popall(name, None)
            out["x-api-key" if anthropic else "x-goog-api-key"] = str(own)
    elif settings.upstream_key is not None:
        azure_style = "api-key" in out
        for name in CREDENTIAL_HEADERS:
            out.popall(name, None)
        if azure_style:
            out["api-key"] = str(settings.upstream_key)
        else:
            out["Authorization"] = "Bearer " + settings.upstream_key
    if identity:
        out["Accept-Encoding"] = "identity"
    return out


def response_headers(upstream: CIMultiDictProxy[str], *, decoded: bool) -> CIMultiDict[str]:
    """Headers to relay to the client; ``decoded`` drops Content-Encoding for bodies aiohttp decompressed."""
    drop = _RESPONSE_DROP | _connection_listed(upstream)
    if decoded:
        drop = drop | {"content-encoding"}
    return CIMultiDict((k, v) for k, v in upstream.items() if k.lower() not in drop)


def client_timeout(settings: Settings) -> aiohttp.ClientTimeout:
    """No total limit (a long generation is fine) but a bound on silence between bytes."""
    return aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout, sock_read=settings.upstream_timeout)


class map_upstream_errors:  # lower case: used as a function, ``async with map_upstream_errors(url, settings):``
    """Name transport failures, with the upstream's host and the cause in words (a user reads them in the agent,
    where a Python class name says nothing): unreachable (502), not speaking HTTP (502) or silent past the
    timeout (504).

    aiohttp raises ``ClientResponseError`` when what came back is not an HTTP
    response it can read (a bad status line, malformed headers, a
    Content-Encoding it cannot decode); nothing of it reached the client yet.
    A class, not an async generator: it is entered on every proxied request,
    and the URL is only parsed when something failed.
    """

    __slots__ = ("settings", "url")

    def __init__(self, url: str | URL, settings: Settings) -> None:
        self.url = url
        self.settings = settings

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or not isinstance(exc, TimeoutError | aiohttp.ClientError | OSError):
            return
        host = upstream_host(self.url)
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            raise UpstreamTimeout(f"Could not connect to upstream {host} within {self.settings.connect_timeout:g} s."
                                  ) from exc
        if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
            raise UpstreamTimeout(f"Upstream {host} did not answer within {self.settings.upstream_timeout:g} s."
                                  ) from exc
        if isinstance(exc, aiohttp.ClientResponseError):
            raise UpstreamUnreachable(f"Upstream {host} answered with something that is not an HTTP response this "
                                      "proxy can read.", code="upstream_bad_response") from exc
        if isinstance(exc, aiohttp.ClientConnectorError):
            raise UpstreamUnreachable(f"Could not connect to upstream {host}: {os_error_words(exc.os_error)}.") from exc
        if isinstance(exc, aiohttp.ServerDisconnectedError):
            raise UpstreamUnreachable(f"Upstream {host} closed the connection without answering.") from exc
        if isinstance(exc, aiohttp.ClientPayloadError):
            raise UpstreamUnreachable(f"Upstream {host} broke off or garbled its answer.") from exc
        if isinstance(exc, aiohttp.InvalidURL):
            raise UpstreamUnreachable(f"The upstream URL {host or self.url} is not valid.") from exc
        if isinstance(exc, aiohttp.ClientConnectionError | OSError):
            raise UpstreamUnreachable(f"The connection to upstream {host} failed: {os_error_words(exc)}.") from exc


def upstream_host(url: str | URL) -> str:
    """``host`` or ``host:port`` of ``url`` as the user wrote it (no credentials), to name it in a message."""
    parsed = URL(url) if isinstance(url, str) else url
    host = parsed.raw_host or ""
    return f"{host}:{parsed.explicit_port}" if parsed.explicit_port is not None else host


def os_error_words(exc: BaseException) -> str:
    """An OS error in words, lower case (``connection refused``), not asyncio's "Connect call failed (...)"."""
    number = getattr(exc, "errno", None)
    if isinstance(number, int) and number > 0:
        return os.strerror(number).lower()
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc).lower() or "connection failed"


def explain_404(url: str | URL, *, anthropic: bool = False, gemini: bool = False) -> None:
    """One warning the first time an upstream answers 404 to a door's request: a base URL missing its ``/v1``
    (or with it twice) looks exactly like that, and the agent shows only the upstream's answer (relayed as it
    came) or "issue with the selected model". It names the URL the proxy called and the flag to check."""
    flag = "--anthropic-upstream" if anthropic else "--gemini-upstream" if gemini else "--upstream"
    parsed = URL(url) if isinstance(url, str) else url
    seen = (flag, upstream_host(parsed))
    if seen in _EXPLAINED_404:
        return
    _EXPLAINED_404.add(seen)
    called = parsed.with_user(None).with_query(None)
    logger.warning("upstream answered 404 to POST %s: if that path is wrong, check %s (its path prefix: /v1 "
                   "missing or doubled?)", called, flag)
