"""Where sessions and response records live between turns: process memory by default, Redis when
`AGENTSERVE_REDIS_URL` is set, so gateway replicas sharing one Redis continue each other's sessions.

Every entry has an owner: a `StoreKey` names its kind (a session, or a response's record), the principal
that owns it and the id the client knows it by, so one API key never reaches another's entries and a
session id never collides with a response id. Sessions are also indexed by expiry, per owner and
overall, so counting the sessions held (`/metrics`, the per-key limit) never scans the store, and expired
entries leave memory without waiting for a read. Values are opaque bytes: the store never looks inside.

A session put with `keep_previous` keeps the value it replaces readable under `key.previous` (for the same
TTL): a client whose acknowledgement of a turn was lost can continue from the turn before
(`gateway.api.responses.http`).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import quote

import redis.asyncio as redis

from gateway.sessions.lease import RedisLeases

Kind = Literal["session", "response", "previous"]  # previous: a session one turn back
REDIS_PREFIX = "agentserve:"
KEY_PREFIX = REDIS_PREFIX + "session:"  # every session's Redis key starts so
SESSION_INDEX = REDIS_PREFIX + "index:sessions"  # sorted set: session path -> expiry (ms, Redis clock)


@dataclass(frozen=True, order=True)
class StoreKey:
    kind: Kind
    owner: str  # the principal's name
    id: str  # the id the client knows it by

    @property
    def path(self) -> str:
        """`kind:owner:id`, the owner percent-encoded (no `:`), so no owner's ids can pass for another's."""
        return f"{self.kind}:{quote(self.owner, safe='')}:{self.id}"

    @property
    def previous(self) -> StoreKey:
        """Where a session's value before its latest `put(..., keep_previous=True)` is kept."""
        return StoreKey("previous", self.owner, self.id)


def session_key(owner: str, session_id: str) -> StoreKey:
    return StoreKey("session", owner, session_id)


@dataclass(frozen=True)
class Claim:
    granted: bool
    retry_after_s: float = 0.0  # refused: until the owner's oldest session expires


class SessionStore(Protocol):
    async def get(self, key: StoreKey) -> bytes | None: ...

    async def put(self, key: StoreKey, data: bytes, ttl_s: float, keep_previous: bool = False) -> None:
        """Store `data` for `ttl_s`; with `keep_previous` (sessions), the value it replaces goes to `key.previous`."""
        ...

    async def delete(self, key: StoreKey) -> None: ...

    async def claim(self, key: StoreKey, limit: int, ttl_s: float) -> Claim:
        """Reserve a place for a new session of `key.owner`, unless it already holds `limit` sessions."""
        ...

    async def count(self) -> int:
        """Live sessions of every owner (of every replica sharing the store)."""
        ...

    def lease(self, key: StoreKey, wait_s: float) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold `key` for one turn against other processes sharing the store (SessionBusy after `wait_s`)."""
        ...

    async def close(self) -> None: ...


class MemorySessionStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._items: dict[StoreKey, tuple[bytes, float]] = {}  # key -> (data, expires at)
        self._held: dict[str, dict[str, float]] = {}  # owner -> session id -> expires at (claims included)
        self._expiries: list[tuple[float, int, StoreKey]] = []  # a heap; entries a later put outdated are skipped
        self._order = itertools.count()  # ties in the heap never compare keys

    def __len__(self) -> int:
        """Entries held, expired ones not yet swept included."""
        return len(self._items) + sum(map(len, self._held.values())) + len(self._expiries)

    async def get(self, key: StoreKey) -> bytes | None:
        self._sweep()
        item = self._items.get(key)
        return item[0] if item is not None and item[1] > self._clock() else None

    async def put(self, key: StoreKey, data: bytes, ttl_s: float, keep_previous: bool = False) -> None:
        self._sweep()
        expires = self._clock() + ttl_s
        replaced = self._items.get(key)
        if keep_previous and replaced is not None and replaced[1] > self._clock():
            self._items[key.previous] = (replaced[0], expires)
            self._track(key.previous, expires)
        self._items[key] = (data, expires)
        if key.kind == "session":
            self._held.setdefault(key.owner, {})[key.id] = expires
        self._track(key, expires)

    async def delete(self, key: StoreKey) -> None:
        self._items.pop(key, None)
        self._items.pop(key.previous, None)
        self._release(key)

    async def claim(self, key: StoreKey, limit: int, ttl_s: float) -> Claim:
        self._sweep()
        held = self._held.setdefault(key.owner, {})
        if key.id in held or len(held) < limit:
            held[key.id] = max(held.get(key.id, 0.0), self._clock() + ttl_s)
            self._track(key, held[key.id])
            return Claim(True)
        return Claim(False, max(0.0, min(held.values()) - self._clock()))

    async def count(self) -> int:
        self._sweep()
        return sum(key.kind == "session" for key in self._items)

    @contextlib.asynccontextmanager
    async def lease(self, key: StoreKey, wait_s: float) -> AsyncIterator[None]:
        yield  # one process holds this store: the session manager's lock already orders its turns

    async def close(self) -> None:
        self._items.clear()
        self._held.clear()
        self._expiries.clear()

    def _track(self, key: StoreKey, expires: float) -> None:
        heapq.heappush(self._expiries, (expires, next(self._order), key))
        if len(self._expiries) > 2 * (len(self._items) + sum(map(len, self._held.values()))) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop heap entries a later put or claim outdated."""
        live = {(key, expires) for key, (_, expires) in self._items.items()}
        live |= {(StoreKey("session", owner, id_), at) for owner, ids in self._held.items() for id_, at in ids.items()}
        self._expiries = [entry for entry in self._expiries if (entry[2], entry[0]) in live]
        heapq.heapify(self._expiries)

    def _sweep(self) -> None:
        now = self._clock()
        while self._expiries and self._expiries[0][0] <= now:
            _, _, key = heapq.heappop(self._expiries)
            item = self._items.get(key)
            if item is not None and item[1] <= now:
                del self._items[key]
            if self._held.get(key.owner, {}).get(key.id, now + 1) <= now:
                self._release(key)

    def _release(self, key: StoreKey) -> None:
        held = self._held.get(key.owner)
        if key.kind != "session" or held is None:
            return
        held.pop(key.id, None)
        if not held:
            del self._held[key.owner]


# Times are the Redis server's (TIME), the one clock every replica agrees on, in milliseconds.
NOW_MS = "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
# An index entry for a member expiring in ARGV ttl; the index expires with its last member.
INDEX = """
local function index(key, member, ttl)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('ZADD', key, now + ttl, member)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end
"""
# KEYS: the session, the index of all sessions, its owner's index, the session's previous value.
# ARGV: data, ttl ms, path, id, "1" to keep the value replaced as the previous one.
PUT_SESSION_LUA = NOW_MS + INDEX + """
local ttl = tonumber(ARGV[2])
local replaced = ARGV[5] == '1' and redis.call('GET', KEYS[1])
if replaced then redis.call('SET', KEYS[4], replaced, 'PX', ttl) end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
index(KEYS[2], ARGV[3], ttl)
index(KEYS[3], ARGV[4], ttl)
"""
# KEYS: the owner's index. ARGV: session id, limit, ttl ms. Returns {granted, ms until a place frees}.
CLAIM_LUA = NOW_MS + INDEX + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  index(KEYS[1], ARGV[1], tonumber(ARGV[3]))
  return {1, 0}
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, tonumber(oldest[2]) - now}
"""
# KEYS: the index of all sessions.
COUNT_LUA = NOW_MS + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""


def owner_index(owner: str) -> str:
    return f"{SESSION_INDEX}:{quote(owner, safe='')}"


class RedisSessionStore:
    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url)
        self._put_session = self._redis.register_script(PUT_SESSION_LUA)
        self._claim = self._redis.register_script(CLAIM_LUA)
        self._count = self._redis.register_script(COUNT_LUA)
        self._leases = RedisLeases(self._redis, REDIS_PREFIX)

    async def get(self, key: StoreKey) -> bytes | None:
        data = await self._redis.get(REDIS_PREFIX + key.path)
        return data if isinstance(data, bytes) else None  # the client is left in bytes mode

    async def put(self, key: StoreKey, data: bytes, ttl_s: float, keep_previous: bool = False) -> None:
        ttl_ms = max(1, int(ttl_s * 1000))
        if key.kind != "session":
            await self._redis.set(REDIS_PREFIX + key.path, data, px=ttl_ms)
            return
        keys = [REDIS_PREFIX + key.path, SESSION_INDEX, owner_index(key.owner), REDIS_PREFIX + key.previous.path]
        await self._put_session(keys=keys, args=[data, ttl_ms, key.path, key.id, "1" if keep_previous else "0"])

    async def delete(self, key: StoreKey) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(REDIS_PREFIX + key.path)
            if key.kind == "session":
                pipe.delete(REDIS_PREFIX + key.previous.path)
                pipe.zrem(SESSION_INDEX, key.path)
                pipe.zrem(owner_index(key.owner), key.id)
            await pipe.execute()

    async def claim(self, key: StoreKey, limit: int, ttl_s: float) -> Claim:
        granted, wait_ms = await self._claim(keys=[owner_index(key.owner)],
                                             args=[key.id, limit, max(1, int(ttl_s * 1000))])
        return Claim(bool(granted), max(0.0, float(wait_ms) / 1000))

    async def count(self) -> int:
        """Sessions of every replica sharing this Redis: the index, pruned of expired entries (no SCAN)."""
        return int(await self._count(keys=[SESSION_INDEX]))

    def lease(self, key: StoreKey, wait_s: float) -> contextlib.AbstractAsyncContextManager[None]:
        return self._leases.hold(key.path, wait_s)

    async def close(self) -> None:
        await self._redis.aclose()


def open_session_store(redis_url: str | None) -> SessionStore:
    return RedisSessionStore(redis_url) if redis_url else MemorySessionStore()
