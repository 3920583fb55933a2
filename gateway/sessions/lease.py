"""One turn of a session at a time, across every gateway replica sharing a store.

Within one process the session manager's lock orders a session's turns. Replicas sharing a Redis also
take a lease on the session (`SET NX PX` of a random token), renewed while the turn runs and released
only by its holder, so two replicas never load the same version of a session and both save over it.
A replica that dies holding a lease loses it when the lease expires (`LEASE_TTL_MS`), not when its turn
would have ended. A turn that cannot get the lease within its wait is refused with `SessionBusy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import redis.asyncio as redis

LEASE_TTL_MS = 10_000  # renewed every third of it while the turn runs
POLL_S = (0.005, 0.1)  # the first and the longest pause between tries to take a held lease
# KEYS: the lease. ARGV: the holder's token, ttl ms. Extends the lease only if the token still holds it.
RENEW_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end\nreturn 0"
# KEYS: the lease. ARGV: the holder's token. Releases the lease only if the token still holds it.
RELEASE_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\nreturn 0"


class SessionBusy(Exception):
    def __init__(self, path: str, waited_s: float) -> None:
        super().__init__(f"session {path} is in a turn on another replica (waited {waited_s:.1f} s)")
        self.waited_s = waited_s


class RedisLeases:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._redis = client
        self._prefix = prefix
        self._renew = client.register_script(RENEW_LUA)
        self._release = client.register_script(RELEASE_LUA)

    @contextlib.asynccontextmanager
    async def hold(self, path: str, wait_s: float) -> AsyncIterator[None]:
        key, token = f"{self._prefix}lease:{path}", uuid.uuid4().hex
        await self._take(key, token, path, wait_s)
        renewal = asyncio.create_task(self._keep(key, token))
        try:
            yield
        finally:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal
            await asyncio.shield(self._release(keys=[key], args=[token]))

    async def _take(self, key: str, token: str, path: str, wait_s: float) -> None:
        start, pause = time.monotonic(), POLL_S[0]
        while not await self._redis.set(key, token, nx=True, px=LEASE_TTL_MS):
            waited = time.monotonic() - start
            if waited >= wait_s:
                raise SessionBusy(path, waited)
            await asyncio.sleep(min(pause, wait_s - waited))
            pause = min(2 * pause, POLL_S[1])

    async def _keep(self, key: str, token: str) -> None:
        while True:
            await asyncio.sleep(LEASE_TTL_MS / 3000)
            await self._renew(keys=[key], args=[token, LEASE_TTL_MS])
