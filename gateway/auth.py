"""API keys. The config holds only each key's sha256 hex digest, never the key; a presented key is hashed and
compared in constant time against every record. With auth disabled every API request is the anonymous
principal; the admin endpoints always need a key marked `admin`."""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

Priority = Literal["normal", "vip"]
KEY_PREFIX = "sk-as-"
ANONYMOUS = "anonymous"
MISSING_KEY_MESSAGE = ("You didn't provide an API key. Send it in the Authorization header with Bearer auth "
                       "(Authorization: Bearer YOUR_KEY).")


class AuthError(Exception):
    """A request without a usable key (401), or whose key may not do what it asks (403), in OpenAI's error shape."""

    type = "invalid_request_error"

    def __init__(self, message: str, code: Literal["missing_api_key", "invalid_api_key", "admin_key_required"],
                 status: int = 401) -> None:
        super().__init__(message)
        self.message, self.code, self.status = message, code, status


class ApiKeyRecord(BaseModel):
    """One configured key: `{name, sha256, priority, slo_class, rate_limit, burst}`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    priority: Priority = "normal"
    slo_class: str | None = None  # a class of configs/slo.yaml; None: the one named like priority
    rate_limit: float | None = Field(default=None, gt=0)  # requests per second; None: unlimited
    burst: int | None = Field(default=None, ge=1)  # bucket size; defaults to ceil(rate_limit), at least 1
    admin: bool = False  # may use the admin endpoints (/admin/*)
    max_sessions: int | None = Field(default=None, ge=1)  # sessions held at once; None: limits.max_sessions_per_key
    max_websockets: int | None = Field(default=None, ge=1)  # open WebSockets per replica; None: the limits' default

    @model_validator(mode="after")
    def _burst_needs_rate(self) -> ApiKeyRecord:
        if self.burst is not None and self.rate_limit is None:
            raise ValueError(f"api key {self.name!r}: burst is set but rate_limit is not")
        if self.name == ANONYMOUS:
            raise ValueError(f"{ANONYMOUS!r} names the principal of requests without auth; pick another name")
        return self

    @property
    def digest(self) -> bytes:
        return bytes.fromhex(self.sha256)


@dataclass(frozen=True)
class RateLimit:
    rate: float  # requests per second
    burst: int


@dataclass(frozen=True)
class HoldLimits:
    """What one key may hold at once; None: no limit."""

    sessions: int | None = None  # sessions in the store (every replica's)
    websockets: int | None = None  # open Responses WebSocket connections, per replica


@dataclass(frozen=True)
class Principal:
    """Who a request runs as. `name` doubles as the rate-limit key and owns the sessions and responses it makes."""

    name: str
    priority: Priority
    rate_limit: RateLimit | None
    authenticated: bool
    slo_class: str | None = None  # the engine's service class for its requests; None: the engine's default
    admin: bool = False
    holds: HoldLimits = HoldLimits()

    @property
    def is_vip(self) -> bool:
        return self.priority == "vip"


ANONYMOUS_PRINCIPAL = Principal(ANONYMOUS, "normal", None, authenticated=False)


@dataclass(frozen=True)
class NewKey:
    key: str  # shown to the user once
    sha256: str  # goes into the config


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> NewKey:
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return NewKey(key, hash_key(key))


def _rate_limit(record: ApiKeyRecord) -> RateLimit | None:
    if record.rate_limit is None:
        return None
    burst = record.burst if record.burst is not None else max(1, math.ceil(record.rate_limit))
    return RateLimit(record.rate_limit, burst)


def principal_for(record: ApiKeyRecord, defaults: HoldLimits = HoldLimits()) -> Principal:
    holds = HoldLimits(record.max_sessions or defaults.sessions, record.max_websockets or defaults.websockets)
    return Principal(record.name, record.priority, _rate_limit(record), authenticated=True,
                     slo_class=record.slo_class or record.priority, admin=record.admin, holds=holds)


def bearer_token(authorization: str | None) -> str:
    """The key in `Authorization: Bearer KEY`; AuthError when absent or not Bearer."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if not scheme:
        raise AuthError(MISSING_KEY_MESSAGE, "missing_api_key")
    if scheme.lower() != "bearer":
        raise AuthError("The Authorization header must use the Bearer scheme.", "invalid_api_key")
    if not token.strip():
        raise AuthError(MISSING_KEY_MESSAGE, "missing_api_key")
    return token.strip()


def _check_unique(records: list[ApiKeyRecord]) -> None:
    names = [record.name for record in records]
    digests = [record.sha256.lower() for record in records]
    if len(set(names)) != len(names):
        raise ValueError("api key names must be unique")
    if len(set(digests)) != len(digests):
        raise ValueError("api key hashes must be unique")


class KeyRing:
    def __init__(self, records: Iterable[ApiKeyRecord], enabled: bool, defaults: HoldLimits = HoldLimits()) -> None:
        self._records = list(records)
        self.enabled = enabled
        self.defaults = defaults  # hold limits of keys that set none, and of the anonymous principal
        _check_unique(self._records)
        if enabled and not self._records:
            raise ValueError("auth is enabled but no api keys are configured")

    @classmethod
    def from_config(cls, entries: Iterable[Mapping[str, Any] | ApiKeyRecord], enabled: bool,
                    defaults: HoldLimits = HoldLimits()) -> KeyRing:
        records = TypeAdapter(list[ApiKeyRecord]).validate_python(list(entries))
        return cls(records, enabled, defaults)

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal for an `Authorization` header value; AuthError (401) when the key is missing or wrong."""
        if not self.enabled:
            return replace(ANONYMOUS_PRINCIPAL, holds=self.defaults)
        return self._principal(authorization)

    def authenticate_admin(self, authorization: str | None) -> Principal:
        """The principal of an admin key, whether or not auth is enabled: AuthError (401) for a missing or wrong
        key, 403 for a key without `admin`."""
        principal = self._principal(authorization)
        if not principal.admin:
            raise AuthError(f"key {principal.name!r} is not an admin key; the admin endpoints need a key with "
                            "admin: true in api_keys", "admin_key_required", status=403)
        return principal

    def _principal(self, authorization: str | None) -> Principal:
        record = self._find(hashlib.sha256(bearer_token(authorization).encode()).digest())
        if record is None:
            raise AuthError("Incorrect API key provided.", "invalid_api_key")
        return principal_for(record, self.defaults)

    def _find(self, digest: bytes) -> ApiKeyRecord | None:
        found = None
        for record in self._records:  # no early exit: time does not depend on which record matches
            if hmac.compare_digest(record.digest, digest):
                found = record
        return found
