"""The session store unreachable: a session's turn is answered 503 in OpenAI's shape with Retry-After (not a
500), over HTTP and as the WebSocket's error event, and requests that need no session are still served."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from websockets.sync.client import connect

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.conftest import running_gateway


@pytest.fixture(scope="module")
def gateway_without_its_redis() -> Iterator[str]:
    nobody = f"redis://127.0.0.1:{free_port()}/0"  # a free port: connections are refused
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=4, redis_url=nobody)
    with running_gateway(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=256))) as url:
        yield url


def chat(url: str, headers: dict[str, str]) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_a_session_turn_is_503_with_retry_after(gateway_without_its_redis: str) -> None:
    response = chat(gateway_without_its_redis, {"X-Session-Id": "agent-1"})
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert error["code"] == "session_store_unavailable" and error["type"] == "service_unavailable_error"


def test_a_request_without_a_session_is_still_served(gateway_without_its_redis: str) -> None:
    assert chat(gateway_without_its_redis, {}).status_code == 200


def test_a_websocket_turn_is_an_error_event_with_status_503(gateway_without_its_redis: str) -> None:
    url = gateway_without_its_redis.replace("http://", "ws://") + "/v1/responses"
    with connect(url, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": "hello", "event_id": "e1"}))
        event = json.loads(ws.recv(timeout=30))
        assert event["type"] == "error" and event["status"] == 503 and event["event_id"] == "e1"
        assert event["error"]["code"] == "session_store_unavailable" and event["retry_after"] == "1"
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": "again"}))
        assert json.loads(ws.recv(timeout=30))["status"] == 503  # the connection stays usable
