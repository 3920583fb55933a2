"""One deployment measured closed-loop: started, warmed up, then its light load (one agent), its agent-count
steps (`closed_loop.agents_held`) and its batch, each on sessions of the same workload; stopped."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import uvloop

from agents_eval.bench.agent.run import HTTP
from agents_eval.bench.agent.workload import warm_up_workload
from agents_eval.bench.deployments.closed_loop import Step, agents_held, run_agents
from agents_eval.bench.deployments.deployments import Endpoint, running_deployment
from agents_eval.bench.deployments.settings import ClosedLoopSettings
from agents_eval.harness.client import HttpPool
from agents_eval.harness.drive import DriveResult, OpenSession, RunLimits, chat_opener, drive, ws_opener
from agents_eval.harness.servers.gateway import model_name
from agents_eval.harness.stats import RequestRecord, Slo
from agents_eval.workloads.types import SessionScript

OnRecord = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class Plan:
    """The sessions every deployment gets: the light-load agent's, the steps' pool, the batch."""

    light: SessionScript
    pool: tuple[SessionScript, ...]
    batch: tuple[SessionScript, ...]


@dataclass
class Measured:
    name: str
    endpoint: Endpoint
    light: DriveResult
    steps: list[Step] = field(default_factory=list)
    batch: DriveResult | None = None


def make_plan(sessions: Sequence[SessionScript], settings: ClosedLoopSettings) -> Plan:
    if len(sessions) < settings.batch_sessions + 2:
        raise ValueError(f"the workload has {len(sessions)} sessions; the closed loop needs "
                         f"{settings.batch_sessions + 2} at least")
    batch = tuple(replace(s, turns=s.turns[:settings.batch_calls]) for s in sessions[:settings.batch_sessions])
    return Plan(sessions[settings.batch_sessions], tuple(sessions[settings.batch_sessions + 1:]), batch)


def measure_deployment(name: str, settings: ClosedLoopSettings, plan: Plan, slo: Slo | None, log_dir: Path,
                       on_record: OnRecord, budget_s: float = math.inf) -> Measured:
    """The light load, and with an SLO the steps and the batch too (without one: the calibration run); no
    agent-count step (after the first) that would end later than `budget_s` from the start, less the batch's."""
    start = time.monotonic()
    with running_deployment(name, settings.options, log_dir) as endpoint:
        budget_s -= time.monotonic() - start
        return uvloop.run(_measure(name, endpoint, settings, plan, slo, on_record, budget_s))


async def _measure(name: str, endpoint: Endpoint, settings: ClosedLoopSettings, plan: Plan, slo: Slo | None,
                   on_record: OnRecord, budget_s: float) -> Measured:
    import openai

    pool = HttpPool(endpoint.url, settings.request_timeout_s, endpoint.headers)
    openai_client = openai.AsyncOpenAI(base_url=f"{endpoint.url}/v1", api_key="unused", max_retries=0,
                                       timeout=settings.request_timeout_s)
    try:
        async with httpx.AsyncClient(base_url=endpoint.url, timeout=10.0, headers=endpoint.headers) as http:
            model = endpoint.model or await model_name(http)
        opener = session_opener(endpoint, model, pool, openai_client)
        await _warm_up(opener, settings)
        light = await run_agents([plan.light], 1, opener, _limits(settings, 10 * settings.request_timeout_s,
                                                                  settings.light_calls), on_record)
        measured = Measured(name, endpoint, light)
        if slo is not None:
            deadline = time.monotonic() + budget_s - settings.batch_timeout_s
            step_s = settings.window_s + settings.drain_timeout_s
            measured.steps = await agents_held(_stepper(plan, opener, settings, on_record), slo,
                                               settings.options.max_agents,
                                               lambda: time.monotonic() + step_s <= deadline)
            measured.batch = await run_agents(plan.batch, len(plan.batch), opener,
                                              _limits(settings, settings.batch_timeout_s), on_record)
        return measured
    finally:
        await pool.close()
        await openai_client.close()


def _stepper(plan: Plan, opener: OpenSession, settings: ClosedLoopSettings, on_record: OnRecord) -> Any:
    """Each step on sessions of its own (the pool's next ones), so no step starts on a previous step's caches."""
    used = 0

    async def run_step(agents: int) -> DriveResult:
        nonlocal used
        start = used % len(plan.pool)
        sessions = (plan.pool[start:] + plan.pool[:start])
        used += 3 * agents
        return await run_agents(sessions, agents, opener, _limits(settings, settings.window_s), on_record)

    return run_step


def _limits(settings: ClosedLoopSettings, duration_s: float, max_requests: int | None = None) -> RunLimits:
    return RunLimits(duration_s, max_requests, settings.request_timeout_s, settings.drain_timeout_s)


def session_opener(endpoint: Endpoint, model: str, pool: HttpPool, openai_client: Any) -> OpenSession:
    if not endpoint.sessions:
        return chat_opener(pool, model, session_ids=False)
    if endpoint.client == HTTP:
        return chat_opener(pool, model, session_ids=True)
    return ws_opener(openai_client, model)


async def _warm_up(opener: OpenSession, settings: ClosedLoopSettings) -> None:
    limits = RunLimits(settings.request_timeout_s, request_timeout_s=settings.request_timeout_s)
    result = await drive(warm_up_workload(settings.warm_up_turns), opener, limits, lambda record: None)
    failures = [r.error for r in result.records if r.error] + result.session_errors
    if failures or len(result.records) < settings.warm_up_turns:
        raise RuntimeError(f"the deployment failed its warm-up: {failures or 'too few replies'}")
