"""Token buckets in memory and in a real Redis: burst, rejection with retry-after, refill, shared buckets."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from gateway.ratelimit import (
    KEY_PREFIX,
    MemoryRateLimiter,
    RateLimiter,
    RedisRateLimiter,
    open_rate_limiter,
    retry_after_header,
)

T0 = 1_000_000.0


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    made = MemoryRateLimiter() if request.param == "memory" else RedisRateLimiter.from_url(
        request.getfixturevalue("redis_url"))
    yield made
    await made.close()


def fresh_key() -> str:
    return f"test-{uuid.uuid4().hex}"


async def test_burst_then_rejection_with_retry_after(limiter: RateLimiter) -> None:
    key = fresh_key()
    decisions = [await limiter.acquire(key, rate=2.0, burst=3, now=T0) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions[:3]] == [2.0, 1.0, 0.0]
    assert decisions[0].retry_after_s == 0.0
    assert decisions[3].retry_after_s == pytest.approx(0.5)
    assert retry_after_header(decisions[3]) == "1"


async def test_refill_over_injected_time(limiter: RateLimiter) -> None:
    key = fresh_key()
    for _ in range(2):
        await limiter.acquire(key, rate=4.0, burst=2, now=T0)
    early = await limiter.acquire(key, rate=4.0, burst=2, now=T0 + 0.125)
    assert not early.allowed and early.retry_after_s == pytest.approx(0.125)
    assert (await limiter.acquire(key, rate=4.0, burst=2, now=T0 + 0.25)).allowed
    assert not (await limiter.acquire(key, rate=4.0, burst=2, now=T0 + 0.25)).allowed
    long_idle = [await limiter.acquire(key, rate=4.0, burst=2, now=T0 + 100) for _ in range(3)]
    assert [d.allowed for d in long_idle] == [True, True, False]  # refill stops at burst


async def test_rejections_do_not_consume_tokens(limiter: RateLimiter) -> None:
    key = fresh_key()
    await limiter.acquire(key, rate=1.0, burst=1, now=T0)
    for step in range(5):
        assert not (await limiter.acquire(key, rate=1.0, burst=1, now=T0 + step * 0.1)).allowed
    assert (await limiter.acquire(key, rate=1.0, burst=1, now=T0 + 1.0)).allowed


async def test_keys_are_independent(limiter: RateLimiter) -> None:
    first, second = fresh_key(), fresh_key()
    assert (await limiter.acquire(first, rate=1.0, burst=1, now=T0)).allowed
    assert not (await limiter.acquire(first, rate=1.0, burst=1, now=T0)).allowed
    assert (await limiter.acquire(second, rate=1.0, burst=1, now=T0)).allowed


async def test_clock_going_backwards_neither_refills_nor_breaks(limiter: RateLimiter) -> None:
    key = fresh_key()
    await limiter.acquire(key, rate=1.0, burst=1, now=T0 + 10)
    behind = await limiter.acquire(key, rate=1.0, burst=1, now=T0)
    assert not behind.allowed and behind.retry_after_s == pytest.approx(1.0)
    assert (await limiter.acquire(key, rate=1.0, burst=1, now=T0 + 11)).allowed


async def test_default_clock_allows_a_burst(limiter: RateLimiter) -> None:
    key = fresh_key()
    decisions = [await limiter.acquire(key, rate=0.01, burst=2) for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert 90 < decisions[2].retry_after_s <= 100


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (-1.0, 1), (1.0, 0), (float("nan"), 1)])
async def test_bad_limits_are_refused(limiter: RateLimiter, rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="rate limit"):
        await limiter.acquire(fresh_key(), rate=rate, burst=burst, now=T0)


async def test_two_redis_limiters_share_one_bucket(redis_url: str) -> None:
    first, second = RedisRateLimiter.from_url(redis_url), RedisRateLimiter.from_url(redis_url)
    key = fresh_key()
    try:
        assert (await first.acquire(key, rate=1.0, burst=2, now=T0)).allowed
        assert (await second.acquire(key, rate=1.0, burst=2, now=T0)).allowed
        denied = await first.acquire(key, rate=1.0, burst=2, now=T0 + 0.25)
        assert not denied.allowed and denied.retry_after_s == pytest.approx(0.75)
        assert (await second.acquire(key, rate=1.0, burst=2, now=T0 + 1.0)).allowed
    finally:
        await first.close()
        await second.close()


async def test_concurrent_redis_acquires_never_exceed_the_burst(redis_url: str) -> None:
    limiters = [RedisRateLimiter.from_url(redis_url) for _ in range(2)]
    key = fresh_key()
    try:
        decisions = await asyncio.gather(*(limiters[i % 2].acquire(key, rate=0.001, burst=5) for i in range(20)))
        assert sum(d.allowed for d in decisions) == 5
    finally:
        for limiter in limiters:
            await limiter.close()


async def test_redis_buckets_expire_once_they_would_be_full(redis_url: str) -> None:
    limiter, client = RedisRateLimiter.from_url(redis_url), redis.Redis.from_url(redis_url)
    key = fresh_key()
    try:
        await limiter.acquire(key, rate=2.0, burst=10, now=T0)
        ttl_ms = await client.pttl(KEY_PREFIX + key)
        assert 5_000 < ttl_ms <= 6_000  # burst / rate = 5 s to refill, plus a second of slack
    finally:
        await limiter.close()
        await client.aclose()


async def test_memory_limiter_drops_full_buckets_past_its_cap() -> None:
    limiter = MemoryRateLimiter(max_buckets=2)
    await limiter.acquire("a", rate=1.0, burst=1, now=T0)
    await limiter.acquire("b", rate=1.0, burst=1, now=T0)
    assert limiter.num_buckets == 2
    await limiter.acquire("c", rate=1.0, burst=1, now=T0 + 5)  # a and b are full again by now
    assert limiter.num_buckets == 1
    assert not (await limiter.acquire("c", rate=1.0, burst=1, now=T0 + 5)).allowed
    assert (await limiter.acquire("a", rate=1.0, burst=1, now=T0 + 5)).allowed


async def test_memory_limiter_keeps_buckets_still_refilling() -> None:
    limiter = MemoryRateLimiter(max_buckets=1)
    await limiter.acquire("a", rate=1.0, burst=1, now=T0)
    await limiter.acquire("b", rate=1.0, burst=1, now=T0 + 0.5)
    assert limiter.num_buckets == 2
    assert not (await limiter.acquire("a", rate=1.0, burst=1, now=T0 + 0.5)).allowed


async def test_open_rate_limiter_picks_the_backend(redis_url: str) -> None:
    memory, shared = open_rate_limiter(None), open_rate_limiter(redis_url)
    assert isinstance(memory, MemoryRateLimiter) and isinstance(shared, RedisRateLimiter)
    assert (await shared.acquire(fresh_key(), rate=1.0, burst=1)).allowed
    await memory.close()
    await shared.close()
