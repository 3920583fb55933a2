"""Agent sessions for the gateway: a `Trajectory` loaded from the store for each turn and saved after it.

Chat-completions clients resend the whole conversation every turn; the session remembers a digest of
every message it has seen (including the replies it returned), so only the messages past that prefix
are new. A conversation that no longer extends the session's history starts the session afresh.

The store holds the truth; this process also keeps the trajectories it saved last (`KeptSessions`), and a
turn whose stored bytes are still the ones it saved continues that object instead of decoding and
re-rendering the history, and serialises only what the turn added.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as encode_json_string

from engine import Tokenizer, fresh_id
from gateway.errors import APIError
from gateway.sessions.lease import SessionBusy
from gateway.sessions.store import SessionStore, StoreKey
from trajectory import step_timer
from trajectory.agent import Policies, Trajectory
from trajectory.template.types import ChatTemplate, Message, ToolSchemas
from trajectory.tokenizer_cache import CachingTokenizer

KEPT_SESSIONS = 256  # trajectories kept live between turns; each holds its history and a 40 KB compressor


@dataclass
class SessionTurn:
    trajectory: Trajectory
    key: StoreKey | None  # None: a throwaway session, neither saved nor pinned
    loaded: bytes | None = None  # what the store held when the turn started; None: a new session
    saved: bool = False  # saved during the turn, and left unchanged since
    rewound: bool = False  # continues the session as it was one turn back (`SessionManager.rewind`)

    @property
    def persistent(self) -> bool:
        """Saved in the store and its KV pinned between turns."""
        return self.key is not None


class KeptSessions:
    """The trajectories this process saved last, with the bytes it saved them as, for at most `ttl_s` (the
    store's TTL) and `capacity` sessions, least recently saved dropped first."""

    def __init__(self, ttl_s: float, capacity: int = KEPT_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.capacity, self._clock = ttl_s, capacity, clock
        self._kept: OrderedDict[StoreKey, tuple[bytes, Trajectory, float]] = OrderedDict()  # saved-at order

    def __len__(self) -> int:
        return len(self._kept)

    def take(self, key: StoreKey, stored: bytes, tools: ToolSchemas | None) -> Trajectory | None:
        """The kept trajectory when `stored` is what it was saved as and its tools are these; it is no longer
        kept (the turn changes it: an unsaved turn must not leave it behind)."""
        self._sweep()
        kept = self._kept.pop(key, None)
        if kept is None or kept[0] != stored:
            return None
        trajectory = kept[1]
        return trajectory if trajectory.renderer.tools == (tuple(tools) if tools is not None else None) else None

    def keep(self, key: StoreKey, saved: bytes, trajectory: Trajectory) -> None:
        self._kept.pop(key, None)
        self._kept[key] = (saved, trajectory, self._clock() + self.ttl_s)
        self._sweep()

    def _sweep(self) -> None:
        """Drop expired entries and those over capacity (the oldest saved expire first: one TTL for all)."""
        now = self._clock()
        while self._kept and (len(self._kept) > self.capacity or next(iter(self._kept.values()))[2] <= now):
            self._kept.popitem(last=False)

    def drop(self, key: StoreKey) -> None:
        self._kept.pop(key, None)


def message_digest(message: Message) -> str:
    """A digest of what the model sees of a message; stored with sessions, so its input never changes:
    `json.dumps([role, content, calls, tool_call_id], sort_keys=True)`, spelled out when there are no calls."""
    if not message.tool_calls:
        call_id = "null" if message.tool_call_id is None else encode_json_string(message.tool_call_id)
        payload = f"[{encode_json_string(message.role)}, {encode_json_string(message.content)}, [], {call_id}]"
    else:
        calls = [{"name": c.get("function", {}).get("name"), "arguments": c.get("function", {}).get("arguments")}
                 for c in message.tool_calls]
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
        self.tokenizer = CachingTokenizer(tokenizer) if tokenizer is not None else tokenizer
        self.policies = policies
        self.ttl_s = ttl_s
        self.kept = KeptSessions(ttl_s)
        self._locks: weakref.WeakValueDictionary[StoreKey, asyncio.Lock] = weakref.WeakValueDictionary()

    @asynccontextmanager
    async def open(self, key: StoreKey | None, tools: ToolSchemas | None = None,
                   max_sessions: int | None = None) -> AsyncIterator[SessionTurn]:
        """The session for one turn, saved afterwards; a throwaway one (not pinned, not saved) without a key.
        A new session needs a place among its owner's `max_sessions` (APIError 429 when none is free); a turn
        of a session in a turn on another replica waits for it, then is refused (APIError 409)."""
        step_timer.enter("session_load")
        if key is None:
            turn = SessionTurn(self._start(fresh_id("anon-"), tools), None)
            step_timer.leave("session_load")
            yield turn
            return
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock, self._lease(key):
            turn = await self._load_turn(key, tools, max_sessions)
            step_timer.leave("session_load")
            try:
                yield turn
            finally:
                if not turn.saved:
                    await self.save(turn)

    async def save(self, turn: SessionTurn, ends_turn: bool = False) -> None:
        """Store the turn's session now (and keep it); the turn's end saves it again only if it changes after.
        A save that `ends_turn` keeps the session the turn continued from as the store's previous value."""
        if turn.key is None:
            return
        step_timer.enter("session_save")
        data = turn.trajectory.to_bytes()
        await self.store.put(turn.key, data, self.ttl_s, keep_previous=ends_turn and not turn.rewound)
        self.kept.keep(turn.key, data, turn.trajectory)
        turn.saved = True
        step_timer.leave("session_save")

    async def rewind(self, turn: SessionTurn, tools: ToolSchemas | None) -> bool:
        """Continue the session as it was before its latest turn (kept by the save that ended that turn), when
        it still is; False when it is not kept."""
        if turn.key is None:
            return False
        data = await self.store.get(turn.key.previous)
        if data is None:
            return False
        turn.trajectory = Trajectory.restore(data, self.template, self.tokenizer, tools, self.policies)
        turn.rewound = True
        return True

    def roll_back(self, turn: SessionTurn, tools: ToolSchemas | None) -> None:
        """Undo the turn's changes: the session as the store held it when the turn started."""
        if turn.loaded is None:
            turn.trajectory = self._start(turn.trajectory.state.session_id, tools)
        else:
            turn.trajectory = Trajectory.restore(turn.loaded, self.template, self.tokenizer, tools, self.policies)
        turn.saved = turn.rewound = False

    async def _load_turn(self, key: StoreKey, tools: ToolSchemas | None, max_sessions: int | None) -> SessionTurn:
        data = await self.store.get(key)
        if data is None:
            self.kept.drop(key)
            if max_sessions is not None:
                await self._claim(key, max_sessions)
            return SessionTurn(self._start(key.path, tools), key)
        trajectory = self.kept.take(key, data, tools)
        if trajectory is None:
            trajectory = Trajectory.restore(data, self.template, self.tokenizer, tools, self.policies)
        return SessionTurn(trajectory, key, data)

    @asynccontextmanager
    async def _lease(self, key: StoreKey) -> AsyncIterator[None]:
        try:
            async with self.store.lease(key, self.lease_wait_s):
                yield
        except SessionBusy as busy:  # raised only while taking the lease, before the turn starts
            raise APIError(409, f"session {key.id!r} is in a turn on another replica; send the next turn after "
                           f"it ends (waited {busy.waited_s:.1f} s)", "invalid_request_error", None,
                           "session_busy", {"Retry-After": "1"}) from busy

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
        step_timer.enter("session_load")
        tools = turn.trajectory.renderer.tools
        digests = [tools_digest(tools), *(message_digest(m) for m in messages)]
        seen = turn.trajectory.state.client_digests
        extends = digests[: len(seen)] == seen and len(digests) > len(seen)
        if seen and not extends:
            turn.trajectory = self._start(turn.trajectory.state.session_id, tools)
        turn.trajectory.state.client_digests = digests
        step_timer.leave("session_load")
        return list(messages[len(seen) - 1:]) if seen and extends else list(messages)
