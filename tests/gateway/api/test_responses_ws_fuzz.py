"""Property tests of the Responses WebSocket event parser: any frame, text or bytes, JSON or not, becomes a
client event or an `APIError` (answered as a 4xx `error` event, the connection kept open); the input
items of an event become chat messages or an `APIError`, never another exception (which would be a 500).
The last test sends such frames to a real gateway and checks the answers and that the socket stays."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.api.responses.input import ResponseCreateRequest, chat_tools, input_messages
from gateway.api.responses.ws import EVENT_BODIES, ClientEvent, _decode, parse_event
from gateway.errors import APIError
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.conftest import running_gateway

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
JSON = st.recursive(SCALARS, lambda children: st.lists(children, max_size=4)
                    | st.dictionaries(st.text(max_size=10), children, max_size=4), max_leaves=20)
ITEM_KEYS = ("type", "role", "content", "output", "call_id", "name", "arguments", "id", "status")
ITEM_VALUES = {
    "type": st.sampled_from(["message", "function_call", "function_call_output", "input_text", "reasoning"]),
    "role": st.sampled_from(["user", "system", "developer", "assistant", "tool"]),
    "content": st.text(max_size=20) | st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["input_text", "output_text", "text", "input_image"]), "text": st.text(max_size=10)})),
}
EVENT_FIELDS = ("model", "input", "instructions", "previous_response_id", "tools", "tool_choice", "parallel_tool_calls",
                "max_output_tokens", "temperature", "top_p", "metadata", "user", "stream", "store", "generate",
                "name", "estimated_duration_s", "event_id", "stream_id", "text", "reasoning", "frequency_penalty")


@st.composite
def input_items(draw: st.DrawFn) -> dict[str, Any]:
    """Items with the keys the parser reads, each a plausible value or any JSON at all."""
    keys = draw(st.lists(st.sampled_from(ITEM_KEYS), unique=True, max_size=len(ITEM_KEYS)))
    return {key: draw(ITEM_VALUES.get(key, JSON) | JSON) for key in keys}


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    """An event of a known or unknown type, with known field names holding any JSON."""
    event: dict[str, Any] = {"type": draw(st.sampled_from([*EVENT_BODIES, "response.cancel"]) | JSON)}
    for key in draw(st.lists(st.sampled_from(EVENT_FIELDS), unique=True, max_size=6)):
        event[key] = draw(JSON)
    if draw(st.booleans()):
        event["input"] = draw(st.text(max_size=20) | st.lists(input_items(), max_size=4))
    if draw(st.booleans()):
        event["tools"] = draw(st.lists(st.dictionaries(st.sampled_from(["type", "name", "function", "parameters"]),
                                                       st.just("function") | JSON), max_size=3))
    return event


SHORT_TEXT = st.text(max_size=12)
TYPED_ITEMS = st.one_of(  # each kind of item the gateway takes, with plausible or arbitrary values
    st.fixed_dictionaries({"type": st.just("message"), "role": ITEM_VALUES["role"] | JSON,
                           "content": ITEM_VALUES["content"] | JSON}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": SHORT_TEXT | JSON,
                           "name": SHORT_TEXT | JSON}, optional={"arguments": JSON.map(json.dumps) | JSON}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": SHORT_TEXT | JSON,
                           "output": SHORT_TEXT | JSON}))
TOOLS = st.lists(st.fixed_dictionaries({"type": st.just("function"), "name": st.text(min_size=1, max_size=8) | JSON},
                                       optional={"parameters": JSON, "description": JSON}), max_size=2)


@st.composite
def create_events(draw: st.DrawFn) -> dict[str, Any]:
    """A response.create whose envelope is valid, so its input items and tools reach the session and model."""
    event: dict[str, Any] = {"type": "response.create", "max_output_tokens": 2, "temperature": 0,
                             "input": draw(st.text(min_size=1, max_size=20) | st.lists(TYPED_ITEMS, min_size=1,
                                                                                      max_size=4))}
    if draw(st.booleans()):
        event["instructions"] = draw(st.text(max_size=20))
    if draw(st.booleans()):
        event["tools"] = draw(TOOLS)
    return event


def frames() -> st.SearchStrategy[str | bytes]:
    as_text = st.one_of(events(), JSON).map(json.dumps)
    return as_text | as_text.map(str.encode) | st.text(max_size=200) | st.binary(max_size=200)


def check_refusal(error: APIError) -> None:
    assert 400 <= error.status < 500, error.message
    assert json.loads(json.dumps(error.body()))["error"]["message"]


def parse_or_refuse(frame: str | bytes) -> ClientEvent | None:
    """The event and, for response.create, its messages; None when refused with an APIError."""
    try:
        event = parse_event(_decode(frame))
        if isinstance(event.body, ResponseCreateRequest):
            chat_tools(event.body.tools)
            input_messages(event.body, starting=True)
        return event
    except APIError as error:
        check_refusal(error)
        return None


@FUZZ
@given(frame=frames())
def test_any_frame_is_an_event_or_a_client_error(frame: str | bytes) -> None:
    event = parse_or_refuse(frame)
    if event is not None:
        assert type(event.body) in EVENT_BODIES.values()
        assert event.event_id is None or isinstance(event.event_id, str)


@FUZZ
@given(event=events())
def test_any_event_is_parsed_or_refused(event: dict[str, Any]) -> None:
    parsed = parse_or_refuse(json.dumps(event))
    if parsed is not None:
        assert EVENT_BODIES[event["type"]] is type(parsed.body)
        assert parsed.stream_id == (event["stream_id"] if isinstance(event.get("stream_id"), str) else None)


@FUZZ
@given(items=st.lists(input_items(), min_size=1, max_size=5), instructions=st.none() | st.text(max_size=10))
def test_input_items_become_messages_or_a_client_error(items: list[dict[str, Any]], instructions: str | None) -> None:
    try:
        body = ResponseCreateRequest(input=items, instructions=instructions)
        messages = input_messages(body, starting=True)
    except APIError as error:
        check_refusal(error)
        return
    assert messages and all(isinstance(message.content, str) for message in messages)


ANSWERS = ("response.completed", "response.incomplete", "response.failed", "error", "session.kv_ttl.updated")


@pytest.fixture(scope="module")
def ws_url() -> Iterator[str]:
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=4)
    with running_gateway(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=1024))) as url:
        yield url.replace("http://", "ws://") + "/v1/responses"


def answer(ws: Any) -> dict[str, Any]:
    """The event that ends the gateway's answer to one frame."""
    while (event := json.loads(ws.recv(timeout=30)))["type"] not in ANSWERS:
        pass
    return dict(event)


def check_answer(ws_url: str, frame: str | bytes) -> None:
    """The frame is answered without a server error, and the socket still answers the next one."""
    with connect(ws_url, open_timeout=10) as ws:
        ws.send(frame)
        event = answer(ws)
        hypothesis.event(event["type"] if event["type"] != "error" else event["error"]["code"])
        assert event["type"] != "response.failed", event
        assert event["type"] != "error" or 400 <= event["status"] < 500, event
        ws.send(json.dumps({"type": "response.teleport", "event_id": "probe"}))
        assert answer(ws)["event_id"] == "probe"


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame=frames())
def test_a_real_gateway_answers_any_frame_and_keeps_the_socket(ws_url: str, frame: str | bytes) -> None:
    check_answer(ws_url, frame)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=create_events())
def test_a_real_gateway_runs_or_refuses_any_input_items_and_tools(ws_url: str, event: dict[str, Any]) -> None:
    check_answer(ws_url, json.dumps(event))
