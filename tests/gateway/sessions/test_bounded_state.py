"""Bounded state: the session store (memory and Redis) drops expired sessions and response records without
waiting for a read, counts sessions without scanning, and limits what a key holds; the gateway's per-session
maps shrink when sessions expire; the phase monitor keeps only its latest shift events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest
import redis

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.server.app import create_app
from gateway.sessions.store import (
    REDIS_PREFIX,
    SESSION_INDEX,
    MemorySessionStore,
    RedisSessionStore,
    StoreKey,
    owner_index,
    session_key,
)
from gateway.settings import GatewaySettings
from tests.conftest import free_port, wait_for
from tests.gateway.conftest import serving
from trajectory.phase.classifier import DetectorConfig, Phase, PhaseConfig, PhaseEstimate, PhaseShiftEvent
from trajectory.phase.monitor import MAX_EVENTS, PhaseMixMonitor


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def response(owner: str, response_id: str) -> StoreKey:
    return StoreKey("response", owner, response_id)


async def test_the_memory_store_drops_expired_entries_on_a_write_without_reading_them() -> None:
    clock = Clock()
    store = MemorySessionStore(clock)
    for index in range(50):  # what every /v1/responses call writes: its session and its record
        await store.put(session_key("alice", f"s{index}"), b"session", ttl_s=10)
        await store.put(response("alice", f"r{index}"), b"record", ttl_s=10)
    assert await store.count() == 50
    clock.now = 11
    await store.put(session_key("bob", "fresh"), b"session", ttl_s=10)
    alone = MemorySessionStore(clock)
    await alone.put(session_key("bob", "fresh"), b"session", ttl_s=10)
    assert len(store) == len(alone)  # nothing of the 100 expired entries is left
    assert await store.count() == 1 and await store.get(session_key("alice", "s0")) is None


async def test_the_memory_store_counts_without_a_write_and_keeps_its_heap_bounded() -> None:
    clock = Clock()
    store = MemorySessionStore(clock)
    await store.put(session_key("alice", "short"), b"x", ttl_s=1)
    await store.put(session_key("alice", "long"), b"x", ttl_s=100)
    clock.now = 2
    assert await store.count() == 1  # expired: not counted, and gone
    for turn in range(5000):  # one long session: every turn re-times it
        clock.now = 2 + turn * 0.001
        await store.put(session_key("alice", "long"), b"x" * (turn % 7), ttl_s=100)
    assert len(store) < 200


async def test_the_memory_store_limits_the_sessions_a_key_holds() -> None:
    clock = Clock()
    store = MemorySessionStore(clock)
    for name in ("one", "two"):
        assert (await store.claim(session_key("carol", name), limit=2, ttl_s=10)).granted
        await store.put(session_key("carol", name), b"x", ttl_s=10)
        clock.now += 1
    refused = await store.claim(session_key("carol", "three"), limit=2, ttl_s=10)
    assert not refused.granted and refused.retry_after_s == pytest.approx(8)  # when "one" expires
    assert (await store.claim(session_key("carol", "one"), limit=2, ttl_s=10)).granted  # held: continues
    assert (await store.claim(session_key("dave", "three"), limit=2, ttl_s=10)).granted  # another key's own
    clock.now = 11
    assert (await store.claim(session_key("carol", "three"), limit=2, ttl_s=10)).granted
    await store.delete(session_key("carol", "three"))
    assert await store.count() == 0


@pytest.fixture
def redis_db(redis_url: str) -> Callable[[int], str]:
    """A Redis database of its own for a test (the server is shared): its URL, emptied first."""

    def select(db: int) -> str:
        url = redis_url.rsplit("/", 1)[0] + f"/{db}"
        redis.Redis.from_url(url).flushdb()
        return url

    return select


async def test_the_redis_store_counts_from_its_index_and_prunes_it(redis_db: Callable[[int], str]) -> None:
    url = redis_db(3)
    raw = redis.Redis.from_url(url)
    store, other_replica = RedisSessionStore(url), RedisSessionStore(url)
    try:
        for index in range(3):
            await store.put(session_key("alice", f"s{index}"), b"session", ttl_s=3.0)
        await store.put(response("alice", "r0"), b"record", ttl_s=3.0)
        await store.put(session_key("bob", "kept"), b"session", ttl_s=600)
        assert await other_replica.count() == 4  # sessions only, every replica's
        for _ in range(300):  # alice's expire after 3 s; bounded at 30 s
            if raw.ttl(REDIS_PREFIX + session_key("alice", "s2").path) == -2:
                break
            await asyncio.sleep(0.1)
        assert await other_replica.count() == 1
        assert raw.zcard(SESSION_INDEX) == 1 and not raw.exists(owner_index("alice"))  # pruned, index expired
        await store.delete(session_key("bob", "kept"))
        assert await store.count() == 0 and raw.zcard(owner_index("bob")) == 0
    finally:
        await store.close()
        await other_replica.close()


async def test_the_redis_store_limits_a_keys_sessions_across_replicas(redis_db: Callable[[int], str]) -> None:
    url = redis_db(4)
    first, second = RedisSessionStore(url), RedisSessionStore(url)
    try:
        for name, store in (("one", first), ("two", second)):
            assert (await store.claim(session_key("carol", name), limit=2, ttl_s=30)).granted
            await store.put(session_key("carol", name), b"x", ttl_s=30)
        refused = await second.claim(session_key("carol", "three"), limit=2, ttl_s=30)
        assert not refused.granted and 25 < refused.retry_after_s <= 30
        assert (await first.claim(session_key("carol", "two"), limit=2, ttl_s=30)).granted
        await first.delete(session_key("carol", "one"))
        assert (await second.claim(session_key("carol", "three"), limit=2, ttl_s=30)).granted
    finally:
        await first.close()
        await second.close()


def commands(client: redis.Redis, name: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{name}")
    return int(stats["calls"]) if stats else 0


def test_metrics_count_sessions_without_a_scan(redis_db: Callable[[int], str]) -> None:
    url = redis_db(5)
    settings = GatewaySettings(model="tiny", port=free_port(), redis_url=url, default_max_tokens=2)
    app = create_app(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=256)))
    raw = redis.Redis.from_url(url)
    with serving(app, settings.port) as base:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "a"}]}
        httpx.post(f"{base}/v1/chat/completions", json=chat, headers={"X-Session-Id": "chat-1"},
                   timeout=30).raise_for_status()
        httpx.post(f"{base}/v1/responses", json={"model": "tiny", "input": "b"}, timeout=30).raise_for_status()
        before = {name: commands(raw, name) for name in ("scan", "keys")}
        text = httpx.get(f"{base}/metrics", timeout=10).text
        assert {name: commands(raw, name) for name in ("scan", "keys")} == before
    assert "agentserve:num_sessions 2.0" in text.splitlines()  # the chat and the Responses session, no record


def test_the_gateways_per_session_state_shrinks_when_sessions_expire() -> None:
    ttl_s = 5.0  # the first six turns take well under it, even on a slow host
    settings = GatewaySettings(model="tiny", port=free_port(), session_ttl_s=ttl_s, default_max_tokens=2)
    app = create_app(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=256)))
    gw = app.state.gateway
    with serving(app, settings.port) as base:
        for index in range(3):
            httpx.post(f"{base}/v1/responses", json={"model": "tiny", "input": f"task {index}"},
                       timeout=30).raise_for_status()
            httpx.post(f"{base}/v1/chat/completions", headers={"X-Session-Id": f"chat-{index}"}, timeout=30,
                       json={"model": "tiny", "messages": [{"role": "user", "content": f"task {index}"}]})
        assert wait_for(lambda: len(gw.signals.last_arrival) >= 6)  # recorded once each reply is out
        time.sleep(ttl_s + 0.2)  # a lower bound: a slower host only lets more expire
        httpx.post(f"{base}/v1/chat/completions", headers={"X-Session-Id": "late"}, timeout=30,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "late"}]}).raise_for_status()
        alone = MemorySessionStore()
        asyncio.run(alone.put(session_key("anonymous", "late"), b"x", ttl_s=ttl_s))
        assert len(gw.sessions.store) == len(alone)  # 6 sessions and 3 response records gone unread
        late = [session_key("anonymous", "late").path]
        # the turn's signals are recorded once its reply is out: the client may see it first
        assert wait_for(lambda: list(gw.signals.last_arrival) == late)


def test_the_phase_monitor_keeps_only_its_latest_shift_events() -> None:
    detector = DetectorConfig(warmup_turns=1, refractory_s=0.0, threshold=0.5, min_shift=0.2)
    monitor = PhaseMixMonitor(PhaseConfig(detector=detector), clock=lambda: 0.0)
    received: list[PhaseShiftEvent] = []
    monitor.subscribe(received.append)
    for turn in range(2 * MAX_EVENTS):  # the mix swings between think and act at every turn
        monitor.observe_turn("s", PhaseEstimate(Phase.THINK if turn % 2 else Phase.ACT, 1.0), 10, now=turn * 0.01)
    assert len(received) > MAX_EVENTS
    assert len(monitor.events) == MAX_EVENTS and monitor.events == received[-MAX_EVENTS:]
