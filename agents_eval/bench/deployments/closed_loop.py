"""The closed-loop driver of `agentserve bench --workload W --loop closed`: a fixed number of agents, each
running its next session as soon as its last one ends (after the session's own tool and user gaps), for a
window; what Continuum and ThunderAgent report, where an open-loop arrival rate does not fit the time budget.

- `run_agents`: N agents at once over a list of sessions (agent i runs sessions i, i+N, ...) until the
  window ends; requests still running then get the drain timeout (one still running after it is an error);
- `agents_held`: steps the agent count up (doubling) until a step misses the SLO, then probes once between the
  last step that held and the first that did not; the most agents held is the largest count that held;
- `batch_completion`: a fixed batch of sessions, all started at once; the time until the last one's last reply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from agents_eval.harness.drive import (
    Budget,
    Clock,
    DriveResult,
    OnRecord,
    OpenSession,
    RunLimits,
    SessionRun,
    settle,
)
from agents_eval.harness.stats import RequestRecord, Slo, slo_attainment
from agents_eval.workloads.types import SessionScript

SLO_SHARE = 0.9  # a step holds its agents when this share of its requests meets the SLO (DistServe's 90%)


async def run_agents(sessions: Sequence[SessionScript], agents: int, open_session: OpenSession, limits: RunLimits,
                     on_record: OnRecord) -> DriveResult:
    """`agents` agents at once over `sessions`, each starting its next session when its last ends, while the
    window (`limits.duration_s`) lasts; every request the agents sent, in the order they finished."""
    records: list[RequestRecord] = []
    session_errors: list[str] = []
    clock = Clock()
    budget = Budget(limits, clock)

    def record(item: RequestRecord) -> None:
        records.append(item)
        on_record(item)

    async def agent(first: int) -> None:
        for index in range(first, len(sessions), agents):
            if clock.now() >= limits.duration_s:
                return
            script = replace(sessions[index], start_s=0.0)
            await SessionRun(script, clock, budget, limits, record, session_errors).run(open_session)

    tasks = [asyncio.create_task(agent(first)) for first in range(min(agents, len(sessions)))]
    await settle(tasks, limits.duration_s + limits.drain_timeout_s)
    return DriveResult(records, session_errors)


@dataclass(frozen=True)
class Step:
    agents: int
    records: list[RequestRecord]
    session_errors: list[str]
    attainment: float  # share of the step's requests within the SLO (a failed one is a miss)
    held: bool


RunStep = Callable[[int], Awaitable[DriveResult]]


async def agents_held(run_step: RunStep, slo: Slo, max_agents: int,
                      may_step: Callable[[], bool] = lambda: True) -> list[Step]:
    """The steps in the order run: 1, 2, 4, ... agents (at most `max_agents`) until one misses the SLO, then one
    probe halfway between the last count that held and that one; no step once `may_step()` is False (the run's
    time budget), the first one aside."""
    steps: list[Step] = []
    agents = 1
    while agents <= max_agents and (not steps or may_step()):
        steps.append(await _step(run_step, agents, slo))
        if not steps[-1].held:
            break
        agents = max_agents if agents < max_agents < 2 * agents else 2 * agents
    held = [step.agents for step in steps if step.held]
    missed = [step.agents for step in steps if not step.held]
    between = (max(held, default=0) + missed[0]) // 2 if missed else 0
    if between > max(held, default=0) and may_step():
        steps.append(await _step(run_step, between, slo))
    return steps


async def _step(run_step: RunStep, agents: int, slo: Slo) -> Step:
    result = await run_step(agents)
    attainment = slo_attainment(result.records, slo)
    held = bool(result.records) and not result.session_errors and attainment >= SLO_SHARE
    return Step(agents, result.records, result.session_errors, attainment, held)


def most_agents_held(steps: Sequence[Step]) -> int:
    """The largest agent count that held, below the smallest that did not (0: not even one agent)."""
    missed = min((step.agents for step in steps if not step.held), default=None)
    return max((s.agents for s in steps if s.held and (missed is None or s.agents < missed)), default=0)


def batch_completion_s(sessions: Sequence[SessionScript], result: DriveResult) -> float | None:
    """Seconds from the batch's start to its last reply; None unless every turn of every session finished."""
    done = {(r.session_id, r.turn) for r in result.records if r.ok}
    wanted = {(s.session_id, turn) for s in sessions for turn in range(len(s.turns))}
    if result.session_errors or not wanted <= done:
        return None
    return max(r.done_at_s for r in result.records if r.ok)
