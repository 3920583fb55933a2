"""Agent sessions for the gateway: a `Trajectory` loaded from the store for each turn and saved after it.

Chat-completions clients resend the whole conversation every turn; the session remembers a digest of
every message it has seen (including the replies it returned), so only the messages past that prefix
are new. A conversation that no longer extends the session's history starts the session afresh.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from engine.tokenizer import Tokenizer
from gateway.session_store import SessionStore
from trajectory.agent import Policies, Trajectory
from trajectory.template_types import ChatTemplate, Message, ToolSchemas


@dataclass
class SessionTurn:
    trajectory: Trajectory
    persistent: bool  # saved in the store and its KV pinned between turns


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
                 ttl_s: float) -> None:
        self.store = store
        self.template = template
        self.tokenizer = tokenizer
        self.policies = policies
        self.ttl_s = ttl_s
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @asynccontextmanager
    async def open(self, session_id: str | None, tools: ToolSchemas | None = None) -> AsyncIterator[SessionTurn]:
        """The session for one turn, saved afterwards; a throwaway one (not pinned, not saved) without an id."""
        if session_id is None:
            yield SessionTurn(self._start(f"anon-{uuid.uuid4().hex}", tools), persistent=False)
            return
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        async with lock:
            turn = SessionTurn(await self.load(session_id, tools), persistent=True)
            try:
                yield turn
            finally:
                await self.store.put(session_id, turn.trajectory.to_bytes(), self.ttl_s)

    async def load(self, session_id: str, tools: ToolSchemas | None = None) -> Trajectory:
        data = await self.store.get(session_id)
        if data is None:
            return self._start(session_id, tools)
        return Trajectory.restore(data, self.template, self.tokenizer, tools, self.policies)

    async def exists(self, session_id: str) -> bool:
        return await self.store.get(session_id) is not None

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
