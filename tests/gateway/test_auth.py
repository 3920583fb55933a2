"""API keys: hashed config records, Bearer parsing, missing versus wrong keys, auth disabled."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.auth import (
    ANONYMOUS,
    ANONYMOUS_PRINCIPAL,
    ApiKeyRecord,
    AuthError,
    HoldLimits,
    KeyRing,
    RateLimit,
    bearer_token,
    hash_key,
    new_key,
)

AGENT_KEY, VIP_KEY = "sk-as-agent", "sk-as-vip"


def ring(enabled: bool = True) -> KeyRing:
    return KeyRing.from_config([
        {"name": "agent", "sha256": hash_key(AGENT_KEY), "rate_limit": 2.5, "slo_class": "batch"},
        {"name": "boss", "sha256": hash_key(VIP_KEY).upper(), "priority": "vip", "rate_limit": 5, "burst": 20},
    ], enabled=enabled)


def test_hash_key_is_sha256_hex() -> None:
    assert hash_key("secret") == hashlib.sha256(b"secret").hexdigest()


def test_new_key_round_trips_through_a_key_ring() -> None:
    made = new_key()
    assert made.key.startswith("sk-as-") and len(made.key) > 40 and made.sha256 == hash_key(made.key)
    assert new_key().key != made.key
    principal = KeyRing([ApiKeyRecord(name="fresh", sha256=made.sha256)], enabled=True).authenticate(
        f"Bearer {made.key}")
    assert principal.name == "fresh" and principal.authenticated and principal.rate_limit is None


def test_valid_keys_map_to_their_principals() -> None:
    keys = ring()
    agent = keys.authenticate(f"Bearer {AGENT_KEY}")
    assert (agent.name, agent.priority, agent.is_vip) == ("agent", "normal", False)
    assert agent.rate_limit == RateLimit(2.5, 3)  # burst defaults to ceil(rate)
    boss = keys.authenticate(f"bearer   {VIP_KEY}  ")
    assert (boss.name, boss.is_vip, boss.rate_limit) == ("boss", True, RateLimit(5.0, 20))
    assert (agent.slo_class, boss.slo_class, ANONYMOUS_PRINCIPAL.slo_class) == ("batch", "vip", None)


@pytest.mark.parametrize("header", [None, "", "   ", "Bearer", "Bearer   "])
def test_missing_key(header: str | None) -> None:
    with pytest.raises(AuthError) as caught:
        ring().authenticate(header)
    assert caught.value.code == "missing_api_key" and caught.value.status == 401
    assert caught.value.type == "invalid_request_error" and "Bearer" in caught.value.message


@pytest.mark.parametrize("header", [f"Bearer {AGENT_KEY}x", "Bearer sk-as-unknown", f"Basic {AGENT_KEY}",
                                    f"Bearer {hash_key(AGENT_KEY)}"])
def test_wrong_key(header: str) -> None:
    with pytest.raises(AuthError) as caught:
        ring().authenticate(header)
    assert caught.value.code == "invalid_api_key"
    assert AGENT_KEY not in caught.value.message


@pytest.mark.parametrize("header", [None, "Bearer anything", f"Bearer {VIP_KEY}"])
def test_disabled_auth_makes_everyone_anonymous(header: str | None) -> None:
    principal = ring(enabled=False).authenticate(header)
    assert principal == ANONYMOUS_PRINCIPAL
    assert (principal.priority, principal.authenticated, principal.rate_limit) == ("normal", False, None)


def test_bearer_token_strips_whitespace() -> None:
    assert bearer_token("  Bearer  abc ") == "abc"


@pytest.mark.parametrize("entry", [
    {"name": "a", "sha256": "abc"},
    {"name": "", "sha256": hash_key("k")},
    {"name": "a", "sha256": hash_key("k"), "priority": "gold"},
    {"name": "a", "sha256": hash_key("k"), "rate_limit": 0},
    {"name": "a", "sha256": hash_key("k"), "rate_limit": 1, "burst": 0},
    {"name": "a", "sha256": hash_key("k"), "burst": 3},
    {"name": "a", "sha256": hash_key("k"), "key": "plaintext"},
])
def test_bad_records_are_refused(entry: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        KeyRing.from_config([entry], enabled=True)


def test_duplicate_names_or_hashes_are_refused() -> None:
    with pytest.raises(ValueError, match="names"):
        KeyRing.from_config([{"name": "a", "sha256": hash_key("1")}, {"name": "a", "sha256": hash_key("2")}], True)
    with pytest.raises(ValueError, match="hashes"):
        KeyRing.from_config([{"name": "a", "sha256": hash_key("1")},
                             {"name": "b", "sha256": hash_key("1").upper()}], True)


def test_enabled_without_keys_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="no api keys"):
        KeyRing([], enabled=True)
    assert KeyRing([], enabled=False).authenticate(None) == ANONYMOUS_PRINCIPAL


def test_every_record_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    keys = ring()
    for header in (f"Bearer {AGENT_KEY}", f"Bearer {VIP_KEY}", "Bearer sk-as-unknown"):
        compared.clear()
        with contextlib.suppress(AuthError):
            keys.authenticate(header)
        assert len(compared) == 2  # every record, with hmac.compare_digest, whichever one matches


def test_admin_keys_are_needed_for_admin_whether_or_not_auth_is_on() -> None:
    entries: list[dict[str, Any]] = [{"name": "agent", "sha256": hash_key(AGENT_KEY)},
                                      {"name": "ops", "sha256": hash_key("ops-key"), "admin": True}]
    for enabled in (True, False):
        keys = KeyRing.from_config(entries, enabled=enabled)
        assert keys.authenticate_admin("Bearer ops-key").admin
        with pytest.raises(AuthError) as refused:
            keys.authenticate_admin(f"Bearer {AGENT_KEY}")
        assert (refused.value.status, refused.value.code) == (403, "admin_key_required")
        with pytest.raises(AuthError) as missing:
            keys.authenticate_admin(None)
        assert (missing.value.status, missing.value.code) == (401, "missing_api_key")


def test_hold_limits_come_from_the_key_or_the_defaults() -> None:
    defaults = HoldLimits(sessions=100, websockets=4)
    keys = KeyRing.from_config([{"name": "agent", "sha256": hash_key(AGENT_KEY), "max_websockets": 1}], True,
                               defaults)
    assert keys.authenticate(f"Bearer {AGENT_KEY}").holds == HoldLimits(sessions=100, websockets=1)
    assert KeyRing([], False, defaults).authenticate(None).holds == defaults
    with pytest.raises(ValidationError, match="anonymous"):
        KeyRing.from_config([{"name": ANONYMOUS, "sha256": hash_key("k")}], True)
