"""The capacity benchmark's swing in the cluster simulator (`agentserve bench capacity --simulated CAL`): the same
arrivals, the same policy objects (`CapacityPolicy`, the KV-aware router, the scheduler), on workers that are each
a unit of capacity, stepping at the times a calibration (`agentserve profile`) measured for one worker alone.

Why: on this host every worker process shares two cores, so a worker is not a unit of capacity. A swing light
enough to leave the cores free never asks for a move (no role misses its target), and one that asks for moves
overloads the cores, where each worker's measured rates depend on how many others run (docs/capacity.md). The
simulator answers the question the benchmark asks, how the controller follows a swing where each worker has
its own compute, and labels it simulated.

What differs from the real run: a moved worker serves in its new role after its current step (the real one also
confirms over its pipe, 1-4 ms measured); the controller decides every `interval_s` (the real one also decides at
once when the admitted work changes, so the simulated latencies are up to one interval longer); the think/act
classifier's shift events are not simulated (only the admitted demand moves workers)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents_eval.bench.capacity.swing import RunResult, SwingWorkload, note_window
from agents_eval.sim.model.config import ClusterConfig, Pool
from agents_eval.sim.model.controller import PlannedSplit
from agents_eval.sim.model.records import RunLog
from agents_eval.sim.run import simulate
from agents_eval.sim.validation.absolute import engine_knobs
from agents_eval.sim.workload import SimSession, SimTurn
from agents_eval.workloads.types import APPEND
from engine.capacity.settings import CapacitySettings


def swing_sessions(workload: SwingWorkload) -> list[SimSession]:
    """Each turn of the swing as a one-turn session of fresh tokens (the real run's prompts share nothing)."""
    sessions = []
    for index, (at, phase) in enumerate(workload.arrivals()):
        prompt, output = workload.sizes(phase)
        sessions.append(SimSession(f"swing-{index:05d}", at, 0, APPEND, (SimTurn(0.0, prompt, output, phase),)))
    return sessions


def swing_cluster(model: str, split: tuple[int, int], capacity: CapacitySettings, calibration: Path
                  ) -> ClusterConfig:
    """`split[0]` prefill and `split[1]` decode workers, one calibrated CPU core each, as worker processes over
    shared memory (the real benchmark's deployment), the controller on when `capacity.enabled`."""
    pools = (Pool(device="cpu", nodes=split[0], gpus_per_node=1, tensor_parallel=1, role="prefill"),
             Pool(device="cpu", nodes=split[1], gpus_per_node=1, tensor_parallel=1, role="decode"))
    overrides = capacity.model_dump()
    return ClusterConfig(name=f"swing {split[0]}P/{split[1]}D", model=model, dtype="float32", pools=pools,
                         engine=engine_knobs(model), transport="shm", calibration=str(calibration), capacity=overrides,
                         controller=capacity.enabled, worker_processes=True)


def simulate_swing(model: str, workload: SwingWorkload, split: tuple[int, int], capacity: CapacitySettings,
                   calibration: Path, plan: tuple[tuple[int, int], tuple[int, int]] | None = None) -> RunResult:
    """One swing through the simulator, recorded as the real run records it: TTFT from the planned arrival,
    the controller's moves (each applied at once) as its events, the split over time. With `plan` (think and
    act splits) the split follows the swing's schedule instead of the controller (`PlannedSplit`)."""
    if plan is not None:
        capacity = capacity.model_copy(update={"enabled": True})
    config = swing_cluster(model, split, capacity, calibration)
    policy = None if plan is None else PlannedSplit(capacity, _by_phase(workload, *plan))
    cluster, _ = simulate(config, swing_sessions(workload), policy=policy)
    requests = cluster.log.requests
    result = RunResult(requests=len(requests), finished=len(requests))
    result.ttft_s = [r.ttft_s for r in requests]
    result.tpot_s = [r.tpot_s for r in requests if r.tokens > 1]
    for at, _ in workload.arrivals():
        note_window(result, workload, at)
    result.events = move_events(cluster.log)
    result.timeline = _steps(cluster.log.splits, workload)
    return result


def _by_phase(workload: SwingWorkload, think: tuple[int, int], act: tuple[int, int]
              ) -> Callable[[float], tuple[int, int]]:
    """The split the swing's schedule gives each moment: `think` in think windows, `act` in act windows."""
    return lambda now: think if workload.window_phase(now) == "think" else act


def move_events(log: RunLog) -> list[dict[str, Any]]:
    """The controller's moves and the moved workers serving in their new roles, as the real run's events."""
    return [{"at": change.at_s, "worker_id": change.worker_id, "role": change.role, "kind": kind}
            for kind, changes in (("move", log.role_changes), ("role_applied", log.roles_applied))
            for change in changes]


def _steps(splits: list[tuple[float, int, int]], workload: SwingWorkload) -> list[tuple[float, int, float]]:
    """The split as a step line (a point before and after each change, and at the end), beside the window's
    planned think share (the simulation has no phase monitor)."""
    share = {"think": workload.majority, "act": 1 - workload.majority}
    points: list[tuple[float, int, float]] = []
    for at, prefill, _ in splits:
        if points:
            points.append((at, points[-1][1], share[workload.window_phase(at)]))
        points.append((at, prefill, share[workload.window_phase(at)]))
    if points:
        points.append((workload.duration_s, points[-1][1], share[workload.window_phase(workload.duration_s)]))
    return points
