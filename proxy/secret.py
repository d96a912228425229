"""References: tokens the proxy hands to a client that carry a log entry's content, and that only it can make.

Codex's remote compaction keeps, in place of its history, one ``compaction`` item whose ``encrypted_content``
the server wrote. The proxy writes a reference there; when a later request carries it back, the proxy puts the
summary it stands for in the request before it goes upstream. So the token carries that summary itself
(encrypted), with the entry it was logged as (tenant, session, seq, prefix hash): it expands after an OAuth
refresh (a new tenant), a restart, or a store that lost the entry, and nobody without the server secret can
read, forge or alter one.

Token (v2): ``ctxproxy.v2.<box>``, the box base64url without padding of a 12-byte random nonce and the
AES-256-GCM ciphertext (tag included) of the zlib-compressed canonical JSON ``{"h": prefix_hash, "m": message,
"q": seq, "s": session, "t": tenant}``. The key is HKDF-SHA256 of the server secret; the version prefix is the
associated data. AES-GCM comes from ``cryptography`` (no crypto of our own). A message too big to carry
(``MAX_CARRIED_BYTES`` compressed) is left out: that reference names its entry only and needs the store.
A reference is a bearer token for what it carries: whoever holds one holds its summary (as with OpenAI's own
encrypted content), and it proves the session it names (``proxy.http.continuity``).

Old tokens (v1, before issue 17): ``ctxproxy.v1.<payload>.<mac>``, base64url canonical JSON ``{"h", "q", "s"}``
and HMAC-SHA256 over the version, the tenant and the payload as written; the tenant is signed but not written,
so one checks out only under the tenant it was made for. They are still read, never made.

Base64 is read strictly (the canonical encoding only), so a token differing by one character never decodes to
the same bytes. The secret is ``--secret`` (``CTXPROXY_SECRET``) when set, else one generated at the first
start and kept in the store (``FactLog.secret``), so every process and replica on the store agrees and
references survive a restart; only ``--secret`` makes them survive a lost store.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from proxy.store.base import FactLog, as_seq

PREFIX = "ctxproxy"
VERSION = 2
#: Compressed bytes of content a reference carries at most; a summary with its kept tail is a few KB, so this
#: leaves room, and keeps the token Codex sends back on every turn bounded.
MAX_CARRIED_BYTES = 48 * 1024
#: Decompressed bytes read at most: a token is never inflated past this.
MAX_PLAIN_BYTES = 1024 * 1024
#: Longer tokens are refused unread (base64 of the largest box, with room).
MAX_TOKEN_CHARS = (MAX_CARRIED_BYTES + 1024) * 4 // 3 + 64
_DOMAIN = "ctxproxy-reference"
_NONCE_BYTES = 12
_AAD = f"{PREFIX}.v{VERSION}".encode()
_B64URL = re.compile(r"[A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class Reference:
    """What a verified token names: the entry at ``seq`` of ``tenant``'s ``session`` (a summary, made when the
    conversation's prefix hash was ``prefix_hash``), and the message it stands for when the token carries it."""

    tenant: str
    session: str
    seq: int
    prefix_hash: str
    message: Mapping[str, Any] | None = None


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


def seal(secret: bytes, reference: Reference) -> str:
    """A v2 token carrying ``reference`` (its message too, unless that is over ``MAX_CARRIED_BYTES``)."""
    fields: dict[str, Any] = {"h": reference.prefix_hash, "q": reference.seq, "s": reference.session,
                              "t": reference.tenant}
    plain = zlib.compress(orjson.dumps({**fields, "m": reference.message}, option=orjson.OPT_SORT_KEYS))
    if reference.message is None or len(plain) > MAX_CARRIED_BYTES:
        plain = zlib.compress(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS))
    nonce = os.urandom(_NONCE_BYTES)
    return f"{PREFIX}.v{VERSION}.{_b64(nonce + _aead(secret).encrypt(nonce, plain, _AAD))}"


def unseal(secret: bytes, token: str, tenants: Sequence[str]) -> Reference | None:
    """The reference ``token`` stands for, or None (forged, altered, another secret's, unknown version, junk).

    A v2 token needs nothing else; a v1 token checks out only under the tenant it was made for, tried from
    ``tenants`` in order.
    """
    if len(token) > MAX_TOKEN_CHARS:
        return None
    if token.startswith(f"{PREFIX}.v1."):
        return next((ref for ref in (verify_v1(secret, token, t) for t in tenants) if ref is not None), None)
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX or parts[1] != f"v{VERSION}":
        return None
    box = _unb64(parts[2])
    if box is None or len(box) < _NONCE_BYTES + 16:
        return None
    try:
        plain = _aead(secret).decrypt(box[:_NONCE_BYTES], box[_NONCE_BYTES:], _AAD)
        inflater = zlib.decompressobj()
        raw = inflater.decompress(plain, MAX_PLAIN_BYTES)
        fields = orjson.loads(raw) if inflater.eof and not inflater.unconsumed_tail else None
    except (InvalidTag, zlib.error, orjson.JSONDecodeError):
        return None
    tenant = fields.get("t") if isinstance(fields, dict) else None
    message = fields.get("m") if isinstance(fields, dict) else None
    if not isinstance(tenant, str) or not (message is None or isinstance(message, dict)):
        return None
    named = _named(fields, tenant)
    return Reference(named.tenant, named.session, named.seq, named.prefix_hash, message) if named else None


def verify_v1(secret: bytes, token: str, tenant: str) -> Reference | None:
    """The entry a v1 token names, when this server signed it for ``tenant``; None otherwise."""
    if len(token) > MAX_TOKEN_CHARS:
        return None
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != PREFIX or parts[1] != "v1":
        return None
    _, _, payload, mac = parts
    if not hmac.compare_digest(mac.encode(), _b64(mac_v1(secret, tenant, payload)).encode()):
        return None
    raw = _unb64(payload)
    try:
        fields = orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        return None
    return _named(fields, tenant)


def mac_v1(secret: bytes, tenant: str, payload: str) -> bytes:
    """The MAC of a v1 token's payload (as written) for ``tenant``."""
    return hmac.new(secret, orjson.dumps([_DOMAIN, 1, tenant, payload]), hashlib.sha256).digest()


def _named(fields: object, tenant: str) -> Reference | None:
    if not isinstance(fields, dict):
        return None
    session, seq, prefix_hash = fields.get("s"), fields.get("q"), fields.get("h")
    if not isinstance(session, str) or not isinstance(prefix_hash, str):
        return None
    if (seq := as_seq(seq)) is None:
        return None
    return Reference(tenant, session, seq, prefix_hash)


@functools.lru_cache(maxsize=8)
def _aead(secret: bytes) -> AESGCM:
    """The cipher under the key derived from ``secret`` (derived once per secret)."""
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=f"{_DOMAIN}-v{VERSION}".encode()).derive(secret)
    return AESGCM(key)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes | None:
    """The bytes ``text`` encodes, only when it is their canonical unpadded base64url (no stray characters, no
    set padding bits), so one text decodes to one byte string and every altered text to another or to None."""
    if len(text) % 4 == 1 or not _B64URL.fullmatch(text):
        return None
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    return data if _b64(data) == text else None
