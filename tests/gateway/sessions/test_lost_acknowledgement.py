"""A Responses turn the gateway kept whose end never reached its client, retried from the same previous
response: the interleaving that duplicated a turn in the fault campaign (`agentserve bench faults`). The
client drops its WebSocket after the first delta; the gateway has already committed the reply (saved the
session, stored the record) and the client never reads `response.completed`; the client sends the turn again
from the same `previous_response_id`. The retry must be answered (it was refused as not the latest) and the
session must hold each reply its client received once and the abandoned one not at all."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from websockets.sync.client import connect

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.auth import ANONYMOUS
from gateway.server.app import create_app
from gateway.server.state import GatewayState
from gateway.sessions.store import REDIS_PREFIX, StoreKey, session_key
from gateway.settings import GatewaySettings
from tests.conftest import free_port, wait_for
from tests.gateway.conftest import serving
from trajectory.session import SessionState


@pytest.fixture(scope="module", params=["memory", "redis"])
def gateway(request: pytest.FixtureRequest, redis_url: str) -> Iterator[tuple[GatewayState, str]]:
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=4,
                               redis_url=redis_url if request.param == "redis" else None)
    app = create_app(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=256)))
    with serving(app, settings.port) as url:
        yield app.state.gateway, url


def stored(gw: GatewayState, key: StoreKey) -> bytes | None:
    """What the gateway's store holds under `key` (read beside the gateway, not through it)."""
    if gw.settings.redis_url:
        data = redis.Redis.from_url(gw.settings.redis_url).get(REDIS_PREFIX + key.path)
        return data if isinstance(data, bytes) else None
    return asyncio.run(gw.sessions.store.get(key))


def replies_kept(gw: GatewayState, response_id: str) -> int:
    """Assistant replies in the session that `response_id` belongs to, as the store holds it."""
    record = stored(gw, StoreKey("response", ANONYMOUS, response_id))
    assert record is not None
    state = stored(gw, session_key(ANONYMOUS, json.loads(record)["session_id"]))
    assert state is not None
    return sum(turn.role == "assistant" for turn in SessionState.from_bytes(state).turns)


def create(text: str, previous: str | None) -> dict[str, Any]:
    return {"type": "response.create", "model": "tiny", "input": text, "temperature": 0, "max_output_tokens": 4,
            **({"previous_response_id": previous} if previous else {})}


def ws_turn(url: str, text: str, previous: str | None) -> dict[str, Any]:
    """One turn read to its end: the final response object."""
    with connect(url.replace("http://", "ws://") + "/v1/responses") as ws:
        ws.send(json.dumps(create(text, previous)))
        while (event := json.loads(ws.recv(timeout=60)))["type"] not in ("response.completed", "response.incomplete"):
            assert event["type"] != "error", event
        return dict(event["response"])


def ws_turn_dropped_after_commit(url: str, text: str, previous: str) -> str:
    """One turn whose client leaves after its first delta, once the gateway has committed the reply but before
    the client read the terminal event; the id of the response the client never completed."""
    with connect(url.replace("http://", "ws://") + "/v1/responses") as ws:
        ws.send(json.dumps(create(text, previous)))
        created = json.loads(ws.recv(timeout=60))
        assert created["type"] == "response.created"
        while json.loads(ws.recv(timeout=60))["type"] != "response.output_text.delta":
            pass
        abandoned = created["response"]["id"]
        assert wait_for(lambda: httpx.get(f"{url}/v1/responses/{abandoned}", timeout=10).status_code == 200)
    return str(abandoned)


def http_turn(url: str, text: str, previous: str | None) -> httpx.Response:
    body = {key: value for key, value in create(text, previous).items() if key != "type"}
    return httpx.post(f"{url}/v1/responses", json=body, timeout=60)


def test_a_retry_after_a_reply_committed_but_never_received_replaces_it(
        gateway: tuple[GatewayState, str]) -> None:
    gw, url = gateway
    first = ws_turn(url, "List the files.", None)
    abandoned = ws_turn_dropped_after_commit(url, "Open the failing test.", first["id"])
    assert replies_kept(gw, abandoned) == 2  # committed, though its client never completed it
    retried = ws_turn(url, "Open the failing test.", first["id"])  # the client's retry of the same turn
    assert replies_kept(gw, retried["id"]) == 2  # the reply it received, once; the abandoned one given up
    history = first["usage"]["input_tokens"] + first["usage"]["output_tokens"]
    assert retried["usage"]["input_tokens"] > history  # on top of the first turn's history ...
    refused = http_turn(url, "Go on.", abandoned)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "previous_response_not_latest"
    follow = ws_turn(url, "Run it.", retried["id"])  # ... and the session goes on from the retry
    assert replies_kept(gw, follow["id"]) == 3
    assert follow["usage"]["input_tokens"] > retried["usage"]["input_tokens"] + retried["usage"]["output_tokens"]


def test_an_abandoned_and_a_retried_turn_prefill_the_same_history(gateway: tuple[GatewayState, str]) -> None:
    """Over HTTP: the reply of a committed turn is lost; the retry sees the history without it."""
    gw, url = gateway
    first = http_turn(url, "List the files.", None).json()
    lost = http_turn(url, "Open the failing test.", first["id"]).json()
    retried = http_turn(url, "Open the failing test.", first["id"]).json()
    assert retried["usage"]["input_tokens"] == lost["usage"]["input_tokens"]
    assert replies_kept(gw, retried["id"]) == 2
    assert http_turn(url, "Run it.", retried["id"]).status_code == 200
