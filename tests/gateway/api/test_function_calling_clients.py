"""Function-calling agent sessions as real clients send them: the openai SDK over chat completions (tools,
assistant `tool_calls`, `tool` messages) and over the Responses WebSocket (`function_call` and
`function_call_output` items after `previous_response_id`), and the OpenAI Agents SDK over both.

Each session keeps its KV from turn to turn (cached tokens cover the previous prompt and reply) and its tool
outputs are pruned and masked. The tiny model never calls a tool nor stops by itself, so the calls are the
client's (a framework replaying a call its tool ran); the Agents SDK refuses a Responses reply cut short by
`max_output_tokens`, so its WebSocket session runs on SmolLM2, whose replies end.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents import responses_websocket_session as agents_websocket_session

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.settings import GatewaySettings
from tests.conftest import free_port, openai_client
from tests.gateway.conftest import running_gateway
from tests.gateway.test_observations import NOISY, counters

set_tracing_disabled(True)  # the Agents SDK would export traces to OpenAI
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "shell", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": "shell", "description": "Run a shell command.",
                               "parameters": CHAT_TOOLS[0]["function"]["parameters"]}]
TURNS = 4


@function_tool
def shell(command: str) -> str:
    """Run a shell command."""
    return NOISY


def async_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def call_items(step: int) -> list[Any]:
    """A call of the shell tool and its output, as Responses items (what a framework sends after running it)."""
    return [{"type": "function_call", "call_id": f"call_{step}", "name": "shell",
             "arguments": json.dumps({"command": "pytest -q"})},
            {"type": "function_call_output", "call_id": f"call_{step}", "output": NOISY}]


def assert_each_turn_reuses_the_last(usages: list[tuple[int, int, int]]) -> None:
    """(prompt, cached, output) per turn: every turn's cache holds the previous prompt and reply."""
    for (prompt, _, output), (next_prompt, cached, _) in itertools.pairwise(usages):
        assert prompt + output - 1 <= cached < next_prompt


def test_openai_sdk_chat_session_with_tool_calls(gateway_url: str) -> None:
    client = openai_client(gateway_url)
    messages: list[Any] = [{"role": "system", "content": "You fix failing tests."},
                           {"role": "user", "content": "Fix the failing test."}]
    usages = []
    before = counters(gateway_url)
    for step in range(TURNS):
        reply = client.chat.completions.create(model="tiny", messages=messages, tools=CHAT_TOOLS, max_tokens=3,
                                               temperature=0, extra_headers={"X-Session-Id": "chat-tool-calls"})
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        usages.append((reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens or 0,
                       reply.usage.completion_tokens))
        call = {"id": f"call_{step}", "type": "function",
                "function": {"name": "shell", "arguments": json.dumps({"command": "pytest -q"})}}
        messages += [reply.choices[0].message.model_dump(exclude_none=True),
                     {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": NOISY}]
    after = counters(gateway_url)
    assert_each_turn_reuses_the_last(usages)
    assert all(after[name] > before[name] for name in after)  # tool results pruned, older ones masked


async def test_openai_sdk_responses_websocket_session_with_function_calls(gateway_url: str) -> None:
    usages = []
    before = counters(gateway_url)
    async with async_client(gateway_url) as client, client.responses.connect() as connection:
        previous: str | None = None
        for step in range(TURNS):
            continuation = {"previous_response_id": previous} if previous else {"instructions": "You fix tests."}
            event: Any = {"type": "response.create", "model": "tiny", "tools": RESPONSES_TOOLS, "max_output_tokens": 3,
                          "temperature": 0, **continuation,
                          "input": call_items(step - 1) if step else "Fix the failing test."}
            await connection.send(event)
            async for reply in connection:
                assert reply.type not in ("error", "response.failed"), reply
                if reply.type in ("response.completed", "response.incomplete"):
                    usage = reply.response.usage
                    assert usage is not None
                    usages.append((usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens))
                    previous = reply.response.id
                    break
    after = counters(gateway_url)
    assert len(usages) == TURNS
    assert_each_turn_reuses_the_last(usages)
    assert all(after[name] > before[name] for name in after)


async def test_agents_sdk_chat_session_replays_its_function_calls(gateway_url: str) -> None:
    async with async_client(gateway_url) as client:
        await agents_sdk_chat_session(client, gateway_url)


async def agents_sdk_chat_session(client: openai.AsyncOpenAI, gateway_url: str) -> None:
    settings = ModelSettings(max_tokens=3, temperature=0, extra_headers={"X-Session-Id": "agents-sdk-chat"})
    agent = Agent(name="fixer", instructions="You fix failing tests.", tools=[shell], model_settings=settings,
                  model=OpenAIChatCompletionsModel(model="tiny", openai_client=client))
    without_tools = Agent(name="bare", instructions="You fix failing tests.", model_settings=settings.resolve(
        ModelSettings(extra_headers={"X-Session-Id": "agents-sdk-bare"})),
        model=OpenAIChatCompletionsModel(model="tiny", openai_client=client))
    before = counters(gateway_url)
    result = await Runner.run(agent, "Fix the failing test.")
    usages = [_usage(result)]
    for step in range(TURNS - 1):
        result = await Runner.run(agent, [*result.to_input_list(), *call_items(step)])
        usages.append(_usage(result))
    after = counters(gateway_url)
    assert_each_turn_reuses_the_last(usages)
    assert all(after[name] > before[name] for name in after)
    bare = await Runner.run(without_tools, "Fix the failing test.")
    assert _usage(bare)[0] < usages[0][0]  # the SDK's schema of `shell` is in the agent's prompt


def _usage(result: Any) -> tuple[int, int, int]:
    usage = result.context_wrapper.usage
    return usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens


@pytest.fixture(scope="module")
def smollm2_url() -> Iterator[str]:
    settings = GatewaySettings(model="smollm2", port=free_port())
    with running_gateway(settings, LLMEngine("smollm2", EngineSettings(num_kv_blocks=512))) as url:
        yield url


@pytest.mark.slow
async def test_agents_sdk_responses_websocket_session_with_function_calls(smollm2_url: str) -> None:
    agent = Agent(name="assistant", instructions="You are a helpful assistant.", tools=[shell], model="smollm2",
                  model_settings=ModelSettings(max_tokens=96, temperature=0))
    before = counters(smollm2_url)
    async with agents_websocket_session(api_key="unused", base_url=f"{smollm2_url}/v1") as session:
        result = await session.run(agent, "Say hello.")
        usages = [_usage(result)]
        for step in range(TURNS - 1):
            result = await session.run(agent, call_items(step), previous_response_id=result.last_response_id)
            usages.append(_usage(result))
            assert result.final_output, step
    after = counters(smollm2_url)
    assert_each_turn_reuses_the_last(usages)
    assert all(after[name] > before[name] for name in after)
