"""Bad requests get OpenAI-shaped errors with the right status, and a client that goes away mid-stream
leaves no work and no KV behind."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.server.app import create_app
from gateway.sessions.store import session_key
from gateway.settings import GatewaySettings, LimitSettings
from tests.conftest import free_port, wait_for
from tests.gateway.conftest import running_gateway, serving

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[FastAPI, str]]:
    """An in-thread gateway whose app (and so its engine) the tests can look at."""
    port = free_port()
    app = create_app(GatewaySettings(model="tiny", port=port), LLMEngine("tiny", EngineSettings(num_kv_blocks=512)))
    with serving(app, port) as url:
        yield app, url


@pytest.fixture(scope="module")
def url(gateway: tuple[FastAPI, str]) -> str:
    return gateway[1]


def post(url: str, body: Any, path: str = "/v1/chat/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}{path}", content=content, headers={"content-type": "application/json"}, timeout=30)


def assert_error(response: httpx.Response, status: int, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error") -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == (type_, param, code)
    assert isinstance(error["message"], str) and error["message"]
    return str(error["message"])


@pytest.mark.parametrize(("body", "param"), [
    pytest.param(b'{"model": "tiny", "messages": [', None, id="truncated-json"),
    pytest.param(b"not json at all", None, id="not-json"),
    pytest.param({"model": "tiny", "messages": HI, "max_tokens": "ten"}, "max_tokens", id="max-tokens-string"),
    pytest.param({"model": "tiny", "messages": "hi"}, "messages", id="messages-string"),
    pytest.param({"model": "tiny"}, "messages", id="no-messages"),
    pytest.param({"model": "tiny", "messages": []}, "messages", id="empty-messages"),
    pytest.param({"messages": HI}, "model", id="no-model"),
    pytest.param({"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role",
                 id="invalid-role"),
    pytest.param({"model": "tiny", "messages": [{"content": "hi"}]}, "messages.0.role", id="no-role"),
    pytest.param({"model": "tiny", "messages": HI, "temperature": -0.5}, "temperature", id="negative-temperature"),
    pytest.param({"model": "tiny", "messages": HI, "n": 17}, "n", id="n-over-16"),
    pytest.param({"model": "tiny", "messages": HI, "max_tokens": 0}, "max_tokens", id="zero-max-tokens"),
    pytest.param({"model": "tiny", "messages": HI, "top_p": 0}, "top_p", id="zero-top-p"),
    pytest.param({"model": "tiny", "messages": HI, "logprobs": True, "top_logprobs": 21}, "top_logprobs",
                 id="top-logprobs-over-20"),
    pytest.param({"model": "tiny", "messages": HI, "stop": [""]}, None, id="empty-stop"),
    pytest.param({"model": "tiny", "messages": HI, "metadata": {"session_id": ["s"]}}, "metadata.session_id",
                 id="session-id-not-a-string"),
    pytest.param(b"[1, 2]", None, id="not-an-object"),
])
def test_invalid_chat_bodies_are_400(url: str, body: Any, param: str | None) -> None:
    assert_error(post(url, body), 400, param)


def test_malformed_json_says_so(url: str) -> None:
    assert "JSON" in assert_error(post(url, b"{oops"), 400)


def test_unknown_model_is_404(url: str) -> None:
    for path, body in [("/v1/chat/completions", {"model": "gpt-9", "messages": HI}),
                       ("/v1/completions", {"model": "gpt-9", "prompt": "hi"})]:
        message = assert_error(post(url, body, path), 404, "model", "model_not_found", "not_found_error")
        assert "gpt-9" in message


def test_unknown_route_is_404_in_openai_shape(url: str) -> None:
    assert_error(httpx.get(f"{url}/v1/nothing-here"), 404, type_="not_found_error")


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_over_the_context_is_context_length_exceeded(url: str, stream: bool) -> None:
    long = [{"role": "user", "content": "word " * 2100}]  # the tiny model's context is 2048 tokens
    response = post(url, {"model": "tiny", "messages": long, "stream": stream})
    assert "2048" in assert_error(response, 400, code="context_length_exceeded")
    response = post(url, {"model": "tiny", "prompt": [5] * 2048, "stream": stream}, "/v1/completions")
    assert_error(response, 400, code="context_length_exceeded")


def test_text_completions_refuse_batched_prompts(url: str) -> None:
    assert_error(post(url, {"model": "tiny", "prompt": ["one", "two"]}, "/v1/completions"), 400, "prompt")


def test_an_error_leaves_the_gateway_serving(url: str) -> None:
    post(url, b"{")
    response = post(url, {"model": "tiny", "messages": HI, "max_tokens": 2, "temperature": 0})
    assert response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "length"


def test_an_internal_error_is_500_in_openai_shape() -> None:
    port = free_port()
    app = create_app(GatewaySettings(model="tiny", port=port), LLMEngine("tiny", EngineSettings(num_kv_blocks=64)))
    with serving(app, port) as url:
        session = {"X-Session-Id": "damaged"}
        assert httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": HI, "max_tokens": 2},
                          headers=session).status_code == 200
        store = app.state.gateway.sessions.store  # a real failure: the stored session is no longer one
        asyncio.run(store.put(session_key("anonymous", "damaged"), b"not a session", 60.0))
        follow_up = {"model": "tiny", "messages": [*HI, {"role": "assistant", "content": "x"}, *HI]}
        response = httpx.post(f"{url}/v1/chat/completions", json=follow_up, headers=session)
        assert_error(response, 500, type_="internal_error")


def test_a_dead_engine_is_503_in_openai_shape() -> None:
    port = free_port()
    app = create_app(GatewaySettings(model="tiny", port=port), LLMEngine("tiny", EngineSettings(num_kv_blocks=64)))
    with serving(app, port) as url:
        app.state.gateway.engine.shutdown()  # the engine loop is gone
        response = post(url, {"model": "tiny", "messages": HI})
        assert_error(response, 503, type_="service_unavailable_error", code="engine_unavailable")
        assert response.headers["retry-after"] == "5"


@pytest.fixture(scope="module")
def small_body_url() -> Iterator[str]:
    settings = GatewaySettings(model="tiny", port=free_port(), limits=LimitSettings(max_body_bytes=2000))
    with running_gateway(settings) as url:
        yield url


def chunked(data: bytes, size: int = 500) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


@pytest.mark.parametrize("send", [lambda data: data, chunked], ids=["content-length", "chunked"])
def test_an_oversized_body_is_413(small_body_url: str, send: Callable[[bytes], Any]) -> None:
    big = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * 3000}]}).encode()
    response = httpx.post(f"{small_body_url}/v1/chat/completions", content=send(big),
                          headers={"content-type": "application/json"}, timeout=30)
    assert "2000" in assert_error(response, 413, code="request_too_large")
    small = json.dumps({"model": "tiny", "messages": HI, "max_tokens": 2}).encode()
    response = httpx.post(f"{small_body_url}/v1/chat/completions", content=send(small),
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 200


def aborted_requests(app: FastAPI) -> float:
    """The gateway's count of requests that ended before the engine finished them (finish reason "abort")."""
    families = text_string_to_metric_families(app.state.gateway.metrics.render()[0].decode())
    return next(s.value for f in families for s in f.samples if s.name == "agentserve:aborted_requests_total")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_client_gone_mid_stream_frees_its_request_and_kv(gateway: tuple[FastAPI, str], path: str) -> None:
    app, url = gateway
    engine = app.state.gateway.serving_engine
    assert wait_for(lambda: not engine.has_unfinished())
    free_before, aborted_before = engine.kv.num_free_blocks, aborted_requests(app)
    prompt = "Tell a long story. " * 8
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 1900, "temperature": 0, "stream": True}
    chat = path == "/v1/chat/completions"
    body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    headers = {"X-Session-Id": "gone-mid-stream"} if chat else {}
    with httpx.Client(timeout=30) as client, client.stream("POST", f"{url}{path}", json=body,
                                                           headers=headers) as response:
        assert response.status_code == 200
        data = (line for line in response.iter_lines() if line.startswith("data: "))
        for _ in range(3):
            next(data)
        assert engine.has_unfinished()
    assert wait_for(lambda: not engine.has_unfinished() and engine.kv.num_free_blocks == free_before)
    assert wait_for(lambda: app.state.gateway.in_flight == 0)
    # Aborted, not run to its end: a finished turn of a session pins its KV (the free count would not come back).
    assert aborted_requests(app) == aborted_before + 1
    assert engine.scheduler.pins.stats.pinned == 0


def post_and_leave_while_running(url: str, path: str, body: dict[str, Any], engine: LLMEngine) -> None:
    """Send a non-streaming request, wait until the engine runs it, then close the connection without reading."""
    split = urlsplit(url)
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {split.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode()
    with socket.create_connection((split.hostname, split.port), timeout=30) as client:
        client.sendall(head + data)
        assert wait_for(engine.has_unfinished)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_a_client_gone_before_a_non_streaming_reply_aborts_it(gateway: tuple[FastAPI, str], path: str) -> None:
    """The client leaves while the engine runs its request (whatever the host's speed): the request ends as
    aborted, not run to its 1,900 tokens, and leaves no work, pin or KV behind."""
    app, url = gateway
    engine = app.state.gateway.serving_engine
    assert wait_for(lambda: not engine.has_unfinished())
    free_before, aborted_before = engine.kv.num_free_blocks, aborted_requests(app)
    prompt = "Tell a long story. " * 8
    body: dict[str, Any] = {"model": "tiny", "temperature": 0, "ignore_eos": True}
    if path == "/v1/chat/completions":
        body.update(messages=[{"role": "user", "content": prompt}], max_tokens=1900)
    elif path == "/v1/completions":
        body.update(prompt=prompt, max_tokens=1900)
    else:
        body.update(input=prompt, max_output_tokens=1900, store=False)
    post_and_leave_while_running(url, path, body, engine)
    assert wait_for(lambda: not engine.has_unfinished() and engine.kv.num_free_blocks == free_before)
    assert wait_for(lambda: app.state.gateway.in_flight == 0)
    assert aborted_requests(app) == aborted_before + 1
    assert engine.scheduler.pins.stats.pinned == 0


def test_a_lone_surrogate_in_a_message_is_replaced_not_a_crash(gateway: tuple[FastAPI, str]) -> None:
    _, url = gateway
    body = '{"model": "tiny", "messages": [{"role": "user", "content": "emoji half \\ud83d here"}], "max_tokens": 2}'
    response = httpx.post(f"{url}/v1/chat/completions", content=body, headers={"content-type": "application/json"},
                          timeout=30)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2
