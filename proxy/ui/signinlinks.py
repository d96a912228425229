"""One-time sign-in links for the inspector: for a process that serves it to the person who started it.

``ctxproxy demo`` prints a link instead of an admin token to paste: the link's
token signs in once (``/ui/once/{token}`` sets the session cookie and goes on to
the page the link names), then is spent; unused, it lapses after ``LIFETIME``
seconds. Only a digest of each token is held, in this process's memory, so a
link outlives neither its first use nor the process, and the admin token never
travels in a URL. Tokens are 256 random bits: a guess cannot find one.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

LIFETIME = 600.0


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode(errors="surrogatepass")).hexdigest()


@dataclass
class SignInLinks:
    """The unspent links: each token's digest, the path it leads to and when it lapses."""

    clock: Callable[[], float] = time.time
    _links: dict[str, tuple[str, float]] = field(default_factory=dict)

    def issue(self, target: str) -> str:
        """A new token leading to ``target`` (a path under ``/ui``), good once within ``LIFETIME``."""
        token = secrets.token_urlsafe(32)
        self._links[_digest(token)] = (target, self.clock() + LIFETIME)
        return token

    def redeem(self, token: str) -> str | None:
        """The path ``token`` leads to, spending it; None for a token spent, lapsed or never issued."""
        now = self.clock()
        self._links = {d: link for d, link in self._links.items() if link[1] > now}
        found = self._links.pop(_digest(token), None)
        return found[0] if found is not None else None
