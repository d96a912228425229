"""References (``proxy.secret``): a round trip that carries the summary, and every way a token must fail."""

from __future__ import annotations

import os
import sqlite3
import zlib
from contextlib import closing

import orjson
import pytest

from proxy import secret as refs
from proxy.secret import Reference, is_reference, seal, server_secret, unseal, verify_v1
from proxy.settings import Secret, Settings
from proxy.store.sqlite import SqliteFactLog

SECRET = b"k" * 43
TENANT = "t-3f9a"
SUMMARY = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "## 1. Goals\nship it"}]}
REFERENCE = Reference(TENANT, "run-1", 7, "9c1e", SUMMARY)


def boxed(plain: bytes, secret: bytes = SECRET) -> str:
    """A v2 token around any plaintext: what a holder of the secret could make, to test the checks after the
    tag's."""
    nonce = os.urandom(12)
    return f"ctxproxy.v2.{refs._b64(nonce + refs._aead(secret).encrypt(nonce, plain, b'ctxproxy.v2'))}"


def v1(payload: dict[str, object], tenant: str = TENANT) -> str:
    """A v1 token, as the proxy made them before issue 17."""
    body = refs._b64(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS))
    return f"ctxproxy.v1.{body}.{refs._b64(refs.mac_v1(SECRET, tenant, body))}"


def test_round_trip_carries_the_entry_and_its_message_under_any_tenant() -> None:
    made = seal(SECRET, REFERENCE)
    assert made.startswith("ctxproxy.v2.") and is_reference(made) and not is_reference("gAAAAABo-upstream")
    assert unseal(SECRET, made, []) == REFERENCE
    assert unseal(SECRET, made, ["t-other"]) == REFERENCE, "the tenant is inside: a new credential reads it too"
    assert TENANT not in made and "Goals" not in made and "run-1" not in made
    again = seal(SECRET, REFERENCE)
    assert again != made and unseal(SECRET, again, []) == REFERENCE, "a fresh nonce each time"


def test_every_one_character_change_fails() -> None:
    made = seal(SECRET, REFERENCE)
    for position, char in enumerate(made):
        for other in {"A", "B", "_"} - {char}:
            assert unseal(SECRET, made[:position] + other + made[position + 1:], [TENANT]) is None, (position, other)
    assert unseal(SECRET, made + "A", [TENANT]) is None
    assert unseal(SECRET, made[:-1], [TENANT]) is None
    assert unseal(SECRET, made + "=", [TENANT]) is None


def test_only_the_canonical_base64_decodes() -> None:
    """The last character's unused bits, padding and stray characters: each a different text for the same bytes,
    which a lenient decoder would accept (the cause of a flaky forgery test)."""
    assert refs._unb64("QQ") == b"A"
    for variant in ("QR", "QQ==", "Q Q", "QQ\n", "Q+Q", "QQ.", "Q"):
        assert refs._unb64(variant) is None, variant


def test_another_secret_fails() -> None:
    assert unseal(b"x" * 43, seal(SECRET, REFERENCE), [TENANT]) is None


def test_a_message_too_big_to_carry_is_left_out_and_the_entry_still_named() -> None:
    big = {**SUMMARY, "content": [{"type": "input_text", "text": os.urandom(refs.MAX_CARRIED_BYTES).hex()}]}
    made = seal(SECRET, Reference(TENANT, "run-1", 7, "9c1e", big))
    assert len(made) < 1024
    assert unseal(SECRET, made, []) == Reference(TENANT, "run-1", 7, "9c1e", None)
    assert len(seal(SECRET, REFERENCE)) <= refs.MAX_TOKEN_CHARS


@pytest.mark.parametrize("fields", [
    {"h": "9c1e", "q": "7", "s": "run-1", "t": TENANT},
    {"h": "9c1e", "q": True, "s": "run-1", "t": TENANT},
    {"h": "9c1e", "q": -1, "s": "run-1", "t": TENANT},
    {"h": "9c1e", "q": 2**63, "s": "run-1", "t": TENANT},
    {"h": 1, "q": 7, "s": "run-1", "t": TENANT},
    {"q": 7, "s": "run-1", "t": TENANT},
    {"h": "9c1e", "q": 7, "s": "run-1"},
    {"h": "9c1e", "q": 7, "s": "run-1", "t": TENANT, "m": "text, not an item"},
    [1, 2],
], ids=["seq-string", "seq-bool", "seq-negative", "seq-past-a-log", "hash-number", "hash-missing", "tenant-missing",
        "message-str", "not-an-object"])
def test_a_sealed_payload_of_the_wrong_shape_fails(fields: object) -> None:
    assert unseal(SECRET, boxed(zlib.compress(orjson.dumps(fields))), [TENANT]) is None
    assert unseal(SECRET, boxed(zlib.compress(orjson.dumps({"h": "9c1e", "q": 7, "s": "run-1", "t": TENANT}))),
                  []) == Reference(TENANT, "run-1", 7, "9c1e")


def test_a_sealed_payload_that_is_not_zlib_json_or_inflates_too_far_fails() -> None:
    assert unseal(SECRET, boxed(b'{"h": "9c1e"}'), []) is None
    assert unseal(SECRET, boxed(zlib.compress(b"not json")), []) is None
    assert unseal(SECRET, boxed(zlib.compress(b" " * (refs.MAX_PLAIN_BYTES + 1))), []) is None
    assert unseal(SECRET, boxed(b""), []) is None


def test_an_old_v1_reference_reads_only_under_its_own_tenant() -> None:
    made = v1({"h": "9c1e", "q": 7, "s": "run-1"})
    assert unseal(SECRET, made, ["t-other", TENANT]) == Reference(TENANT, "run-1", 7, "9c1e")
    assert verify_v1(SECRET, made, TENANT) == Reference(TENANT, "run-1", 7, "9c1e")
    assert unseal(SECRET, made, ["t-other"]) is None and unseal(SECRET, made, []) is None
    assert unseal(b"x" * 43, made, [TENANT]) is None
    for position, char in enumerate(made):
        altered = made[:position] + ("B" if char == "A" else "A") + made[position + 1:]
        assert unseal(SECRET, altered, [TENANT]) is None, position
    assert unseal(SECRET, v1({"h": "9c1e", "q": "7", "s": "run-1"}), [TENANT]) is None


@pytest.mark.parametrize("junk", ["", "ctxproxy", "ctxproxy.v2", "ctxproxy.v2.", "ctxproxy.v2.e30",
                                  "ctxproxy.v1.e30", "ctxproxy.v1.\u00e9.\u00e9", "ctxproxy.v2.\u00e9", "a.b.c.d.e",
                                  "ctxproxy.v3." + "A" * 40, "ctxproxy.v2." + "A" * (refs.MAX_TOKEN_CHARS + 1)])
def test_junk_is_refused_without_an_exception(junk: str) -> None:
    assert unseal(SECRET, junk, [TENANT]) is None


async def test_the_configured_secret_wins_and_the_store_keeps_its_own(sqlite_store: SqliteFactLog) -> None:
    assert await server_secret("configured-secret-16", sqlite_store) == b"configured-secret-16"
    with closing(sqlite3.connect(sqlite_store.path)) as conn:
        assert conn.execute("SELECT count(*) FROM secret").fetchone() == (0,)
    stored = await server_secret(None, sqlite_store)
    assert stored == await sqlite_store.secret() and len(stored) == 43


def test_the_secret_setting_is_masked_and_long_enough() -> None:
    settings = Settings.from_env({"CTXPROXY_SECRET": "s" * 16})
    assert isinstance(settings.secret, Secret) and settings.secret == "s" * 16
    assert "s" * 16 not in repr(settings)
    assert Settings.from_env({}).secret is None
    with pytest.raises(ValueError, match="at least 16"):
        Settings.from_env({"CTXPROXY_SECRET": "short"})
