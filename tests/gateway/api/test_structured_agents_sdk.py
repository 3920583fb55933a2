"""The OpenAI Agents SDK acting through agentserve on SmolLM2: an agent with two function tools and
`tool_choice="required"` for its first step executes a tool and finishes (with that tool's output), over Responses
HTTP, the Responses WebSocket and chat completions; an agent with a pydantic `output_type` gets a valid object."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents import responses_websocket_session as agents_websocket_session
from agents.items import ToolCallItem, ToolCallOutputItem
from pydantic import BaseModel, Field

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.slow
set_tracing_disabled(True)  # the SDK would export traces to OpenAI
RUNS = int(os.environ.get("AGENTSERVE_SDK_RUNS", "2"))  # runs per case; the measurement: 20
executed: list[str] = []


@function_tool
def list_files(path: str) -> str:
    """List the files in a directory."""
    executed.append(f"list_files {path}")
    return "README.md\nsetup.py\nsrc/"


@function_tool
def read_file(path: str) -> str:
    """Read a text file."""
    executed.append(f"read_file {path}")
    return "print('hello')"


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=150)


@pytest.fixture(scope="module")
def smollm2_url() -> Iterator[str]:
    settings = GatewaySettings(model="smollm2", port=free_port(), default_max_tokens=96)
    with running_gateway(settings, LLMEngine("smollm2", EngineSettings(num_kv_blocks=1024))) as url:
        yield url


def tool_agent(model: Any) -> Agent[Any]:
    """SmolLM2's free-text answer after a tool's output can run past any max_tokens (the SDK then fails the run):
    the agent finishes with its first tool's output. One call a step: with parallel calls allowed the model repeats
    its call, up to 4 times, and the fourth may not fit max_tokens."""
    settings = ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=128)
    return Agent(name="files", instructions="You help with files.", tools=[list_files, read_file], model=model,
                 model_settings=settings, tool_use_behavior="stop_on_first_tool")


def assert_executed_a_tool_and_finished(result: Any) -> None:
    assert any(isinstance(item, ToolCallItem) for item in result.new_items)
    assert any(isinstance(item, ToolCallOutputItem) for item in result.new_items)
    assert result.final_output in ("README.md\nsetup.py\nsrc/", "print('hello')")


async def test_required_tool_choice_over_responses_http_and_chat(smollm2_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{smollm2_url}/v1", api_key="unused", max_retries=0)
    async with client:
        for model in (OpenAIResponsesModel("smollm2", client), OpenAIChatCompletionsModel("smollm2", client)):
            for run in range(RUNS):
                before = len(executed)
                result = await Runner.run(tool_agent(model), f"What files are in project{run}?", max_turns=4)
                assert_executed_a_tool_and_finished(result)
                assert len(executed) > before


async def test_required_tool_choice_over_the_responses_websocket(smollm2_url: str) -> None:
    async with agents_websocket_session(api_key="unused", base_url=f"{smollm2_url}/v1") as session:
        for run in range(RUNS):
            before = len(executed)
            result = await session.run(tool_agent("smollm2"), f"Show me what is in folder{run}.", max_turns=4)
            assert_executed_a_tool_and_finished(result)
            assert len(executed) > before


async def test_output_type_returns_a_valid_object(smollm2_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{smollm2_url}/v1", api_key="unused", max_retries=0)
    async with client:
        for model in (OpenAIResponsesModel("smollm2", client), OpenAIChatCompletionsModel("smollm2", client)):
            agent = Agent(name="people", instructions="You describe people.", output_type=Person, model=model,
                          model_settings=ModelSettings(temperature=0, max_tokens=64))
            for run in range(RUNS):
                result = await Runner.run(agent, f"Describe person number {run}.")
                assert isinstance(result.final_output, Person)
