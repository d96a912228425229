"""Signed references (``proxy.secret``): a round trip, and every way a token must fail."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import orjson
import pytest

from proxy import secret as refs
from proxy.secret import Reference, is_reference, server_secret, sign, verify
from proxy.settings import Secret, Settings
from proxy.store.sqlite import SqliteFactLog

SECRET = b"k" * 43
TENANT = "t-3f9a"


def token() -> str:
    return sign(SECRET, TENANT, "run-1", 7, "9c1e")


def signed(payload: dict[str, object], version: int = refs.VERSION) -> str:
    """A token with a valid MAC over any payload: what a holder of the secret could make, to test the checks
    that come after the MAC."""
    body = refs._b64(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS))
    return f"ctxproxy.v{version}.{body}.{refs._b64(refs._mac(SECRET, version, TENANT, body))}"


def test_round_trip_names_the_checkpoint() -> None:
    made = token()
    assert verify(SECRET, made, TENANT) == Reference(TENANT, "run-1", 7, "9c1e")
    assert made.startswith("ctxproxy.v1.") and is_reference(made) and not is_reference("gAAAAABo-upstream")
    _, _, payload, _ = made.split(".")
    assert refs._unb64(payload) == b'{"h":"9c1e","q":7,"s":"run-1"}'
    assert TENANT not in made
    assert sign(SECRET, TENANT, "run-1", 7, "9c1e") == made


def test_every_one_character_change_fails() -> None:
    made = token()
    for position, char in enumerate(made):
        altered = made[:position] + ("B" if char == "A" else "A") + made[position + 1:]
        assert verify(SECRET, altered, TENANT) is None, position
    assert verify(SECRET, made + "A", TENANT) is None
    assert verify(SECRET, made[:-1], TENANT) is None


def test_a_payload_under_another_tokens_mac_fails() -> None:
    first, second = token().split("."), sign(SECRET, TENANT, "run-1", 8, "9c1e").split(".")
    assert verify(SECRET, ".".join([*first[:3], second[3]]), TENANT) is None
    assert verify(SECRET, ".".join([*second[:3], first[3]]), TENANT) is None


def test_another_tenant_or_secret_fails() -> None:
    assert verify(SECRET, token(), "t-other") is None
    assert verify(b"x" * 43, token(), TENANT) is None


def test_an_unknown_version_fails_even_when_signed() -> None:
    assert verify(SECRET, signed({"h": "9c1e", "q": 7, "s": "run-1"}), TENANT) is not None
    assert verify(SECRET, signed({"h": "9c1e", "q": 7, "s": "run-1"}, version=2), TENANT) is None


@pytest.mark.parametrize("payload", [
    {"h": "9c1e", "q": "7", "s": "run-1"},
    {"h": "9c1e", "q": True, "s": "run-1"},
    {"h": "9c1e", "q": -1, "s": "run-1"},
    {"h": 1, "q": 7, "s": "run-1"},
    {"q": 7, "s": "run-1"},
], ids=["seq-string", "seq-bool", "seq-negative", "hash-number", "hash-missing"])
def test_a_signed_payload_of_the_wrong_shape_fails(payload: dict[str, object]) -> None:
    assert verify(SECRET, signed(payload), TENANT) is None


@pytest.mark.parametrize("junk", ["", "ctxproxy", "ctxproxy.v1.e30", "ctxproxy.v1.\u00e9.\u00e9", "a.b.c.d.e",
                                  "ctxproxy.v1." + "A" * 5000 + ".x"])
def test_junk_is_refused_without_an_exception(junk: str) -> None:
    assert verify(SECRET, junk, TENANT) is None


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
