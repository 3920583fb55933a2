"""Pruning and masks engage on observations wherever they arrive: chat tool messages, Responses
`function_call_output` items, and user messages after a reply; seen through the gateway's Prometheus counters."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents_eval.harness.client import ChatSession, HttpPool, WsSession
from agents_eval.workloads import Workload, swe

NOISY = "\n".join(["$ pytest -q", *["FAILED tests/test_app.py::test_x -   AssertionError......."] * 8, "1 failed"])
TOOLS: list[Any] = [{"type": "function", "function": {"name": "shell", "description": "Run a command.",
                                                      "parameters": {"type": "object", "properties": {}}}}]
COUNTERS = ("agentserve:pruned_tokens_total", "agentserve:masked_tokens_total")


@pytest.fixture(scope="module")
def client(gateway_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0) as opened:
        yield opened


def counters(url: str) -> dict[str, float]:
    families = text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
    samples = {sample.name: sample.value for family in families for sample in family.samples}
    return {name: samples.get(name, 0.0) for name in COUNTERS}


def pruned_and_masked(url: str, play: Callable[[], object]) -> tuple[float, float]:
    before = counters(url)
    play()
    after = counters(url)
    pruned, masked = (after[name] - before[name] for name in COUNTERS)
    return pruned, masked


def chat_session(client: openai.OpenAI, session_id: str, observation_role: str, turns: int = 4,
                 metadata: dict[str, str] | None = None) -> None:
    """An agent's session: the task, then per reply a tool call and its noisy observation."""
    messages: list[Any] = [{"role": "system", "content": "You fix failing tests."},
                           {"role": "user", "content": "Fix   the failing test......."}]
    for step in range(turns):
        reply = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=2, temperature=0, tools=TOOLS if observation_role == "tool"
            else openai.omit, extra_headers={"X-Session-Id": session_id}, metadata=metadata or openai.omit)
        call = {"id": f"call_{step}", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
        content = reply.choices[0].message.content or ""
        if observation_role == "tool":
            messages += [{"role": "assistant", "content": content, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"], "content": NOISY}]
        else:
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": NOISY}]


def test_chat_tool_messages_are_pruned_and_masked(client: openai.OpenAI, gateway_url: str) -> None:
    pruned, masked = pruned_and_masked(gateway_url, lambda: chat_session(client, "obs-tool", "tool"))
    assert pruned > 0 and masked > 0


def test_chat_user_observations_are_pruned_and_masked(client: openai.OpenAI, gateway_url: str) -> None:
    agent = {"observation_users": "after_assistant"}
    pruned, masked = pruned_and_masked(gateway_url, lambda: chat_session(client, "obs-user", "user", 4, agent))
    assert pruned > 0 and masked > 0


def test_a_plain_chat_keeps_its_follow_up_questions(client: openai.OpenAI, gateway_url: str) -> None:
    pruned, masked = pruned_and_masked(gateway_url, lambda: chat_session(client, "chat-user", "user"))
    assert pruned == 0 and masked == 0


def test_metadata_keeps_user_messages_whole(client: openai.OpenAI, gateway_url: str) -> None:
    never = {"observation_users": "never"}
    assert pruned_and_masked(gateway_url, lambda: chat_session(client, "obs-never", "user", metadata=never)) == (0, 0)
    with pytest.raises(openai.BadRequestError, match="observation_users must be one of"):
        chat_session(client, "obs-bad", "user", 1, {"observation_users": "sometimes"})


def responses_session(client: openai.OpenAI, turns: int = 4) -> None:
    response = client.responses.create(model="tiny", input="Fix   the failing test.......",
                                       instructions="You fix failing tests.", max_output_tokens=2, temperature=0)
    for step in range(turns):
        output: Any = {"type": "function_call_output", "call_id": f"call_{step}", "output": NOISY}
        response = client.responses.create(model="tiny", input=[output], previous_response_id=response.id,
                                           max_output_tokens=2, temperature=0)


def test_function_call_outputs_are_pruned_and_masked(client: openai.OpenAI, gateway_url: str) -> None:
    pruned, masked = pruned_and_masked(gateway_url, lambda: responses_session(client))
    assert pruned > 0 and masked > 0


def small_swe(observations: str) -> Workload:
    return swe.build(seed=4, max_sessions=1, max_requests=5, observations=observations)


async def play_chat(url: str, workload: Workload) -> None:
    pool = HttpPool(url, 60.0)
    [script] = workload.sessions
    session = ChatSession(pool, "tiny", script.system, script.session_id)
    for turn in script.turns:
        await session.send(turn)
    await pool.close()


async def play_ws(url: str, workload: Workload) -> None:
    sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    [script] = workload.sessions
    async with sdk.responses.connect() as connection:
        session = WsSession(connection, "tiny", script.system)
        for turn in script.turns:
            await session.send(turn)


@pytest.mark.parametrize("observations", ["tool", "user"])
@pytest.mark.parametrize("play", [play_chat, play_ws])
def test_agent_bench_clients_play_swe_sessions_with_masked_observations(
        gateway_url: str, observations: str, play: Callable[[str, Workload], Any]) -> None:
    workload = small_swe(observations)
    assert len(workload.sessions[0].turns) == 5
    _, masked = pruned_and_masked(gateway_url, lambda: asyncio.run(play(gateway_url, workload)))
    assert masked > 0
