"""The think/act swing at cluster scale (`agentserve simulate --swing`): agent sessions whose turns swing between
think-heavy and act-heavy windows of 15-60 s, at loads of 50-90% of the deployment's capacity at the SLO, played
on one deployment configured five ways: the capacity controller, every fixed split, `planned` (the oracle that
moves at each window's start to the split that served that window best), and a static split sized for the
average demand. Each configuration runs in a process of its own (`jobs` at a time)."""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field
from typing import Any

from agents_eval.sim.jobs import in_processes
from agents_eval.sim.model.config import ClusterConfig
from agents_eval.sim.model.controller import PlannedSplit
from agents_eval.sim.model.records import Decided, RoleChange
from agents_eval.sim.run import Summary, Window, simulate
from agents_eval.sim.workload import SimSession, sessions_at
from agents_eval.workloads.arrivals import poisson_starts
from agents_eval.workloads.types import ACT, THINK
from engine.capacity.policy import CapacityPolicy
from engine.capacity.settings import CapacitySettings
from engine.core.slo import load_slo_config

WINDOW_S = (15.0, 60.0)  # a window's length is drawn from this range
LOAD = (0.5, 0.9)  # and its load, a share of the deployment's capacity at the SLO
DEMAND_GAIN = 0.01  # a move at a window's start is worth at least this much SLO attainment in the window


@dataclass(frozen=True)
class SwingWindow:
    start_s: float
    end_s: float
    phase: str  # think or act: the phase of `share` of the turns planned in it
    load: float  # sessions start at this share of the capacity rate


@dataclass(frozen=True)
class SwingPlan:
    windows: tuple[SwingWindow, ...]
    share: float = 0.8

    @classmethod
    def drawn(cls, seed: int, duration_s: float, share: float = 0.8, first: str = THINK) -> SwingPlan:
        rng, windows, at, phase = random.Random(f"{seed}:swing-plan"), [], 0.0, first
        while at < duration_s:
            end = min(duration_s, at + rng.uniform(*WINDOW_S))
            windows.append(SwingWindow(at, end, phase, rng.uniform(*LOAD)))
            at, phase = end, ACT if phase == THINK else THINK
        return cls(tuple(windows), share)

    @property
    def duration_s(self) -> float:
        return self.windows[-1].end_s

    def index_at(self, at_s: float) -> int:
        index = bisect.bisect_right([w.start_s for w in self.windows], at_s) - 1
        return max(0, min(index, len(self.windows) - 1))

    def draw(self, rng: random.Random, at_s: float) -> str:
        """A turn's phase from its planned arrival (the `PhaseDraw` of `sim.workload`)."""
        phase = self.windows[self.index_at(at_s)].phase
        if rng.random() < self.share:
            return phase
        return ACT if phase == THINK else THINK

    def schedule(self) -> list[dict[str, object]]:
        """The windows as `role_timeline` shades them."""
        return [{"start_s": w.start_s, "end_s": w.end_s, "phase": w.phase, "load": w.load} for w in self.windows]


@dataclass(frozen=True)
class SwingLoad:
    plan: SwingPlan
    capacity_rate: float  # sessions/s the deployment serves at the SLO
    workload: str = "swe"
    warmup_s: float = 60.0  # requests arriving before this are not judged
    seed: int = 0

    def sessions(self) -> list[SimSession]:
        """Sessions starting as a Poisson process at each window's share of the capacity rate (thinned from the
        highest window's rate); each turn's phase drawn from the window of its planned arrival."""
        rng = random.Random(self.seed)
        peak = self.capacity_rate * max(w.load for w in self.plan.windows)
        starts = [at for at in poisson_starts(rng, peak, self.plan.duration_s, None)
                  if rng.random() * peak < self.capacity_rate * self.plan.windows[self.plan.index_at(at)].load]
        return sessions_at(self.workload, starts, seed=self.seed, swing=self.plan)

    @property
    def window(self) -> Window:
        return Window(self.warmup_s, self.plan.duration_s)


def split_config(base: ClusterConfig, prefill: int, controller: bool) -> ClusterConfig:
    """The base deployment (a prefill pool and a decode pool, a node per worker) with `prefill` of its workers in
    the prefill role: its prefill nodes first, then decode nodes; the rest decode, its decode nodes first."""
    first, second = base.pools
    if first.tensor_parallel != first.gpus_per_node or second.tensor_parallel != second.gpus_per_node:
        raise ValueError("a swing splits whole nodes: tensor_parallel must equal gpus_per_node")
    on_first = min(prefill, first.nodes)
    pools = (first.model_copy(update={"nodes": on_first}),
             second.model_copy(update={"nodes": prefill - on_first, "role": "prefill"}),
             second.model_copy(update={"nodes": second.nodes - (prefill - on_first)}),
             first.model_copy(update={"nodes": first.nodes - on_first, "role": "decode"}))
    name = "controller" if controller else f"fixed {prefill}P/{base_workers(base) - prefill}D"
    return base.model_copy(update={"name": name, "pools": tuple(p for p in pools if p.nodes), "controller": controller})


def base_workers(base: ClusterConfig) -> int:
    return sum(pool.workers for pool in base.pools)


@dataclass
class SwingRun:
    """What one configuration's run leaves for the report (small enough to cross a process boundary)."""

    name: str
    summary: Summary
    windows: list[dict[str, float]]  # per plan window: requests arriving in it, attainment, goodput, p99 TTFT
    role_changes: list[RoleChange] = field(default_factory=list)
    roles_applied: list[RoleChange] = field(default_factory=list)
    decisions: list[Decided] = field(default_factory=list)
    splits: list[tuple[float, int, int]] = field(default_factory=list)


def run_one(config: ClusterConfig, load: SwingLoad, planned: tuple[int, ...] | None = None) -> SwingRun:
    """One configuration through the swing; `planned`: the prefill workers to pin in each plan window. The run ends
    once every request arriving before the swing's end has its last token (the sessions' later turns are not
    judged; moves while they drain belonged to no window)."""
    policy = _planned_policy(config, load.plan, planned) if planned is not None else None
    cluster, summary = simulate(config, load.sessions(), load.window, policy, until_judged=True)
    log = cluster.log
    return SwingRun(config.name, summary, per_window(config, load, log.requests), log.role_changes,
                    log.roles_applied, log.decisions, log.splits)


def _planned_policy(config: ClusterConfig, plan: SwingPlan, prefill: tuple[int, ...]) -> CapacityPolicy:
    workers = base_workers(config)

    def split_at(now: float) -> tuple[int, int]:
        chosen = prefill[plan.index_at(now)]
        return chosen, workers - chosen

    return PlannedSplit(CapacitySettings(**config.capacity), split_at)


def per_window(config: ClusterConfig, load: SwingLoad, requests: list[Any]) -> list[dict[str, float]]:
    slo = config.slo or load_slo_config().slo_class(config.slo_class)
    rows = []
    for window in load.plan.windows:
        inside = [r for r in requests if window.start_s <= r.arrival_s < window.end_s]
        met = [r for r in inside if r.ttft_s <= slo.ttft_s and r.tpot_s <= slo.tpot_s]
        ttft = sorted(r.ttft_s for r in inside)
        rows.append({"requests": len(inside), "attainment": len(met) / len(inside) if inside else 1.0,
                     "goodput_rps": len(met) / (window.end_s - window.start_s),
                     "ttft_p99_s": ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))] if ttft else 0.0})
    return rows


def run_all(base: ClusterConfig, load: SwingLoad, jobs: int = 2) -> dict[str, SwingRun]:
    """Every fixed split (in `jobs` processes, the most prefill first: the splits short of decode build the longest
    backlogs), then the controller beside `planned`, which the fixed splits' per-window results choose: with two
    jobs, three rounds of runs instead of four."""
    workers = base_workers(base)
    fixed = [split_config(base, prefill, False) for prefill in range(1, workers)]
    longest_first = fixed[::-1]
    done = in_processes(run_one, [(c, load) for c in longest_first], [c.name for c in longest_first], jobs,
                        "swing: fixed splits")
    runs = {run.name: run for run in done[::-1]}
    planned = best_split_per_window([runs[c.name] for c in fixed])
    controller = split_config(base, base.pools[0].workers, True)
    oracle = split_config(base, planned[0], True).model_copy(update={"name": "planned"})
    last = in_processes(run_one, [(controller, load), (oracle, load, planned)], ["controller", "planned"], jobs,
                        "swing: controller and planned")
    return {"controller": last[0], **runs, "planned": last[1]}


def best_split_per_window(fixed: list[SwingRun]) -> tuple[int, ...]:
    """For each window, the prefill workers of the planned oracle: in the first window the fixed split whose
    requests arriving in it met the SLO most often (ties: the lower p99 TTFT); in each later one the split held
    from the window before, unless another met the SLO in this window at least `DEMAND_GAIN` more often (then the
    one that met it most). A move is not free (a moved decode node takes its sessions' pinned KV with it), so the
    oracle moves where a move buys attainment, not a lower p99 TTFT at equal attainment. `fixed` is ordered by
    prefill workers, from 1."""
    best: list[int] = []
    for index in range(len(fixed[0].windows)):
        scores = [(run.windows[index]["attainment"], -run.windows[index]["ttft_p99_s"]) for run in fixed]
        top = 1 + max(range(len(fixed)), key=lambda k: scores[k])
        if best and scores[top - 1][0] - scores[best[-1] - 1][0] < DEMAND_GAIN:
            top = best[-1]
        best.append(top)
    return tuple(best)


def static_split(plan: SwingPlan, planned: tuple[int, ...], workers: int) -> int:
    """Prefill workers of the static deployment sized for the average: the split each window asks for (the planned
    oracle's), averaged over the swing's time and rounded. A property of the swing, not of the controller (sized by
    the controller's own demand, a controller that misread its demand would move the bar it is judged against)."""
    lengths = [w.end_s - w.start_s for w in plan.windows]
    average = sum(k * length for k, length in zip(planned, lengths, strict=True)) / sum(lengths)
    return min(workers - 1, max(1, round(average)))
