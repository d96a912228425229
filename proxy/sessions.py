"""Which tenant and which session a request belongs to.

Tenant: a hash of the caller's credential, so the raw key is never stored and
two keys can never share a session. Session, in order: the ``/s/{session}/v1``
URL prefix, ``X-Session-Id``, the session headers real clients already send
(Codex, LiteLLM, Helicone, Claude Code…), a session the client put in the body
(Codex's ``prompt_cache_key``, the ``session_id`` in Claude Code's
``metadata.user_id``), and last a fingerprint of the full leading system
message(s) and first user message. The fingerprint hashes those messages
whole: agents of one project share long prompt prefixes, so a truncated prefix
would merge unrelated runs. A sub-agent's requests (a sub-agent header) are the
session ``<session>/<agent>``: the only ids with a ``/``.

Foreign headers carry ids of other tools' making; one that is not a valid
session id is skipped rather than refused, since the caller never chose it for us.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence

import orjson

from proxy.constants import FOREIGN_SESSION_HEADERS, HEADER_SESSION, SUBAGENT_HEADERS
from proxy.context.items import ItemModel
from proxy.errors import BadRequest, Unauthorized
from proxy.settings import Secret
from proxy.store.base import SessionKey
from proxy.types import Message

SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
ANONYMOUS_TENANT = "anonymous"
_TENANT_SALT = b"ctxproxy-tenant-v1\x00"


def credential(headers: Mapping[str, str], query: Mapping[str, str] | None = None) -> str | None:
    """The caller's key from ``Authorization: Bearer``, ``api-key``, ``x-api-key`` or ``x-goog-api-key`` (Gemini),
    else the Gemini API's ``key`` query parameter: a request that carries a key anywhere is never ``anonymous``."""
    auth = headers.get("Authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else auth.strip()
    found = headers.get("api-key") or headers.get("x-api-key") or headers.get("x-goog-api-key")
    return found or (query.get("key") if query is not None else None) or None


@functools.lru_cache(maxsize=4096)
def tenant_of(key: str | None) -> str:
    """16 hex digits of a salted SHA-256 of the key: stable, and useless for recovering it."""
    if not key:
        return ANONYMOUS_TENANT
    return hashlib.sha256(_TENANT_SALT + key.encode()).hexdigest()[:16]


def check_client_key(key: str | None, allowed: Sequence[Secret]) -> None:
    """Raise ``Unauthorized`` unless ``allowed`` is empty or holds ``key`` (constant-time compare)."""
    if not allowed:
        return
    if key is None or not any(hmac.compare_digest(key.encode(), k.encode()) for k in allowed):
        raise Unauthorized("Invalid or missing API key for this proxy.")


def valid_session(value: str) -> bool:
    return SESSION_ID.fullmatch(value) is not None


def logged_session_key(tenant: str, session: str) -> SessionKey:
    """The key a URL of the admin API or the inspector names; ``BadRequest`` if it cannot be one.

    A logged session id is ``<session>``, or ``<session>/<agent>`` for a
    sub-agent (``agent_of``): in a URL its '/' is written ``%2F``.
    """
    if not valid_session(tenant):
        raise BadRequest("Invalid tenant id: use 1-128 characters of A-Za-z0-9._:-", param="tenant")
    parts = session.split("/")
    if len(parts) > 2 or not all(map(valid_session, parts)):
        raise BadRequest("Invalid session id: use 1-128 characters of A-Za-z0-9._:-, or <session>/<agent> for a "
                         "sub-agent (in a URL, '/' written as %2F)", param="session")
    return SessionKey(tenant, session)


def explicit_session(path_session: str | None, headers: Mapping[str, str]) -> str | None:
    """The session named by the URL or a header, or None when the caller named none."""
    if path_session is not None:
        if not valid_session(path_session):
            raise BadRequest("Invalid session id in URL: use 1-128 characters of A-Za-z0-9._:-", param="session")
        return path_session
    header = headers.get(HEADER_SESSION)
    if header is not None:
        if not valid_session(header):
            raise BadRequest(f"Invalid {HEADER_SESSION}: use 1-128 characters of A-Za-z0-9._:-", param=HEADER_SESSION)
        return header
    for name in FOREIGN_SESSION_HEADERS:
        value = headers.get(name)
        if value and valid_session(value):
            return value
    return None


def fingerprint_session(dialect: ItemModel, messages: Sequence[Message], system: object = None) -> str:
    """``auto-`` + a hash of the system prompt (``system``: a request field, for the APIs that keep it outside
    the items), the leading system items and the first user item, whole."""
    digest = hashlib.blake2b(b"ctxproxy-session-v1\x00", digest_size=12)
    option = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
    try:
        if system is not None:
            digest.update(orjson.dumps(system, option=option))
        for message in messages:
            digest.update(orjson.dumps(dialect.identity(message), option=option))
            if dialect.role(message) != "system":
                break
    except orjson.JSONEncodeError as exc:  # read (1024 levels) but not writable (254): the client's error
        raise BadRequest(f"Request body cannot be processed: {exc} (nested too deeply).", code="invalid_json") from None
    return "auto-" + digest.hexdigest()


def agent_of(headers: Mapping[str, str]) -> str | None:
    """The sub-agent a request comes from (Claude Code's ``x-claude-code-agent-id``, Codex's
    ``x-openai-subagent``): its history is its own, so it must never rewind its parent's."""
    for name in SUBAGENT_HEADERS:
        value = headers.get(name)
        if value and valid_session(value):
            return value
    return None
