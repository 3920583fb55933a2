"""Session leases on a real Redis: one holder at a time, a waiter refused after its wait, a lease kept past
its TTL while the turn runs, and a dead holder's lease expiring."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as redis

from gateway.errors import APIError
from gateway.sessions import lease as session_lease
from gateway.sessions.lease import RedisLeases, SessionBusy
from gateway.sessions.manager import SessionManager
from gateway.sessions.store import MemorySessionStore, RedisSessionStore, session_key


def a_path() -> str:
    return f"session:alice:{uuid.uuid4().hex}"


async def test_a_second_holder_waits_for_the_first_then_takes_the_lease(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    leases, path, order = RedisLeases(client, "test:"), a_path(), []
    first_in, second_waits = asyncio.Event(), asyncio.Event()

    async def turn(name: str, entered: asyncio.Event, leave: asyncio.Event | None) -> None:
        async with leases.hold(path, wait_s=60.0):
            order.append(f"{name} in")
            entered.set()
            if leave is not None:
                await leave.wait()
            order.append(f"{name} out")

    first = asyncio.create_task(turn("first", first_in, second_waits))
    await first_in.wait()
    second = asyncio.create_task(turn("second", asyncio.Event(), None))
    await asyncio.sleep(0.3)  # the second holder is waiting (or, on a slow host, about to): either way it must wait
    second_waits.set()
    await asyncio.gather(first, second)
    assert order == ["first in", "first out", "second in", "second out"]
    assert await client.get(f"test:lease:{path}") is None  # released
    await client.aclose()


async def test_a_waiter_is_refused_after_its_wait(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    leases, path = RedisLeases(client, "test:"), a_path()
    async with leases.hold(path, wait_s=1.0):
        with pytest.raises(SessionBusy) as busy:
            async with leases.hold(path, wait_s=0.2):
                pass
        assert await client.get(f"test:lease:{path}") is not None  # refused while the first still holds it
    assert busy.value.waited_s >= 0.2
    await client.aclose()


async def test_a_running_turn_keeps_its_lease_past_the_ttl_and_a_dead_holder_loses_it(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_lease, "LEASE_TTL_MS", 1000)  # renewed every 333 ms: a stall under 667 ms is fine
    client = redis.Redis.from_url(redis_url)
    leases, path = RedisLeases(client, "test:"), a_path()
    async with leases.hold(path, wait_s=1.0):
        await asyncio.sleep(2.5)  # more than twice the TTL: renewed
        with pytest.raises(SessionBusy):
            async with leases.hold(path, wait_s=0.1):
                pass
    await client.set(f"test:lease:{path}", "a replica that died", px=1000)  # never renewed, never released
    async with leases.hold(path, wait_s=30.0):
        assert (await client.get(f"test:lease:{path}")) != b"a replica that died"
    await client.aclose()


async def test_the_session_manager_answers_a_busy_session_with_409(redis_url: str) -> None:
    store = RedisSessionStore(redis_url)
    manager = SessionManager(store, None, None, None, ttl_s=60, lease_wait_s=0.1)  # type: ignore[arg-type]
    key = session_key("alice", uuid.uuid4().hex)
    async with store.lease(key, wait_s=1.0):  # another replica's turn
        with pytest.raises(APIError) as refused:
            async with manager.open(key):
                pass
    assert refused.value.status == 409 and refused.value.code == "session_busy"
    assert refused.value.headers == {"Retry-After": "1"}
    await store.close()


async def test_the_memory_store_lease_never_blocks() -> None:
    store = MemorySessionStore()
    key = session_key("alice", "s")
    async with store.lease(key, wait_s=0.0), store.lease(key, wait_s=0.0):
        pass
