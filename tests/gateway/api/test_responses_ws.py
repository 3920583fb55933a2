"""The Responses WebSocket mode (`GET /v1/responses` upgraded) against a real gateway: the openai SDK's
`responses.connect()` for sessions, the `websockets` client for raw frames, and the engine the gateway runs
(same process) for KV pins and aborted requests."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.api.responses.ws import uvicorn_websocket_options
from gateway.auth import ANONYMOUS
from gateway.sessions.store import session_key
from gateway.settings import GatewaySettings, LimitSettings
from tests.conftest import free_port, openai_client
from tests.gateway.conftest import running_gateway

TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")
MESSAGE_LIMIT = 64 * 1024


@dataclass
class Gateway:
    url: str
    engine: LLMEngine

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/responses"


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=16,
                               limits=LimitSettings(max_ws_message_bytes=MESSAGE_LIMIT))
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=1024))
    with running_gateway(settings, engine) as url:
        yield Gateway(url, engine)


def sdk(gateway: Gateway) -> openai.OpenAI:
    return openai_client(gateway.url)


def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def receive(ws: ClientConnection) -> dict[str, Any]:
    return dict(json.loads(ws.recv(timeout=30)))


def until_terminal(ws: ClientConnection) -> list[dict[str, Any]]:
    events = [receive(ws)]
    while events[-1]["type"] not in TERMINAL:
        events.append(receive(ws))
    return events


def create(ws: ClientConnection, **fields: Any) -> list[dict[str, Any]]:
    ws.send(json.dumps({"type": "response.create", "model": "tiny", "max_output_tokens": 3, "temperature": 0,
                        **fields}))
    return until_terminal(ws)


def test_a_five_turn_session_reuses_each_turns_kv(gateway: Gateway) -> None:
    client = sdk(gateway)
    previous, usages = None, []
    with client.responses.connect() as connection:
        for turn in range(5):
            extra = {"instructions": "You are a terse agent."} if previous is None else {}
            connection.response.create(model="tiny", input=f"observation {turn}: all good", max_output_tokens=8,
                                       previous_response_id=previous, **extra)  # type: ignore[arg-type]
            events = []
            for event in connection:
                events.append(event)
                if event.type in TERMINAL:
                    break
            final = events[-1]
            # sampled (temperature 1): the reply ends at max_output_tokens or, now and then, at EOS
            assert final.type in ("response.incomplete", "response.completed"), final
            assert [e.sequence_number for e in events] == list(range(len(events)))
            assert final.response.usage is not None
            previous = final.response.id
            usages.append(final.response.usage)
    for before, after in itertools.pairwise(usages):
        assert after.input_tokens_details.cached_tokens >= before.input_tokens + before.output_tokens - 1


async def test_a_warm_up_prefills_without_output_and_the_next_turn_is_cached(gateway: Gateway) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    async with client.responses.connect() as connection:
        await connection.response.create(model="tiny", generate=False, instructions="You are a careful agent.",
                                         input="Here is a long task description " * 8)
        warm = [event async for event in _until_terminal(connection)]
        assert [e.type for e in warm] == ["response.created", "response.in_progress", "response.completed"]
        warm_response = warm[-1].response
        assert warm_response.usage is not None
        assert warm_response.output == [] and warm_response.usage.output_tokens == 0
        await connection.response.create(model="tiny", input="Go.", previous_response_id=warm_response.id,
                                         max_output_tokens=4)
        turn = [event async for event in _until_terminal(connection)]
    usage = turn[-1].response.usage
    assert usage is not None and usage.input_tokens_details.cached_tokens >= warm_response.usage.input_tokens


async def _until_terminal(connection: Any) -> Any:
    async for event in connection:
        yield event
        if event.type in TERMINAL:
            return


def test_unknown_previous_response_is_an_error_event_and_the_socket_stays(gateway: Gateway) -> None:
    with connect(gateway.ws_url, open_timeout=10) as ws:
        [error] = create(ws, input="hi", previous_response_id="resp_missing", event_id="evt_1")
        assert error["type"] == "error" and error["event_id"] == "evt_1" and error["status"] == 400
        assert error["error"]["code"] == "previous_response_not_found"
        assert create(ws, input="hi")[-1]["type"] == "response.incomplete"


def test_bad_frames_get_error_events_and_the_socket_stays(gateway: Gateway) -> None:
    with connect(gateway.ws_url, open_timeout=10) as ws:
        ws.send("{not json")
        assert receive(ws)["error"]["code"] == "invalid_json"
        ws.send(json.dumps({"type": "response.teleport", "event_id": "evt_2"}))
        unknown = receive(ws)
        assert (unknown["event_id"], unknown["error"]["code"]) == ("evt_2", "unknown_event_type")
        ws.send(json.dumps({"type": "response.create", "event_id": "evt_3", "input": "x" * MESSAGE_LIMIT}))
        too_large = receive(ws)
        assert (too_large["event_id"], too_large["error"]["code"]) == ("evt_3", "message_too_large")
        ws.send(json.dumps({"type": "response.create", "event_id": "evt_4", "input": "hi", "max_output_tokens": 0}))
        invalid = receive(ws)
        assert (invalid["event_id"], invalid["error"]["param"]) == ("evt_4", "max_output_tokens")
        events = create(ws, input="still here?", stream_id="lane-a")
        assert events[-1]["type"] == "response.incomplete" and {e["stream_id"] for e in events} == {"lane-a"}


def test_tool_call_announcements_retime_the_sessions_kv_pin(gateway: Gateway) -> None:
    pins = gateway.engine.scheduler.pins.pins
    with connect(gateway.ws_url, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "session.tool_call.finished", "event_id": "evt_0"}))
        assert receive(ws)["error"]["code"] == "no_active_session"
        before = set(pins)
        create(ws, input="Run the tests.")
        assert until(lambda: len(set(pins) - before) == 1)
        [session] = set(pins) - before

        def remaining() -> float:
            pin = pins.get(session)
            return pin.expires_at - time.monotonic() if pin else 0.0

        assert remaining() <= 10  # no gap known yet: the default time-to-live
        ws.send(json.dumps({"type": "session.tool_call.started", "name": "pytest", "estimated_duration_s": 20,
                            "event_id": "evt_5"}))
        updated = receive(ws)
        assert updated["type"] == "session.kv_ttl.updated" and updated["event_id"] == "evt_5"
        assert session == session_key(ANONYMOUS, updated["session_id"]).path and updated["kv_pin_ttl_s"] > 20
        assert until(lambda: remaining() > 20)
        ws.send(json.dumps({"type": "session.tool_call.finished"}))
        assert receive(ws)["kv_pin_ttl_s"] <= 10
        assert until(lambda: remaining() <= 10)


def test_leaving_mid_stream_aborts_the_engine_request(gateway: Gateway) -> None:
    engine, pins = gateway.engine, gateway.engine.scheduler.pins.pins
    before = set(pins)
    with connect(gateway.ws_url, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": "Write a long essay.",
                            "max_output_tokens": 1900}))
        while receive(ws)["type"] != "response.output_text.delta":
            pass
        assert engine.has_unfinished()
    assert until(lambda: not engine.has_unfinished())
    assert set(pins) - before == set()  # an aborted turn pins nothing; a finished one would have


def test_the_connection_closes_at_its_maximum_age() -> None:
    settings = GatewaySettings(model="tiny", port=free_port(), limits=LimitSettings(ws_max_connection_age_s=0.5))
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=64))
    with running_gateway(settings, engine) as url, connect(Gateway(url, engine).ws_url, open_timeout=10) as ws:
        error = receive(ws)
        assert error["type"] == "error" and error["error"]["code"] == "websocket_connection_limit_reached"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)


def test_uvicorn_options_follow_the_limits() -> None:
    options = uvicorn_websocket_options(LimitSettings(ws_ping_interval_s=7.0, max_ws_message_bytes=1000))
    assert options == {"ws_ping_interval": 7.0, "ws_ping_timeout": 7.0, "ws_max_size": 2000}
