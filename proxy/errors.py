"""Every error the proxy raises on purpose, and OpenAI's error shape (the one every door but a few uses).

    ProxyError
    ├── BadRequest            malformed input from the client (4xx)
    │   ├── PayloadTooLarge
    │   ├── RequestTimeout
    │   ├── Unauthorized
    │   ├── TooManyAttempts
    │   ├── UpgradeRequired
    │   └── NothingToUndo
    │       └── CompactionRunning
    ├── UpstreamError
    │   ├── UpstreamTimeout
    │   └── UpstreamUnreachable
    ├── StoreError
    │   ├── StoreUnavailable
    │   ├── UnencodableFact
    │   └── ConflictError
    └── BudgetExceeded

Handlers raise; one middleware (`proxy.http.middleware`) renders, in the shape
of the door the request came to (``Dialect.error_body``). Upstream HTTP errors
are not exceptions: they are relayed byte for byte.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType


class ProxyError(Exception):
    """Base of everything the proxy raises deliberately."""

    status = 500
    type = "proxy_error"
    code: str | None = None
    #: Response headers the error comes with.
    headers: Mapping[str, str] = MappingProxyType({})

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


def openai_error(message: str, *, type: str, code: str | None, param: str | None) -> dict[str, object]:
    """OpenAI's error body: what the openai SDK and its clients read (``error.message``, the status)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class BadRequest(ProxyError):
    """The client sent something the proxy cannot accept."""

    status = 400
    type = "invalid_request_error"


class PayloadTooLarge(BadRequest):
    """The request body is over the configured limit."""

    status = 413
    code = "request_too_large"


class RequestTimeout(BadRequest):
    """The request body did not arrive within ``--client-timeout``."""

    status = 408
    code = "request_timeout"


class Unauthorized(BadRequest):
    """Missing or unknown client key, or a wrong admin token."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class TooManyAttempts(BadRequest):
    """Too many failed admin tokens from one address, or from many (``proxy.throttle``): it may try again after
    ``Retry-After`` seconds."""

    status = 429
    type = "rate_limit_error"
    code = "too_many_failed_attempts"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(max(1, math.ceil(retry_after)))}


class UpgradeRequired(BadRequest):
    """The client asked for a protocol the proxy does not speak (a websocket)."""

    status = 426


class NothingToUndo(BadRequest):
    """An undo of a compaction names no live checkpoint: none left, not a checkpoint, or one undone already."""

    status = 409
    code = "nothing_to_undo"


class CompactionRunning(NothingToUndo):
    """An undo that came while a compaction of the session ran, and was not done: to be tried again after it."""

    code = "compaction_running"


class UpstreamError(ProxyError):
    """The upstream could not be reached or did not answer in time."""

    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer within the configured timeout."""

    status = 504
    code = "upstream_timeout"


class UpstreamUnreachable(UpstreamError):
    """Connection refused, reset or DNS failure."""


class StoreError(ProxyError):
    """The fact log failed; callers keep serving and count it."""

    status = 503
    type = "store_error"


class StoreUnavailable(StoreError):
    """The backend did not answer (connection refused, timeout, disk error)."""


class UnencodableFact(StoreError):
    """A fact the log cannot write (nested deeper than orjson writes): retrying it can never succeed."""


class ConflictError(StoreError):
    """Optimistic concurrency: the log moved past the sequence number the writer expected."""

    status = 409

    def __init__(self, message: str, *, actual_seq: int) -> None:
        super().__init__(message)
        self.actual_seq = actual_seq


class BudgetExceeded(ProxyError):
    """No projection fits the window, even after compaction."""

    status = 400
    type = "invalid_request_error"
    code = "context_length_exceeded"
