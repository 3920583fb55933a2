"""Token-bucket rate limits per principal: `rate` requests per second, at most `burst` at once. In process
memory, or in Redis (one atomic Lua script per request, idle buckets expire) so gateway replicas share them."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as redis

KEY_PREFIX = "agentserve:ratelimit:"
EPSILON = 1e-9  # float noise in a refill must not turn a whole token into a rejection
MAX_MEMORY_BUCKETS = 100_000


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    retry_after_s: float  # 0 when allowed; else when the next token is there
    remaining: float  # tokens left in the bucket after this request


@dataclass(frozen=True)
class Bucket:
    tokens: float
    updated_at: float


class RateLimiter(Protocol):
    async def acquire(self, key: str, rate: float, burst: int, now: float | None = None) -> RateDecision: ...

    async def close(self) -> None: ...


def check_limits(rate: float, burst: int) -> None:
    if not rate > 0 or burst < 1:
        raise ValueError(f"rate limit needs rate > 0 and burst >= 1, got rate={rate}, burst={burst}")


def take(bucket: Bucket | None, rate: float, burst: int, now: float) -> tuple[Bucket, RateDecision]:
    """One request against a bucket: the bucket after it and the decision."""
    bucket = bucket or Bucket(float(burst), now)
    tokens = min(float(burst), bucket.tokens + max(0.0, now - bucket.updated_at) * rate)
    updated_at = max(now, bucket.updated_at)
    if tokens >= 1 - EPSILON:
        tokens = max(0.0, tokens - 1)
        return Bucket(tokens, updated_at), RateDecision(True, 0.0, tokens)
    return Bucket(tokens, updated_at), RateDecision(False, (1 - tokens) / rate, tokens)


class MemoryRateLimiter:
    """Buckets in this process; `now` defaults to the monotonic clock."""

    def __init__(self, max_buckets: int = MAX_MEMORY_BUCKETS) -> None:
        self._buckets: dict[str, tuple[Bucket, float]] = {}  # key -> (bucket, full again at)
        self._max_buckets = max_buckets

    @property
    def num_buckets(self) -> int:
        return len(self._buckets)

    async def acquire(self, key: str, rate: float, burst: int, now: float | None = None) -> RateDecision:
        check_limits(rate, burst)
        now = time.monotonic() if now is None else now
        entry = self._buckets.get(key)
        bucket, decision = take(entry[0] if entry else None, rate, burst, now)
        full_at = bucket.updated_at + (burst - bucket.tokens) / rate
        self._buckets[key] = (bucket, full_at)
        if len(self._buckets) > self._max_buckets:
            self._drop_full(now)
        return decision

    def _drop_full(self, now: float) -> None:
        self._buckets = {key: entry for key, entry in self._buckets.items() if entry[1] > now}

    async def close(self) -> None:
        self._buckets.clear()


# KEYS[1]: the bucket hash. ARGV: rate, burst, now in seconds ("" = the Redis server's clock), epsilon.
TOKEN_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local epsilon = tonumber(ARGV[4])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local ts = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local allowed = 0
local retry = 0
if tokens >= 1 - epsilon then
  tokens = math.max(0, tokens - 1)
  allowed = 1
else
  retry = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.17g', math.max(now, ts)))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {allowed, string.format('%.17g', retry), string.format('%.17g', tokens)}
"""


class RedisRateLimiter:
    """Buckets in Redis, shared by every limiter on the same server. `now` defaults to the Redis server's clock,
    the one clock all replicas agree on; pass `now` only from a clock every replica shares."""

    def __init__(self, client: redis.Redis, key_prefix: str = KEY_PREFIX) -> None:
        self._redis = client
        self._key_prefix = key_prefix
        self._script = client.register_script(TOKEN_BUCKET_LUA)

    @classmethod
    def from_url(cls, url: str, key_prefix: str = KEY_PREFIX) -> RedisRateLimiter:
        return cls(redis.Redis.from_url(url), key_prefix)

    async def acquire(self, key: str, rate: float, burst: int, now: float | None = None) -> RateDecision:
        check_limits(rate, burst)
        args = [repr(float(rate)), str(burst), "" if now is None else repr(float(now)), repr(EPSILON)]
        allowed, retry_after, remaining = await self._script(keys=[self._key_prefix + key], args=args)
        return RateDecision(bool(allowed), float(retry_after), float(remaining))

    async def close(self) -> None:
        await self._redis.aclose()


def open_rate_limiter(redis_url: str | None) -> RateLimiter:
    return RedisRateLimiter.from_url(redis_url) if redis_url else MemoryRateLimiter()


def retry_after_header(decision: RateDecision) -> str:
    """`Retry-After` takes whole seconds; round up so a client that waits that long gets through."""
    return str(max(1, math.ceil(decision.retry_after_s)))
