"""Inputs the gateway refuses, with OpenAI's status and error code, over HTTP and the Responses WebSocket; what
it no longer caps (a reply without a token limit runs to the context); the parameters it implements instead
of dropping (`echo`, `parallel_tool_calls`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from websockets.sync.client import connect

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.output import RequestOutput
from gateway.api.generation import Usage
from gateway.api.protocol import output_budget
from gateway.api.responses.events import ResponseStream
from gateway.api.streaming import ChatStreamWriter
from gateway.api.tool_calls import parse_tool_calls
from gateway.errors import APIError
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.api.test_bad_input import assert_error, post
from tests.gateway.conftest import running_gateway

CONTEXT = 2048  # the tiny model's
HI = [{"role": "user", "content": "hi"}]
HUGE = 100_000_000
LONG_PROMPT = "word " * 1760  # leaves a little over 256 tokens of the context for the reply


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """A gateway as configs/gateway.yaml sets it up: no default token limit."""
    settings = GatewaySettings(model="tiny", port=free_port())
    assert settings.default_max_tokens is None
    with running_gateway(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=512))) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


def ws_error(url: str, **fields: Any) -> dict[str, Any]:
    """The error event a `response.create` with these fields gets."""
    with connect(url.replace("http://", "ws://") + "/v1/responses", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "event_id": "e1", **fields}))
        event = dict(json.loads(ws.recv(timeout=30)))
    assert event["type"] == "error" and event["event_id"] == "e1" and event["status"] == 400, event
    return dict(event["error"])


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": HI, "max_tokens": HUGE}, "max_tokens"),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": HUGE, "stream": True},
     "max_completion_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": HUGE}, "max_tokens"),
    ("/v1/completions", {"prompt": [5] * 2000, "max_tokens": 49}, "max_tokens"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": HUGE}, "max_output_tokens"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": HUGE, "stream": True}, "max_output_tokens"),
], ids=["chat", "chat-stream", "completions", "completions-just-over", "responses", "responses-stream"])
def test_prompt_plus_token_limit_over_the_context_is_refused(url: str, path: str, body: dict[str, Any],
                                                             param: str) -> None:
    message = assert_error(post(url, {"model": "tiny", **body}, path), 400, param, "context_length_exceeded")
    assert str(CONTEXT) in message


def test_the_websocket_refuses_a_token_limit_over_the_context(url: str) -> None:
    error = ws_error(url, input="hi", max_output_tokens=HUGE)
    assert (error["code"], error["param"]) == ("context_length_exceeded", "max_output_tokens")


def test_the_token_budget_is_the_request_or_the_rest_of_the_context() -> None:
    assert output_budget(None, "max_tokens", 2000, CONTEXT, None) == 48  # no hidden cap
    assert output_budget(None, "max_tokens", 2000, CONTEXT, 16) == 16  # an operator's explicit default
    assert output_budget(48, "max_tokens", 2000, CONTEXT, None) == 48  # exactly fits
    for requested, prompt in ((49, 2000), (None, CONTEXT)):
        with pytest.raises(APIError) as refused:
            output_budget(requested, "max_tokens", prompt, CONTEXT, None)
        assert refused.value.code == "context_length_exceeded"


@pytest.mark.parametrize("body", [{"input": ""}, {"input": []}, {}], ids=["empty-string", "empty-list", "missing"])
def test_an_empty_responses_input_is_refused(url: str, body: dict[str, Any]) -> None:
    assert_error(post(url, {"model": "tiny", **body}, "/v1/responses"), 400, "input", "empty_input")
    error = ws_error(url, **body)
    assert (error["code"], error["param"]) == ("empty_input", "input")


def test_a_reply_cut_by_max_output_tokens_is_incomplete(client: openai.OpenAI) -> None:
    response = client.responses.create(model="tiny", input="Tell me everything.", max_output_tokens=3,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [item.status for item in response.output] == ["incomplete"]  # type: ignore[union-attr]
    events = list(client.responses.create(model="tiny", input="Again.", max_output_tokens=3, stream=True))
    done = [event for event in events if event.type == "response.output_item.done"]
    assert [event.item.status for event in done] == ["incomplete"]  # type: ignore[union-attr]


def test_chat_without_max_tokens_runs_to_the_context(url: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": LONG_PROMPT}], "ignore_eos": True}
    reply = post(url, body).json()
    usage = reply["usage"]
    assert usage["completion_tokens"] == CONTEXT - usage["prompt_tokens"] > 256
    assert reply["choices"][0]["finish_reason"] == "length"


def test_a_response_without_max_output_tokens_runs_to_the_context(url: str) -> None:
    response = post(url, {"model": "tiny", "input": LONG_PROMPT, "ignore_eos": True}, "/v1/responses").json()
    usage = response["usage"]
    assert usage["output_tokens"] == CONTEXT - usage["input_tokens"] > 256
    assert response["status"] == "incomplete"  # the context, not a hidden limit, ended it


TOOL = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(("path", "extra", "param", "code"), [
    ("/v1/chat/completions", {"frequency_penalty": 0.5}, "frequency_penalty", "unsupported_parameter"),
    ("/v1/chat/completions", {"logit_bias": {"5": 10}}, "logit_bias", "unsupported_parameter"),
    ("/v1/chat/completions", {"functions": [TOOL["function"]]}, "functions", "unsupported_parameter"),
    ("/v1/chat/completions", {"store": True}, "store", "unsupported_parameter"),
    ("/v1/chat/completions", {"repetition_penalty": 1.1}, "repetition_penalty", "unsupported_parameter"),
    ("/v1/chat/completions", {"min_tokens": 2}, "min_tokens", "unsupported_parameter"),
    ("/v1/chat/completions", {"min_tokens": 3, "ignore_eos": True}, "min_tokens", "unsupported_parameter"),
    ("/v1/chat/completions", {"stream": True, "stream_options": {"include_usage": True, "chunk_size": 4}},
     "stream_options.chunk_size", "unsupported_parameter"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/cat.png"}}]}]}, "messages.0.content",
     "unsupported_content"),
    ("/v1/completions", {"echo": True, "logprobs": 1}, "echo", "unsupported_parameter"),
    ("/v1/completions", {"suffix": "}"}, "suffix", "unsupported_parameter"),
    ("/v1/completions", {"best_of": 2}, "best_of", "unsupported_parameter"),
    ("/v1/responses", {"include": ["message.output_text.logprobs"]}, "include", "unsupported_parameter"),
    ("/v1/responses", {"reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
    ("/v1/responses", {"truncation": "auto"}, "truncation", "unsupported_parameter"),
    ("/v1/responses", {"background": True}, "background", "unsupported_parameter"),
    ("/v1/responses", {"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
])
def test_a_parameter_agentserve_does_not_implement_is_refused_by_name(url: str, path: str, extra: dict[str, Any],
                                                                      param: str, code: str) -> None:
    base: dict[str, Any] = {"/v1/chat/completions": {"messages": HI, "max_tokens": 2},
                            "/v1/completions": {"prompt": "hi", "max_tokens": 2},
                            "/v1/responses": {"input": "hi", "max_output_tokens": 2}}[path]
    message = assert_error(post(url, {"model": "tiny", **base, **extra}, path), 400, param, code)
    assert param in message


def test_the_websocket_refuses_a_parameter_by_name_and_keeps_its_envelope(url: str) -> None:
    error = ws_error(url, input="hi", max_output_tokens=2, reasoning={"effort": "high"}, stream_id="lane")
    assert (error["code"], error["param"]) == ("unsupported_parameter", "reasoning")


def test_nulls_and_no_op_values_of_unimplemented_parameters_pass(url: str, client: openai.OpenAI) -> None:
    """What the openai SDK and the OpenAI Agents SDK send by default."""
    response = client.responses.create(model="tiny", input="hi", max_output_tokens=2, include=[],
                                       truncation="disabled", text={"format": {"type": "text"}},
                                       extra_body={"reasoning": None, "prompt_cache_key": "agent-7"})
    assert response.status == "incomplete"
    body = {"model": "tiny", "messages": HI, "max_tokens": 2, "presence_penalty": 0, "service_tier": "auto",
            "store": False, "modalities": ["text"], "functions": None}
    assert post(url, body).status_code == 200
    peer = {"model": "tiny", "messages": HI, "max_tokens": 3, "ignore_eos": True, "min_tokens": 3,
            "repeat_penalty": 1.0}  # what agents_eval's peer benchmark sends llama.cpp and agentserve alike
    assert post(url, peer).json()["usage"]["completion_tokens"] == 3


def test_completions_echo_the_prompt(client: openai.OpenAI) -> None:
    plain = client.completions.create(model="tiny", prompt="import os", max_tokens=3, temperature=0)
    echoed = client.completions.create(model="tiny", prompt="import os", max_tokens=3, temperature=0, echo=True)
    assert echoed.choices[0].text == "import os" + plain.choices[0].text
    chunks = client.completions.create(model="tiny", prompt="import os", max_tokens=3, temperature=0, echo=True,
                                       stream=True)
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == echoed.choices[0].text


CALLS = ('<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
         '<tool_call>{"name": "cat", "arguments": {"path": "a"}}</tool_call>')


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    assert [c["function"]["name"] for c in parse_tool_calls(CALLS)[1]] == ["ls", "cat"]
    content, calls = parse_tool_calls(CALLS, max_calls=1)
    assert content == "" and [c["function"]["name"] for c in calls] == ["ls"]
    finished = RequestOutput("r", [7] * 20, CALLS, True, "stop", 10, 0)
    writer = ChatStreamWriter("tiny", parse_tools=True, n=1, max_tool_calls=1)
    writer.add(0, finished)
    message = writer.completion(Usage())["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["ls"]
    stream = ResponseStream("tiny", {}, parse_tools=True, max_tool_calls=1)
    stream.add(finished)
    output = stream.finish()[-1]["response"]["output"]
    assert [item["name"] for item in output if item["type"] == "function_call"] == ["ls"]


def test_the_openai_sdk_reads_context_length_exceeded(url: str, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=HUGE)  # type: ignore[arg-type]
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "max_tokens"
    assert httpx.get(f"{url}/ready", timeout=10).status_code == 200
