"""The inspector's sign-in cookie: an expiry, the sign-in epoch and a nonce, signed; never the admin token.

The signing key is derived from the admin token (HMAC-SHA256 over a fixed
label), so every worker and replica configured with the same token accepts the
same cookie, a restart signs nobody out, and changing the token signs everyone
out. The cookie cannot be turned back into the token.

Signing out revokes: the cookie carries the store's sign-in epoch
(``FactLog.signin_epoch``) and is valid only while that is still the epoch;
signing out moves it on (``FactLog.end_signins``), so a cookie copied before
is refused by every worker and replica, and after a restart. There is one
admin token, so there is no one else's sign-in to keep: signing out anywhere
signs out every browser.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

NAME = "ctxproxy_ui"
LIFETIME = 12 * 3600
VERSION = "v2"
_LABEL = b"ctxproxy ui session cookie v1"


def mac(token: str, label: bytes, payload: str) -> str:
    """``payload`` signed with a key derived from the admin ``token`` for one use (``label``): the cookie's and
    the CSRF tokens' (``proxy.ui.csrf``) keys differ, so neither can stand for the other."""
    key = hmac.new(token.encode(), label, hashlib.sha256).digest()
    digest = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def issue(token: str, now: float, epoch: int) -> str:
    payload = f"{VERSION}.{int(now) + LIFETIME}.{epoch}.{secrets.token_urlsafe(16)}"
    return f"{payload}.{mac(token, _LABEL, payload)}"


def valid(value: str | None, token: str, now: float, epoch: int) -> bool:
    """Signed with ``token``'s key, not expired and of sign-in epoch ``epoch``; compared in constant time."""
    parts = (value or "").split(".")
    if len(parts) != 5 or parts[0] != VERSION or not parts[1].isdecimal() or parts[2] != str(epoch):
        return False
    signature = mac(token, _LABEL, ".".join(parts[:4]))
    return hmac.compare_digest(signature.encode(), parts[4].encode(errors="surrogatepass")) and int(parts[1]) > now
