"""`POST /v1/responses` and `GET /v1/responses/{id}` through the openai SDK against a real gateway, and the
response builder on its own (the finishes the tiny random model never produces: stop, tool calls)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.responses import FunctionToolParam, ResponseIncompleteEvent

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.output import RequestOutput
from gateway.api.responses.events import ResponseStream
from gateway.settings import GatewaySettings
from tests.conftest import free_port, openai_client
from tests.gateway.conftest import running_gateway


def sdk(url: str) -> openai.OpenAI:
    return openai_client(url)


@pytest.fixture(scope="module")
def client(gateway_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0) as opened:
        yield opened


def test_create_returns_a_message_usage_and_the_request_echo(client: openai.OpenAI) -> None:
    response = client.responses.create(model="tiny", input="Hello there", instructions="Answer briefly.",
                                       max_output_tokens=5, temperature=0.0, top_p=0.9,
                                       metadata={"run": "r1"})
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "incomplete"  # greedy, this random model does not stop by itself: it hits the limit
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text" and response.output_text == message.content[0].text
    usage = response.usage
    assert usage is not None and usage.output_tokens == 5
    assert usage.input_tokens > 0 and usage.total_tokens == usage.input_tokens + 5
    assert usage.input_tokens_details.cached_tokens == 0
    assert (response.temperature, response.top_p, response.max_output_tokens) == (0.0, 0.9, 5)
    assert response.metadata == {"run": "r1"} and response.instructions == "Answer briefly."


def test_stream_sends_the_events_in_order_with_increasing_sequence_numbers(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="tiny", input="Hi", max_output_tokens=4, stream=True, temperature=0))
    types = [event.type for event in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert isinstance(events[-1], ResponseIncompleteEvent)
    final = events[-1].response
    assert final.output_text == deltas and final.usage is not None and final.usage.output_tokens == 4


def test_previous_response_id_continues_the_session_from_its_kv(client: openai.OpenAI, gateway_url: str) -> None:
    first = client.responses.create(model="tiny", input="What is 2+2?", instructions="You are terse.",
                                    max_output_tokens=6)
    second = client.responses.create(model="tiny", input="And 3+3?", previous_response_id=first.id,
                                     max_output_tokens=6)
    assert first.usage is not None and second.usage is not None
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens + first.usage.output_tokens - 1
    stored = httpx.get(f"{gateway_url}/v1/responses/{second.id}", timeout=10).json()
    assert stored["id"] == second.id and stored["output"][0]["content"][0]["text"] == second.output_text


def test_tool_outputs_and_message_parts_are_accepted_as_input(client: openai.OpenAI) -> None:
    tools: list[FunctionToolParam] = [{
        "type": "function", "name": "get_weather", "description": "Weather of a city", "strict": False,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    first = client.responses.create(model="tiny", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Weather in Paris?"}]}], tools=tools, max_output_tokens=3, temperature=0)
    second = client.responses.create(model="tiny", previous_response_id=first.id, tools=tools, max_output_tokens=3,
                                     temperature=0,
                                     input=[{"type": "function_call_output", "call_id": "call_1",
                                             "output": "18C, cloudy"}])
    assert second.status == "incomplete" and second.tools[0].type == "function"
    assert second.tools[0].name == "get_weather"


def test_a_replica_sharing_redis_continues_the_session(redis_url: str) -> None:
    gateways = [GatewaySettings(model="tiny", port=free_port(), redis_url=redis_url) for _ in range(2)]
    engines = [LLMEngine("tiny", EngineSettings(num_kv_blocks=64)) for _ in range(2)]
    with running_gateway(gateways[0], engines[0]) as first_url, running_gateway(gateways[1], engines[1]) as second_url:
        first = sdk(first_url).responses.create(model="tiny", input="Start.", max_output_tokens=3)
        second = sdk(second_url).responses.create(model="tiny", input="Go on.", previous_response_id=first.id,
                                                  max_output_tokens=3)
        assert first.usage is not None and second.usage is not None
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
        assert httpx.get(f"{first_url}/v1/responses/{second.id}", timeout=10).json()["id"] == second.id


def test_unknown_previous_response_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="tiny", input="hi", previous_response_id="resp_missing")
    assert raised.value.code == "previous_response_not_found" and raised.value.param == "previous_response_id"


def test_a_continuation_from_two_responses_back_is_refused(client: openai.OpenAI) -> None:
    first = client.responses.create(model="tiny", input="one", max_output_tokens=2)
    second = client.responses.create(model="tiny", input="two", previous_response_id=first.id, max_output_tokens=2)
    client.responses.create(model="tiny", input="three", previous_response_id=second.id, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="tiny", input="fork", previous_response_id=first.id, max_output_tokens=2)
    assert raised.value.code == "previous_response_not_latest"


def test_store_false_is_neither_retrievable_nor_continuable(client: openai.OpenAI, gateway_url: str) -> None:
    response = client.responses.create(model="tiny", input="secret", store=False, max_output_tokens=2)
    assert httpx.get(f"{gateway_url}/v1/responses/{response.id}", timeout=10).status_code == 404
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", input="more", previous_response_id=response.id)


def test_bad_requests_get_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="tiny", input=cast(Any, [{"type": "input_image_call", "id": "x"}]))
    assert raised.value.code == "unsupported_input_item"
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="tiny", input="hi", tools=[{"type": "web_search"}])
    assert raised.value.code == "unsupported_tool"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="hi")


def output(text: str, finished: bool = False, reason: str | None = None) -> RequestOutput:
    return RequestOutput("r", [7] * max(1, len(text) // 4), text, finished, reason, 10, 4)


def test_builder_turns_tool_call_markup_into_function_call_items() -> None:
    stream = ResponseStream("tiny", {}, parse_tools=True)
    events = [*stream.start()]
    for chunk in ["Let me check. <tool", '_call>{"name": "get_weather", ', '"arguments": {"city": "Paris"}}',
                  "</tool_call>"]:
        events += stream.add(output(chunk))
    events += stream.add(output("", finished=True, reason="stop"))
    events += stream.finish()
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert "<tool" not in deltas and deltas.strip() == "Let me check."
    final = events[-1]
    assert final["type"] == "response.completed" and final["response"]["status"] == "completed"
    message, call = final["response"]["output"]
    assert message["content"][0]["text"] == "Let me check."
    assert (call["type"], call["name"], call["arguments"]) == ("function_call", "get_weather", '{"city": "Paris"}')
    assert stream.reply.tool_calls and stream.reply.tool_calls[0]["id"] == call["call_id"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert {"response.function_call_arguments.delta", "response.function_call_arguments.done"} <= {
        e["type"] for e in events}


def test_builder_closes_a_message_it_opened_even_when_only_a_call_remains() -> None:
    stream = ResponseStream("tiny", {}, parse_tools=True)
    events = [*stream.add(output("  ")), *stream.add(output('<tool_call>{"name": "ls"}</tool_call>', True, "stop"))]
    events += stream.finish()
    types = [e["type"] for e in events]
    assert types.count("response.output_item.added") == types.count("response.output_item.done") == 2
    assert [item["type"] for item in events[-1]["response"]["output"]] == ["message", "function_call"]


def test_builder_reports_usage_and_a_failure() -> None:
    stream = ResponseStream("tiny", {"metadata": {}}, parse_tools=False)
    stream.start()
    stream.add(output("abcdefgh"))
    [failed] = stream.fail("the engine failed: boom")
    response = failed["response"]
    assert failed["type"] == "response.failed" and response["status"] == "failed"
    assert response["error"] == {"code": "server_error", "message": "the engine failed: boom"}
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 4 and response["usage"]["output_tokens"] == 2
