"""What the simulator answers: throughput at the SLO (the highest load with 90% of requests meeting the TTFT
and TPOT targets), the 27B-MoE deployment's table, DistServe's placement search, the scale run."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from agents_eval.sim.jobs import in_processes
from agents_eval.sim.model.config import ClusterConfig, Pool
from agents_eval.sim.run import Summary, Window, simulate
from agents_eval.sim.workload import draw_sessions

ATTAINMENT_GOAL = 0.9
MOE27B_CONFIGS = ("moe27b-colocated", "moe27b-distserve", "moe27b-agent")  # the table of `simulate --table`
MOE27B_ABLATIONS = ("moe27b-colocated-nocache", "moe27b-distserve-nocache")  # labelled ablation steps beside it
# The figures the seed (the project's first design card) quoted for the 27B-MoE deployment's three configurations:
# throughput at the SLO, P99 latency, cost per 1k tokens. Quoted beside the simulated ones, not run for run.
QUOTED_TABLE = {"moe27b-colocated": (12.4, 0.850, 0.043), "moe27b-distserve": (38.7, 0.210, 0.027),
              "moe27b-agent": (52.1, 0.185, 0.019)}


@dataclass(frozen=True)
class Load:
    workload: str = "swe"
    warmup_s: float = 30.0  # sessions start from 0; requests before this are not judged
    duration_s: float = 90.0  # sessions stop starting here; judged requests arrive in [warmup_s, duration_s)
    seed: int = 0

    def run(self, config: ClusterConfig, rate: float) -> Summary:
        sessions = draw_sessions(self.workload, seed=self.seed, rate=rate, duration_s=self.duration_s)
        return simulate(config, sessions, Window(self.warmup_s, self.duration_s), until_judged=True)[1]


@dataclass(frozen=True)
class Point:
    session_rate: float  # sessions started per second
    summary: Summary

    def as_dict(self) -> dict[str, Any]:
        return {"session_rate": self.session_rate, **asdict(self.summary)}


@dataclass(frozen=True)
class Searched:
    """A rate search's outcome: the best passing point (None if none passed), every point run, its CPU time."""

    best: Point | None
    points: list[Point]
    cpu_s: float


def rate_at_slo(run: Callable[[float], Summary], start: float, steps: int = 4) -> tuple[Point | None, list[Point]]:
    """Doubling from `start` until attainment falls under the goal (halving instead, at most 6 times, while
    `start` itself fails), then `steps` bisections; the best passing point (None if none passed) and every
    point run."""
    points: list[Point] = []

    def probe(rate: float) -> bool:
        points.append(Point(rate, run(rate)))
        return points[-1].summary.attainment >= ATTAINMENT_GOAL

    low, high = _bracket(probe, start)
    for _ in range(steps if low else 0):
        middle = (low + high) / 2
        low, high = (middle, high) if probe(middle) else (low, middle)
    passing = [p for p in points if p.summary.attainment >= ATTAINMENT_GOAL]
    return max(passing, key=lambda p: p.summary.throughput_rps, default=None), sorted(points,
                                                                                   key=lambda p: p.session_rate)


def _bracket(probe: Callable[[float], bool], start: float) -> tuple[float, float]:
    """(a passing rate or 0, the failing rate above it)."""
    if probe(start):
        low, high = start, start * 2
        while probe(high) and high < start * 64:
            low, high = high, high * 2
        return low, high
    high = start
    for _ in range(6):
        if probe(high / 2):
            return high / 2, high
        high /= 2
    return 0.0, high


def searched(config: ClusterConfig, load: Load, start_rate: float, steps: int) -> Searched:
    """One configuration's rate search (a job of `searches`), with the CPU time it took."""
    cpu = time.process_time()
    best, points = rate_at_slo(functools.partial(load.run, config), start_rate, steps)
    return Searched(best, points, time.process_time() - cpu)


def searches(configs: list[ClusterConfig], load: Load, start_rate: float, steps: int, jobs: int,
             title: str) -> list[Searched]:
    """Each configuration's rate search, `jobs` processes at a time; in the order of `configs`."""
    return in_processes(searched, [(config, load, start_rate, steps) for config in configs],
                        [config.name for config in configs], jobs, title)


def slo_table(configs: list[ClusterConfig], load: Load, start_rate: float, steps: int = 3,
              jobs: int = 1) -> list[dict[str, Any]]:
    rows = []
    for config, found in zip(configs, searches(configs, load, start_rate, steps, jobs, "rate searches"), strict=True):
        quoted = QUOTED_TABLE.get(config.name)
        rows.append({"configuration": config.name, "gpus": sum(p.gpus for p in config.pools),
                     "at_slo": found.best.as_dict() if found.best else None,
                     "points": [p.as_dict() for p in found.points], "cpu_s": found.cpu_s,
                     "quoted": dict(zip(("throughput_rps", "p99_s", "cost_per_1k_tokens"), quoted, strict=True))
                     if quoted else None})
    return rows


def placements(base: ClusterConfig, gpus: int, tensor_parallel: tuple[int, ...] = (1, 2, 4, 8)) -> list[ClusterConfig]:
    """DistServe's search space on `gpus` GPUs: every split of whole nodes between prefill (the base's prefill
    device, A800 in the 27B-MoE deployment) and decode (its decode device, H100), each phase at each
    tensor-parallel degree of its own; routing and engine as the base configures them. Nodes, not workers, are
    split: a node holds one kind of GPU, and its workers share its link."""
    devices = {pool.role: pool.device for pool in base.pools}
    per_node = base.pools[0].gpus_per_node
    nodes, configs = gpus // per_node, []
    for prefill_tp, decode_tp, prefill_nodes in itertools.product(tensor_parallel, tensor_parallel, range(1, nodes)):
        pools = (Pool(device=devices["prefill"], nodes=prefill_nodes, gpus_per_node=per_node,
                      tensor_parallel=prefill_tp, role="prefill"),
                 Pool(device=devices["decode"], nodes=nodes - prefill_nodes, gpus_per_node=per_node,
                      tensor_parallel=decode_tp, role="decode"))
        name = (f"{prefill_nodes} {devices['prefill']} tp{prefill_tp} + "
                f"{nodes - prefill_nodes} {devices['decode']} tp{decode_tp}")
        configs.append(base.model_copy(update={"name": name, "pools": pools}))
    return configs


def placement_search(configs: list[ClusterConfig], load: Load, start_rate: float, steps: int = 2,
                     jobs: int = 1) -> list[dict[str, Any]]:
    """Goodput per GPU (requests/s at the SLO over GPUs) of each placement, best first."""
    rows = []
    for config, found in zip(configs, searches(configs, load, start_rate, steps, jobs, "placements"), strict=True):
        gpus, best = sum(p.gpus for p in config.pools), found.best
        goodput = best.summary.throughput_rps if best else 0.0
        rows.append({"placement": config.name, "gpus": gpus, "goodput_rps": goodput, "goodput_per_gpu": goodput / gpus,
                     "session_rate": best.session_rate if best else 0.0, "at_slo": best.as_dict() if best else None,
                     "cpu_s": found.cpu_s})
    return sorted(rows, key=lambda row: -row["goodput_per_gpu"])


def scale_run(config: ClusterConfig, rate: float, duration_s: float, workload: str = "swe",
              seed: int = 0) -> dict[str, Any]:
    started, cpu = time.monotonic(), time.process_time()
    sessions = draw_sessions(workload, seed=seed, rate=rate, duration_s=duration_s)
    cluster, summary = simulate(config, sessions)
    wall, cpu = time.monotonic() - started, time.process_time() - cpu
    return {"cluster": config.name, "nodes": sum(p.nodes for p in config.pools), "workers": len(cluster.workers),
            "simulated_s": cluster.env.now, "sessions": len(sessions), "wall_s": wall,
            "cpu_s": cpu, **asdict(summary),
            "splits": cluster.log.splits}
