"""Names that outlive a process: Redis keys, stored-format tags, header names.

Every key of one session shares the hash tag ``{tenant:session}`` so the whole
session lives in one Redis Cluster slot and a Lua script may touch all of it.
"""

from __future__ import annotations

KEY_PREFIX = "ctxproxy"
LOG_SUFFIX = "log"
META_SUFFIX = "meta"
LOCK_SUFFIX = "lock"
FACT_KEYS_SUFFIX = "fact-keys"
#: The server secret (``FactLog.secret``): one key for the whole store, outside every session's hash slot.
SECRET_KEY = f"{KEY_PREFIX}:secret"
#: The inspector's sign-in epoch (``FactLog.signin_epoch``): a counter, one key for the whole store.
SIGNIN_EPOCH_KEY = f"{KEY_PREFIX}:signin-epoch"

#: Which tenants hold a session id (``FactLog.note_tenant``): a sorted set per session id, its own hash slot.
TENANTS_PREFIX = f"{KEY_PREFIX}:tenants"
#: The conversation openings of those tenants (``proxy.store.base.Tenant``): a hash per session id, in the same slot.
OPENINGS_PREFIX = f"{KEY_PREFIX}:openings"
#: A credential's link to the tenant whose session it continues (``FactLog.link``), in the new tenant's slot.
LINK_SUFFIX = "link"

#: Version tag written into every stored fact; bump it with a migration, never reuse.
FACT_FORMAT = 1


def session_tag(tenant: str, session: str) -> str:
    return "{" + tenant + ":" + session + "}"


def log_key(tenant: str, session: str) -> str:
    return f"{KEY_PREFIX}:{session_tag(tenant, session)}:{LOG_SUFFIX}"


def meta_key(tenant: str, session: str) -> str:
    return f"{KEY_PREFIX}:{session_tag(tenant, session)}:{META_SUFFIX}"


def fact_keys_key(tenant: str, session: str) -> str:
    """The hash from each keyed fact's ``key`` to its seq (``NewFact.key``): what makes an append skip it."""
    return f"{KEY_PREFIX}:{session_tag(tenant, session)}:{FACT_KEYS_SUFFIX}"


def lock_key(tenant: str, session: str, name: str) -> str:
    return f"{KEY_PREFIX}:{session_tag(tenant, session)}:{LOCK_SUFFIX}:{name}"


def tenants_key(session: str) -> str:
    return f"{TENANTS_PREFIX}:{{{session}}}"


def openings_key(session: str) -> str:
    return f"{OPENINGS_PREFIX}:{{{session}}}"


def link_key(tenant: str, session: str) -> str:
    return f"{KEY_PREFIX}:{session_tag(tenant, session)}:{LINK_SUFFIX}"


HEADER_SESSION = "X-Session-Id"
HEADER_COMPACTED = "X-Ctxproxy-Compacted"
HEADER_VIEW_TOKENS = "X-Ctxproxy-View-Tokens"
HEADER_OVERHEAD = "X-Ctxproxy-Overhead-Ms"
#: Codex's per-turn metadata (JSON; ``request_kind: "compaction"`` on its compaction turns).
HEADER_TURN_METADATA = "x-codex-turn-metadata"

#: Headers a client's key may come in, in the order ``proxy.sessions.credential`` reads them.
CREDENTIAL_HEADERS = ("Authorization", "api-key", "x-api-key", "x-goog-api-key")

#: Session headers that real clients already send, after X-Session-Id, in priority order.
FOREIGN_SESSION_HEADERS = (
    "session-id",
    "session_id",
    "x-session-affinity",
    "x-litellm-session-id",
    "helicone-session-id",
    "x-claude-code-session-id",
)
#: Headers naming the sub-agent a request comes from: the session becomes ``<session>/<agent>``.
SUBAGENT_HEADERS = ("x-claude-code-agent-id", "x-openai-subagent")
