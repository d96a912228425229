"""The inspector's sign-in cookie: an expiry and a nonce, signed; never the admin token.

The signing key is derived from the admin token (HMAC-SHA256 over a fixed
label), so every worker and replica configured with the same token accepts the
same cookie with nothing shared or stored, a restart signs nobody out, and
changing the token signs everyone out. The cookie cannot be turned back into
the token. Signing out deletes the cookie in the browser; a copied cookie stays
valid until it expires (``LIFETIME``), as there is no server-side session to end.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

NAME = "ctxproxy_ui"
LIFETIME = 12 * 3600
VERSION = "v1"
_LABEL = b"ctxproxy ui session cookie v1"


def _signature(token: str, payload: str) -> str:
    key = hmac.new(token.encode(), _LABEL, hashlib.sha256).digest()
    digest = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def issue(token: str, now: float) -> str:
    payload = f"{VERSION}.{int(now) + LIFETIME}.{secrets.token_urlsafe(16)}"
    return f"{payload}.{_signature(token, payload)}"


def valid(value: str | None, token: str, now: float) -> bool:
    """Signed with ``token``'s key and not expired; compared in constant time."""
    parts = (value or "").split(".")
    if len(parts) != 4 or parts[0] != VERSION or not parts[1].isdigit():
        return False
    signature = _signature(token, ".".join(parts[:3]))
    return hmac.compare_digest(signature.encode(), parts[3].encode()) and int(parts[1]) > now
