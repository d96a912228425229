"""Signed references: tokens the proxy hands to a client that name a checkpoint, and that only it can make.

Codex's remote compaction keeps, in place of its history, one ``compaction`` item whose ``encrypted_content``
the server wrote. The proxy writes a reference to its checkpoint there; when a later request carries it back,
the proxy reads the checkpoint and puts its summary text in the request before it goes upstream. So the token
must name the checkpoint (its session, its seq in the log and its prefix hash), and nobody else may forge or
alter one, nor use one of another tenant's: it is signed with HMAC-SHA256 under the server secret, over a
versioned payload and the tenant. The tenant is signed but not written into the token (it is a hash of the
client's credentials, and the request carrying the token names its own), so a token checked under another
tenant fails like a forged one.

Token: ``ctxproxy.v1.<payload>.<mac>``, both parts base64url without padding; the payload is canonical JSON
``{"h": prefix_hash, "q": seq, "s": session}``. The MAC covers the payload exactly as written and is compared
as written (in constant time), so a token differing by one character fails, and a payload is only ever read
after its MAC checked out.

The secret is ``--secret`` (``CTXPROXY_SECRET``) when set, else one generated at the first start and kept in
the store (``FactLog.secret``), so every process and replica on the store signs alike and references survive a
restart.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

import orjson

from proxy.store.base import FactLog

PREFIX = "ctxproxy"
VERSION = 1
#: Longer tokens are refused unread: a reference is about 150 characters.
MAX_TOKEN_CHARS = 4096
_DOMAIN = "ctxproxy-reference"


@dataclass(frozen=True, slots=True)
class Reference:
    """What a verified token names: the checkpoint entry at ``seq`` of ``tenant``'s ``session``, which covers the
    prefix ``prefix_hash``."""

    tenant: str
    session: str
    seq: int
    prefix_hash: str


async def server_secret(configured: str | None, store: FactLog) -> bytes:
    """The signing key: ``--secret`` when configured, else the store's (created on the first call)."""
    if configured:
        return configured.encode()
    return await store.secret()


class ServerSecret:
    """The signing key, fetched when first needed and kept: a store that is down at start delays it, no more."""

    def __init__(self, configured: str | None, store: FactLog) -> None:
        self._configured = configured
        self._store = store
        self._value: bytes | None = None

    async def get(self) -> bytes:
        """The key; ``StoreError`` while the store cannot give it (nothing is signed or checked meanwhile)."""
        if self._value is None:
            self._value = await server_secret(self._configured, self._store)
        return self._value


def is_reference(token: str) -> bool:
    """Whether ``token`` claims to be one of ours (as opposed to an upstream's own encrypted content)."""
    return token.startswith(PREFIX + ".")


def sign(secret: bytes, tenant: str, session: str, seq: int, prefix_hash: str) -> str:
    """A token naming the checkpoint at ``seq`` (covering ``prefix_hash``) of ``tenant``'s ``session``."""
    payload = _b64(orjson.dumps({"h": prefix_hash, "q": seq, "s": session}, option=orjson.OPT_SORT_KEYS))
    return f"{PREFIX}.v{VERSION}.{payload}.{_b64(_mac(secret, VERSION, tenant, payload))}"


def verify(secret: bytes, token: str, tenant: str) -> Reference | None:
    """The reference ``token`` names, when this server signed it for ``tenant``; None otherwise (forged, altered,
    another tenant's, another secret's, an unknown version, or not a token at all)."""
    if len(token) > MAX_TOKEN_CHARS:
        return None
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != PREFIX or parts[1] != f"v{VERSION}":
        return None
    _, _, payload, mac = parts
    if not hmac.compare_digest(mac.encode(), _b64(_mac(secret, VERSION, tenant, payload)).encode()):
        return None
    raw = _unb64(payload)
    try:
        fields = orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        return None
    if not isinstance(fields, dict):
        return None
    session, seq, prefix_hash = fields.get("s"), fields.get("q"), fields.get("h")
    if not isinstance(session, str) or not isinstance(prefix_hash, str):
        return None
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        return None
    return Reference(tenant, session, seq, prefix_hash)


def _mac(secret: bytes, version: int, tenant: str, payload: str) -> bytes:
    message = orjson.dumps([_DOMAIN, version, tenant, payload])
    return hmac.new(secret, message, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
