"""Where sessions live between turns: process memory by default, Redis when `AGENTSERVE_REDIS_URL` is set,
so gateway replicas sharing one Redis continue each other's sessions. Values are the trajectory's
compact serialised form; the store never looks inside."""

from __future__ import annotations

import time
from typing import Protocol

import redis.asyncio as redis

KEY_PREFIX = "agentserve:session:"


class SessionStore(Protocol):
    async def get(self, session_id: str) -> bytes | None: ...

    async def put(self, session_id: str, data: bytes, ttl_s: float) -> None: ...

    async def delete(self, session_id: str) -> None: ...

    async def count(self) -> int: ...

    async def close(self) -> None: ...


class MemorySessionStore:
    def __init__(self) -> None:
        self._items: dict[str, tuple[bytes, float]] = {}  # session id -> (data, expires at, monotonic)

    async def get(self, session_id: str) -> bytes | None:
        item = self._items.get(session_id)
        if item is None or item[1] <= time.monotonic():
            self._items.pop(session_id, None)
            return None
        return item[0]

    async def put(self, session_id: str, data: bytes, ttl_s: float) -> None:
        self._items[session_id] = (data, time.monotonic() + ttl_s)

    async def delete(self, session_id: str) -> None:
        self._items.pop(session_id, None)

    async def count(self) -> int:
        now = time.monotonic()
        return sum(expires > now for _, expires in self._items.values())

    async def close(self) -> None:
        self._items.clear()


class RedisSessionStore:
    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url)

    async def get(self, session_id: str) -> bytes | None:
        data = await self._redis.get(KEY_PREFIX + session_id)
        return data if isinstance(data, bytes) else None  # the client is left in bytes mode

    async def put(self, session_id: str, data: bytes, ttl_s: float) -> None:
        await self._redis.set(KEY_PREFIX + session_id, data, px=max(1, int(ttl_s * 1000)))

    async def delete(self, session_id: str) -> None:
        await self._redis.delete(KEY_PREFIX + session_id)

    async def count(self) -> int:
        """Sessions of every replica sharing this Redis (a SCAN: fine at scrape intervals)."""
        return sum([1 async for _ in self._redis.scan_iter(match=KEY_PREFIX + "*", count=1000)])

    async def close(self) -> None:
        await self._redis.aclose()


def open_session_store(redis_url: str | None) -> SessionStore:
    return RedisSessionStore(redis_url) if redis_url else MemorySessionStore()
