"""After the campaign: every session as Redis holds it, against what its client saw. A Responses session
(HTTP or WebSocket) must hold exactly the replies its client received (more: a turn applied that the
client never heard of, or applied twice; fewer: an update lost); a chat session's message digests must be
the client's history exactly. And the KV blocks in use on the disaggregated replica must come back to their
idle level once the sessions' pins expire (anything above it leaked)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import httpx
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from agents_eval.bench.faults.sessions import Session
from gateway.auth import ANONYMOUS
from gateway.sessions.manager import message_digest, tools_digest
from gateway.sessions.store import REDIS_PREFIX, StoreKey, session_key
from trajectory.session import SessionState
from trajectory.template.types import Message

SETTLE_TIMEOUT_S = 60.0


async def stored_state(client: aioredis.Redis, key: StoreKey) -> SessionState | None:
    data = await client.get(REDIS_PREFIX + key.path)
    return SessionState.from_bytes(data) if isinstance(data, bytes) else None


async def verdict(client: aioredis.Redis, session: Session) -> str:
    """ok | unacknowledged | lost_update | missing | corrupted"""
    try:
        if session.protocol == "chat":
            if not session.messages:
                return "ok"
            state = await stored_state(client, session_key(ANONYMOUS, session.session_id))
            if state is None:
                return "missing"
            expected = [tools_digest(None), *(message_digest(Message(**m)) for m in session.messages)]
            return "ok" if state.client_digests == expected else "corrupted"
        if session.last_response is None:
            return "ok"
        record = await client.get(REDIS_PREFIX + StoreKey("response", ANONYMOUS, session.last_response).path)
        if record is None:
            return "missing"
        state = await stored_state(client, session_key(ANONYMOUS, json.loads(record)["session_id"]))
    except (ValueError, KeyError, TypeError):
        return "corrupted"
    if state is None:
        return "missing"
    replies = sum(turn.role == "assistant" for turn in state.turns)
    return "ok" if replies == session.completed else "unacknowledged" if replies > session.completed else "lost_update"


async def audit_sessions(redis_url: str, sessions: list[Session]) -> dict[str, int]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        verdicts = Counter([await verdict(client, session) for session in sessions])
    finally:
        await client.aclose()
    return {name: verdicts.get(name, 0) for name in ("ok", "unacknowledged", "lost_update", "missing", "corrupted")}


async def kv_blocks_in_use(http: httpx.AsyncClient) -> float:
    """KV blocks in use over the live workers, from the usage (a mean over workers) and free-block gauges."""
    gauges: dict[str, Any] = {}
    for family in text_string_to_metric_families((await http.get("/metrics")).raise_for_status().text):
        for sample in family.samples:
            gauges[sample.name.removeprefix("agentserve:")] = sample.value
    usage, free = float(gauges.get("kv_cache_usage_perc", 0.0)), float(gauges.get("kv_blocks_free", 0.0))
    total = free / (1.0 - usage) if usage < 1.0 else free
    return total - free


async def settled_kv_blocks(url: str, idle_blocks: float) -> float:
    """Blocks in use once they are back at `idle_blocks` or `SETTLE_TIMEOUT_S` ran out; a request without a
    session every second keeps the engine stepping, so expired pins are released."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while True:
            in_use = await kv_blocks_in_use(http)
            if in_use <= idle_blocks or time.monotonic() > deadline:
                return in_use
            body = {"model": "tiny", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
            await http.post("/v1/chat/completions", json=body)
            await asyncio.sleep(1.0)
