"""Equal work across clients: the same swe and webarena sessions, driven through the chat client with a session
id and through the Responses WebSocket client (the agent's), reach a real gateway as the same prompts: with
pruning and masks off, the gateway counts the same prompt tokens for every (session, turn). Tools go with every
request and tool messages keep their names whichever the transport.

The stateless chat client (the baseline's: the whole history resent as text, no session id) sends the same
messages, but the gateway tokenizes the replies it resends afresh, and the `tiny` model's replies (random
weights, ignore_eos) are token runs whose text encodes to a few more tokens than were generated: its first turns
count the same, a later turn at least as many and at most as many more as its history's earlier replies hold."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace

import httpx
import openai
import pytest

from agents_eval.bench.agent.configs import COMMON_ENV
from agents_eval.bench.agent.workload import WorkloadOptions, build_workload
from agents_eval.harness.client import HttpPool
from agents_eval.harness.drive import OpenSession, RunLimits, chat_opener, drive, ws_opener
from agents_eval.harness.servers.gateway import model_name, running_gateway
from agents_eval.harness.servers.process import ServerProcess
from agents_eval.workloads.types import Workload

ENV = {**COMMON_ENV, "AGENTSERVE_DISAGGREGATED": "false", "AGENTSERVE_ENGINE_ENABLE_PREFIX_CACHING": "true",
       "AGENTSERVE_TRAJECTORY_PRUNE": "false", "AGENTSERVE_TRAJECTORY_MASKS__ENABLED": "false"}
LIMITS = RunLimits(duration_s=600.0, request_timeout_s=120.0, drain_timeout_s=60.0)
CLIENTS = ("chat", "chat_session", "ws")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_gateway("tiny", ENV, tmp_path_factory.mktemp("equal-work") / "gateway.log") as process:
        yield process


def untimed(workload: Workload, tag: str) -> Workload:
    """The workload's sessions, all at once and without tool gaps (timing is not what this test is about), under
    session ids of their own per client."""
    sessions = tuple(replace(s, session_id=f"{tag}-{s.session_id}", start_s=0.0,
                             turns=tuple(replace(t, at_s=None, tool_gap_s=0.0) for t in s.turns))
                     for s in workload.sessions)
    return replace(workload, sessions=sessions)


def opener(client: str, model: str, pool: HttpPool, sdk: openai.AsyncOpenAI) -> OpenSession:
    return ws_opener(sdk, model) if client == "ws" else chat_opener(pool, model, session_ids=client == "chat_session")


async def prompt_tokens(url: str, workload: Workload, client: str) -> dict[tuple[str, int], int]:
    pool = HttpPool(url, LIMITS.request_timeout_s)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as sdk:
        async with httpx.AsyncClient(base_url=url) as http:
            model = await model_name(http)
        try:
            result = await drive(untimed(workload, client), opener(client, model, pool, sdk), LIMITS,
                                 lambda record: None)
        finally:
            await pool.close()
    assert not result.session_errors and all(r.ok for r in result.records), result.records
    return {(r.session_id.removeprefix(f"{client}-"), r.turn): r.prompt_tokens for r in result.records}


@pytest.mark.parametrize("name", ["swe", "webarena"])
def test_every_client_sends_the_same_prompt_tokens_for_every_session_and_turn(gateway: ServerProcess,
                                                                              name: str) -> None:
    workload = build_workload(WorkloadOptions(name, seed=3, duration_s=30.0, max_requests=12), "tiny", None)
    assert any(turn.tools for session in workload.sessions for turn in session.turns)  # function calling
    counts = {client: asyncio.run(prompt_tokens(gateway.url, workload, client)) for client in CLIENTS}
    assert len(counts["ws"]) == workload.num_requests
    assert counts["chat_session"] == counts["ws"]
    assert counts["chat"].keys() == counts["ws"].keys()
    for session in workload.sessions:
        replies = 0  # output tokens of the session's earlier replies: what re-tokenizing could add at most
        for turn, script in enumerate(session.turns):
            key = (session.session_id, turn)
            assert counts["ws"][key] <= counts["chat"][key] <= counts["ws"][key] + replies, key
            replies += script.max_output_tokens
