"""CSRF defence for the inspector: every state-changing POST under ``/ui`` passes ``check``.

Two checks, either of which stops a forged POST on its own:

- **Origin.** A browser names the page a POST comes from (``Origin``, and
  ``Sec-Fetch-Site``); one from another origin is refused. Origins differ by
  port, so a page on another ``localhost`` port is refused too, where
  ``SameSite`` cookies let it through (a *site* ignores ports). A request with
  neither header is not from a browser's cross-origin form and passes this check.
- **A token in the form** (hidden field ``FIELD``): HMAC-SHA256 of the cookie it
  is bound to, under a key derived from the admin token (its own label, so it is
  not the cookie's key). A signed-in page's forms bind it to the sign-in cookie
  (``proxy.ui.cookie``); the sign-in form binds it to ``PRESIGN``, a random
  cookie set with that form. Another origin can neither read the page that holds
  it nor compute it, and a cookie it plants (cookies ignore ports) comes with no
  token that matches.

How a form uses it: render ``field(token(admin_token, binding))`` inside the
``<form>``; ``proxy.http.ui.guard`` runs ``check`` on every POST under ``/ui``
before the handler, so a new POST route registered through ``guard`` is covered
with nothing more (``proxy.http.ui.form_token`` gives the token for a page).
"""

from __future__ import annotations

import hmac
import secrets
from html import escape
from urllib.parse import urlsplit

from proxy.ui.cookie import mac

#: The hidden form field that carries the token.
FIELD = "csrf_token"
#: The sign-in form's cookie: a random value the form's token is bound to before there is a sign-in cookie.
PRESIGN = "ctxproxy_ui_presign"
_LABEL = b"ctxproxy ui csrf token v1"
#: ``Sec-Fetch-Site`` values a form on this origin (or a typed URL) sends.
_OWN_SITE = frozenset({"same-origin", "none"})


def token(admin_token: str, binding: str) -> str:
    """The token for forms shown beside cookie value ``binding``."""
    return mac(admin_token, _LABEL, binding)


def presign_value() -> str:
    """A fresh value for the ``PRESIGN`` cookie."""
    return secrets.token_urlsafe(16)


def field(value: str) -> str:
    """The hidden input that carries ``value`` (a ``token``) in a form."""
    return f'<input type="hidden" name="{FIELD}" value="{escape(value)}">'


def same_origin(origin: str | None, fetch_site: str | None, host: str) -> bool:
    """Whether a POST with these ``Origin`` and ``Sec-Fetch-Site`` headers comes from this server's pages.

    ``host`` is the request's ``Host``: the origin's host and port must be it (the
    scheme is left out, so a TLS-terminating proxy in front that forwards
    ``Host`` works). ``Origin: null`` is what the inspector's own forms send (its
    pages are ``Referrer-Policy: no-referrer``, which blanks the Origin of a POST
    too), so it passes only beside a ``Sec-Fetch-Site`` that names this origin.
    """
    site = fetch_site.lower() if fetch_site is not None else None
    if site is not None and site not in _OWN_SITE:
        return False
    if origin is None:
        return True
    if origin == "null":
        return site is not None
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        return False
    return bool(netloc) and netloc.lower() == host.lower()


def check(*, admin_token: str, binding: str | None, presented: object, origin: str | None, fetch_site: str | None,
          host: str) -> str | None:
    """Why a POST under ``/ui`` is refused (the 403's message), or None when it may go on.

    ``binding`` is the cookie the form's token is bound to (None when the
    request carries none), ``presented`` the form's ``FIELD`` value.
    """
    if not same_origin(origin, fetch_site, host):
        return "Cross-origin form posts are refused."
    if (not binding or not isinstance(presented, str)
            or not hmac.compare_digest(token(admin_token, binding).encode(), presented.encode(errors="surrogatepass"))):
        return "The form is out of date or not from this inspector: reload the page and try again."
    return None
