"""The closed-loop driver on a stand-in client: N agents at once, each running its sessions in turn; the
agent-count steps (doubling, then one probe between) and the most agents held; batch completion; the order of
the deployments; the goals on hand-built figures."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from agents_eval.bench.agent.configs import CONFIGS
from agents_eval.bench.agent.run import gateway_env
from agents_eval.bench.agent.workload import WorkloadOptions
from agents_eval.bench.deployments.closed_loop import (
    agents_held,
    batch_completion_s,
    most_agents_held,
    run_agents,
)
from agents_eval.bench.deployments.deployments import DEPLOYMENTS, ENGINE_CONFIGS
from agents_eval.bench.deployments.figures import cut_short, goals
from agents_eval.bench.deployments.settings import ClosedLoopSettings, interleaved
from agents_eval.harness.client import Reply, SessionClient
from agents_eval.harness.drive import DriveResult, RunLimits, SessionLike
from agents_eval.harness.stats import RequestRecord, Slo
from agents_eval.workloads.types import SessionScript, Turn

SLO = Slo(ttft_s=1.0, tpot_s=0.1)


def script(session_id: str, turns: int, start_s: float = 5.0) -> SessionScript:
    steps = tuple(Turn(None, 0.0, ({"role": "user", "content": f"t{i}"},), 2, 3, "act", "append")
                  for i in range(turns))
    return SessionScript(session_id, start_s, "sys", steps)


@dataclass
class Agents:
    """A stand-in server: replies after a yield, and tracks how many sessions are open at once."""

    open_now: int = 0
    most_open: int = 0
    order: list[str] = field(default_factory=list)

    @asynccontextmanager
    async def open_session(self, script: SessionLike) -> AsyncIterator[SessionClient]:
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        self.order.append(script.session_id)
        try:
            yield self
        finally:
            self.open_now -= 1

    async def send(self, turn: Any) -> Reply:
        await asyncio.sleep(0)
        return Reply("ok", 0.01, 0.03, 10, 0, turn.max_output_tokens)


def test_run_agents_keeps_n_sessions_open_and_runs_each_agents_sessions_in_turn() -> None:
    sessions = [script(f"s{i}", 2) for i in range(7)]  # start_s 5 is ignored: a closed loop starts at once
    agents = Agents()
    result = asyncio.run(run_agents(sessions, 3, agents.open_session, RunLimits(duration_s=30.0), lambda r: None))
    assert agents.most_open == 3
    assert sorted(agents.order) == sorted(s.session_id for s in sessions)
    assert agents.order[:3] == ["s0", "s1", "s2"]  # agent i runs i, i+3, i+6
    assert len(result.records) == 14 and all(r.ok for r in result.records)
    assert batch_completion_s(sessions, result) == max(r.done_at_s for r in result.records)
    assert batch_completion_s([*sessions, script("never-run", 1)], result) is None


def test_run_agents_starts_no_session_after_the_window() -> None:
    agents = Agents()
    result = asyncio.run(run_agents([script("a", 1), script("b", 1)], 1, agents.open_session,
                                    RunLimits(duration_s=0.0), lambda r: None))
    assert agents.order == [] and result.records == []


def step_result(agents: int, capacity: int) -> DriveResult:
    """Each of `agents` agents sends one request; it meets the SLO while agents <= capacity."""
    ttft = 0.5 if agents <= capacity else 2.0
    return DriveResult([RequestRecord(f"s{i}", 0, "act", 0.0, ttft, ttft + 0.15, 10, 0, 4) for i in range(agents)], [])


def held_steps(capacity: int, max_agents: int = 16) -> tuple[list[tuple[int, bool]], int]:
    async def run_step(agents: int) -> DriveResult:
        return step_result(agents, capacity)

    steps = asyncio.run(agents_held(run_step, SLO, max_agents))
    return [(step.agents, step.held) for step in steps], most_agents_held(steps)


def test_agent_steps_double_until_a_miss_then_probe_once_between() -> None:
    assert held_steps(5) == ([(1, True), (2, True), (4, True), (8, False), (6, False)], 4)
    assert held_steps(6) == ([(1, True), (2, True), (4, True), (8, False), (6, True)], 6)
    assert held_steps(0) == ([(1, False)], 0)
    assert held_steps(50, max_agents=12) == ([(1, True), (2, True), (4, True), (8, True), (12, True)], 12)


def test_the_time_budget_stops_the_steps_after_the_first() -> None:
    async def run_step(agents: int) -> DriveResult:
        return step_result(agents, 100)

    steps = asyncio.run(agents_held(run_step, SLO, 16, may_step=lambda: False))
    assert [step.agents for step in steps] == [1]
    assert cut_short(steps, 16) and not cut_short(steps, 1)  # held 1: a lower bound unless 1 was the most asked


def test_steps_stopped_by_a_miss_are_not_cut_short() -> None:
    async def run_step(agents: int) -> DriveResult:
        return step_result(agents, 5)

    assert not cut_short(asyncio.run(agents_held(run_step, SLO, 16)), 16)


def test_deployments_run_interleaved_and_rotated() -> None:
    names = ("baseline", "colocated", "disaggregated", "agent", "llama-server", "agentserve-upstreams",
             "litellm-upstreams")
    assert names == DEPLOYMENTS
    assert interleaved(names) == ("llama-server", "baseline", "litellm-upstreams", "colocated", "disaggregated",
                                  "agent", "agentserve-upstreams")
    settings = ClosedLoopSettings(WorkloadOptions("coding-agent"), names, rotate=1)
    assert settings.ordered()[0] == "baseline" and settings.ordered()[-1] == "llama-server"


def test_colocated_is_agentserve_serve_as_it_starts_one_engine_on_every_core() -> None:
    config = CONFIGS[ENGINE_CONFIGS["colocated"]]
    deployment = config.deployment(2, 1)
    assert (deployment["kind"], deployment["processes"], deployment["threads"]) == ("colocated", 1, 2)
    env = gateway_env(config.name, {})
    assert env["AGENTSERVE_DISAGGREGATED"] == "false" and env["AGENTSERVE_ENGINE_NUM_THREADS"] == "2"
    assert env["AGENTSERVE_TRAJECTORY_PRUNE"] == env["AGENTSERVE_TRAJECTORY_MASKS__ENABLED"] == "true"
    assert config.sessions and config.prefix_caching


def figures(agents: int, batch_s: float | None, per_call_s: float) -> dict[str, Any]:
    return {"agents_held": agents, "batch": {"completion_s": batch_s}, "light_load": {"per_call_s_p50": per_call_s}}


def test_goals_compare_agentserves_best_with_the_best_other() -> None:
    configs = {"baseline": figures(2, 90.0, 0.40), "agentserve-upstreams": figures(9, 30.0, 0.21),
               "llama-server": figures(6, 50.0, 0.20), "litellm-upstreams": figures(4, None, 0.25)}
    agents, batch, light = goals(configs)
    assert agents["measured"] == 1.5 and agents["met"] and agents["ours"] == "agentserve-upstreams"
    assert agents["lower_bounds"] == []
    assert batch["measured"] == 0.6 and batch["met"] and batch["best_other"] == "llama-server"
    assert math.isclose(light["measured"], 1.05) and light["met"]
    assert not goals({**configs, "llama-server": figures(8, 50.0, 0.1)})[0]["met"]
