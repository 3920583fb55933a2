"""Agent sessions for the gateway: a `Trajectory` loaded from the store for each turn and saved after it.

Chat-completions clients resend the whole conversation every turn; the session remembers a digest of
every message it has seen (including the replies it returned), so only the messages past that prefix
are new. A conversation that no longer extends the session's history starts the session afresh.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from engine.tokenizer import Tokenizer
from gateway.errors import APIError
from gateway.session_lease import SessionBusy
from gateway.session_store import SessionStore, StoreKey
from trajectory.agent import Policies, Trajectory
from trajectory.template_types import ChatTemplate, Message, ToolSchemas


@dataclass
class SessionTurn:
    trajectory: Trajectory
    key: StoreKey | None  # None: a throwaway session, neither saved nor pinned

    @property
    def persistent(self) -> bool:
        """Saved in the store and its KV pinned between turns."""
        return self.key is not None


def message_digest(message: Message) -> str:
    calls = [{"name": c.get("function", {}).get("name"), "arguments": c.get("function", {}).get("arguments")}
             for c in message.tool_calls or []]
    payload = json.dumps([message.role, message.content, calls, message.tool_call_id], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def tools_digest(tools: ToolSchemas | None) -> str:
    payload = json.dumps(list(tools or []), sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


class SessionManager:
    def __init__(self, store: SessionStore, template: ChatTemplate, tokenizer: Tokenizer, policies: Policies,
                 ttl_s: float, lease_wait_s: float = 30.0) -> None:
        self.store = store
        self.lease_wait_s = lease_wait_s  # how long a turn waits for one on another replica to finish
        self.template = template
        self.tokenizer = tokenizer
        self.policies = policies
        self.ttl_s = ttl_s
        self._locks: weakref.WeakValueDictionary[StoreKey, asyncio.Lock] = weakref.WeakValueDictionary()

    @asynccontextmanager
    async def open(self, key: StoreKey | None, tools: ToolSchemas | None = None,
                   max_sessions: int | None = None) -> AsyncIterator[SessionTurn]:
        """The session for one turn, saved afterwards; a throwaway one (not pinned, not saved) without a key.
        A new session needs a place among its owner's `max_sessions` (APIError 429 when none is free); a turn
        of a session in a turn on another replica waits for it, then is refused (APIError 409)."""
        if key is None:
            yield SessionTurn(self._start(f"anon-{uuid.uuid4().hex}", tools), None)
            return
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock, self._lease(key):
            turn = SessionTurn(await self.load(key, tools, max_sessions), key)
            try:
                yield turn
            finally:
                await self.store.put(key, turn.trajectory.to_bytes(), self.ttl_s)

    @asynccontextmanager
    async def _lease(self, key: StoreKey) -> AsyncIterator[None]:
        try:
            async with self.store.lease(key, self.lease_wait_s):
                yield
        except SessionBusy as busy:  # raised only while taking the lease, before the turn starts
            raise APIError(409, f"session {key.id!r} is in a turn on another replica; send the next turn after "
                           f"it ends (waited {busy.waited_s:.1f} s)", "invalid_request_error", None,
                           "session_busy", {"Retry-After": "1"}) from busy

    async def load(self, key: StoreKey, tools: ToolSchemas | None = None,
                   max_sessions: int | None = None) -> Trajectory:
        data = await self.store.get(key)
        if data is not None:
            return Trajectory.restore(data, self.template, self.tokenizer, tools, self.policies)
        if max_sessions is not None:
            await self._claim(key, max_sessions)
        return self._start(key.path, tools)

    async def _claim(self, key: StoreKey, limit: int) -> None:
        claim = await self.store.claim(key, limit, self.ttl_s)
        if not claim.granted:
            raise APIError(429, f"key {key.owner!r} holds its limit of {limit} sessions; continue one of them or "
                           "wait for one to expire", "rate_limit_error", None, "session_limit_reached",
                           {"Retry-After": str(max(1, math.ceil(claim.retry_after_s)))})

    def _start(self, session_id: str, tools: ToolSchemas | None) -> Trajectory:
        return Trajectory.start(session_id, self.template, self.tokenizer, tools, self.policies)

    def new_messages(self, turn: SessionTurn, messages: Sequence[Message]) -> list[Message]:
        """The messages past what the session has seen; the session starts afresh when the history diverged
        or the tools offered changed (they are rendered at the top of the history)."""
        tools = turn.trajectory.renderer.tools
        digests = [tools_digest(tools), *(message_digest(m) for m in messages)]
        seen = turn.trajectory.state.client_digests
        extends = digests[: len(seen)] == seen and len(digests) > len(seen)
        if seen and not extends:
            turn.trajectory = self._start(turn.trajectory.state.session_id, tools)
        turn.trajectory.state.client_digests = digests
        return list(messages[len(seen) - 1:]) if seen and extends else list(messages)
