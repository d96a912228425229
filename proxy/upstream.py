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

from collections.abc import Mapping

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

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


class map_upstream_errors:  # lower case: used as a function, ``async with map_upstream_errors():``
    """Name transport failures: unreachable (502), not speaking HTTP (502) or silent past the timeout (504).

    aiohttp raises ``ClientResponseError`` when what came back is not an HTTP
    response it can read (a bad status line, malformed headers, a
    Content-Encoding it cannot decode); nothing of it reached the client yet.
    A class, not an async generator: it is entered on every proxied request.
    """

    __slots__ = ()

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
            raise UpstreamTimeout("The upstream did not answer in time.") from exc
        if isinstance(exc, aiohttp.ClientResponseError):
            raise UpstreamUnreachable("The upstream's answer is not an HTTP response this proxy can read.",
                                      code="upstream_bad_response") from exc
        if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | aiohttp.InvalidURL | OSError):
            raise UpstreamUnreachable(f"The upstream could not be reached: {type(exc).__name__}.") from exc
