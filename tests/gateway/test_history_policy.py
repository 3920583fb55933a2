"""A request picks its history policy with `metadata.history_policy`: one the deployment offers is served, one
it does not is refused with a 400 naming the parameter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import GatewayProcess
from tests.gateway.test_observations import TOOLS

pytestmark = pytest.mark.slow


def agent_turns(client: openai.OpenAI, session_id: str, policy: str, turns: int = 3) -> list[str]:
    messages: list[Any] = [{"role": "system", "content": "You fix failing tests."},
                           {"role": "user", "content": "Fix the failing test."}]
    replies = []
    for step in range(turns):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0,
                                               tools=TOOLS, extra_headers={"X-Session-Id": session_id},
                                               metadata={"history_policy": policy})
        content = reply.choices[0].message.content or ""
        replies.append(content)
        call = {"id": f"call_{step}", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
        messages += [{"role": "assistant", "content": content, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": "error in line 42 " * 30}]
    return replies


@pytest.fixture(scope="module")
def client(gateway_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0) as opened:
        yield opened


@pytest.mark.parametrize("policy", ["age", "query", "attention"])
def test_an_offered_policy_is_served(client: openai.OpenAI, policy: str) -> None:
    assert len(agent_turns(client, f"history-{policy}", policy)) == 3


def test_an_unknown_policy_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="history policy 'newest' is not offered") as caught:
        agent_turns(client, "history-unknown", "newest", 1)
    assert caught.value.body["param"] == "metadata.history_policy"  # type: ignore[index]


def test_a_policy_this_deployment_lacks_is_refused(gateway_process: GatewayProcess) -> None:
    _, url = gateway_process(AGENTSERVE_TRAJECTORY_HISTORY__POLICIES='["age"]')
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError, match="offered: age"):
            agent_turns(client, "history-lacking", "query", 1)
        assert len(agent_turns(client, "history-age", "age", 1)) == 1


def test_picks_are_counted_by_policy(client: openai.OpenAI, gateway_url: str) -> None:
    """Each engine-scored policy's picks and the history blocks they held and left attended, on /metrics."""
    for policy in ("query", "attention"):
        agent_turns(client, f"history-metrics-{policy}", policy, turns=3)
    text = httpx.get(f"{gateway_url}/metrics", timeout=30).text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line.startswith("agentserve:history_")}
    for policy in ("query", "attention"):
        picks, held, attended = (values[f'agentserve:history_{name}_total{{policy="{policy}"}}']
                                 for name in ("picks", "blocks_held", "blocks_attended"))
        assert picks >= 1 and 0 <= attended <= held, values
