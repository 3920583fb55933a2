"""`agentserve simulate --agent-table`: the agent benchmark's three configurations (`agentserve bench --workload W`)
on simulated workers that each own a core, stepping at the times a calibration (`agentserve profile`) measured for
one worker on this host. The real benchmark runs them on two shared cores, where the client, the gateway and the
workers take turns on the same CPUs; this is what they do when a worker is a unit of capacity. Simulated.

The three, on `workers` one-thread workers:
- baseline: every worker a colocated engine (data parallel, least-loaded routing) with prefix caching on, as
  the benchmark's `baseline` (a user's default deployment: replicas, vLLM's default cache), no pins;
- disaggregated (DistServe): half the workers prefill, the rest decode, every prompt prefilled remotely, a fixed
  split, prefix caching, load-only routing;
- agent: the same split to start from, prefix caching, the session's KV pinned over the tool gap, KV-aware routing
  and conditional disaggregation, the capacity controller (a role may be left no worker, as the benchmark runs it).

The workload's sessions are its shape's (`agents_eval.sim.workload.draw_sessions`) at the benchmark's length scale
and the model's context; the SLO is the benchmark's. Pruning and history masks are not simulated."""

from __future__ import annotations

import functools
import inspect
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agents_eval.bench.agent.report.report import PAIRS
from agents_eval.bench.agent.settings import DEFAULT_SLO
from agents_eval.bench.agent.workload import builder, model_context
from agents_eval.harness.report import Table
from agents_eval.sim.calibration.fit import Calibration
from agents_eval.sim.experiments import rate_at_slo
from agents_eval.sim.model.config import ClusterConfig, Pool, Role
from agents_eval.sim.run import Summary, Window, simulate
from agents_eval.sim.validation.absolute import engine_knobs
from agents_eval.sim.workload import draw_sessions
from engine.core.slo import SloClass

SESSION_TTL_S = 30.0  # the agent's pins over the tool gap
ALWAYS_REMOTE = {"local_prefill_max_tokens": 0, "local_prefill_max_uncached_share": 0.0}


@dataclass(frozen=True)
class AgentLoad:
    """Sessions of a workload's shape started at a rate for `duration_s`; requests before `warmup_s` not judged."""

    workload: str
    length_scale: float
    max_context: int
    warmup_s: float = 10.0
    duration_s: float = 40.0
    seed: int = 0

    def run(self, config: ClusterConfig, rate: float) -> Summary:
        sessions = draw_sessions(self.workload, seed=self.seed, rate=rate, duration_s=self.duration_s,
                                 length_scale=self.length_scale, max_context=self.max_context)
        return simulate(config, sessions, Window(self.warmup_s, self.duration_s))[1]


def bench_load(workload: str, model: str, **fields: Any) -> AgentLoad:
    """The benchmark's sizes for `workload`: its builder's default length scale, the model's context."""
    length_scale = inspect.signature(builder(workload).build).parameters["length_scale"].default
    return AgentLoad(workload, float(length_scale), model_context(model)[1], **fields)


def agent_clusters(calibration: Path, workers: int = 2, slo: SloClass | None = None) -> list[ClusterConfig]:
    """The three configurations on `workers` calibrated one-thread workers (at least 2: one per role)."""
    if workers < 2:
        raise ValueError("--workers must be at least 2: the disaggregated configurations need one per role")
    calibrated = Calibration.load(calibration)
    knobs = engine_knobs(calibrated.model)
    split = (_pool("prefill", workers // 2), _pool("decode", workers - workers // 2))
    baseline = ClusterConfig(name="baseline", model=calibrated.model, dtype=calibrated.dtype,
                             pools=(_pool("colocated", workers),), transport="shm",
                             engine=knobs,
                             calibration=str(calibration), worker_processes=True, capacity={"overlap_weight": 0.0},
                             slo=slo or SloClass(ttft_s=DEFAULT_SLO.ttft_s, tpot_s=DEFAULT_SLO.tpot_s))
    disaggregated = baseline.model_copy(update={"name": "disaggregated", "pools": split,
                                                "capacity": {"overlap_weight": 0.0, **ALWAYS_REMOTE}})
    agent = disaggregated.model_copy(update={"name": "agent", "capacity": {"min_per_role": 0},
                                             "session_ttl_s": SESSION_TTL_S, "controller": True})
    return [baseline, disaggregated, agent]


def _pool(role: Role, workers: int) -> Pool:
    return Pool(device="cpu", nodes=workers, gpus_per_node=1, tensor_parallel=1, role=role)


def agent_table(clusters: list[ClusterConfig], load: AgentLoad, start_rate: float, steps: int = 3
                ) -> dict[str, Any]:
    """Each configuration's SLO rate (sessions/s, and requests/s there) by the simulator's rate search, and the
    benchmark's ratios of them."""
    rows = {}
    for config in clusters:
        best, points = rate_at_slo(functools.partial(load.run, config), start_rate, steps)
        rows[config.name] = {"slo_rate_sessions_per_s": best.session_rate if best else 0.0,
                             "at_slo": asdict(best.summary) if best else None,
                             "points": [p.as_dict() for p in points]}
    ratios = {f"{a}/{b}": _ratio(rows, a, b) for a, b in PAIRS if a in rows and b in rows}  # the benchmark's
    return {"configurations": rows, "ratios": ratios, "load": asdict(load), "simulated": True}


def _ratio(rows: dict[str, Any], a: str, b: str) -> float | None:
    low = rows[b]["slo_rate_sessions_per_s"]
    return rows[a]["slo_rate_sessions_per_s"] / low if low else None


def tables(data: dict[str, Any], workers: int) -> list[Table]:
    rows = []
    for name, row in data["configurations"].items():
        best = row["at_slo"] or {}
        rows.append([name, f"{row['slo_rate_sessions_per_s']:.3g}", f"{best.get('throughput_rps', 0):.1f}",
                     f"{1000 * best.get('ttft_p99_s', 0):.0f}", f"{1000 * best.get('tpot_p99_s', 0):.1f}",
                     str(best.get("role_changes", 0))])
    ratios = [[pair, "-" if value is None else f"{value:.2f}x"] for pair, value in data["ratios"].items()]
    title = f"Agent benchmark on {workers} workers of a core each (simulated): {data['load']['workload']}"
    return [Table(title, ["configuration", "SLO rate (sessions/s)", "req/s there", "TTFT p99 ms", "TPOT p99 ms",
                          "role moves"], rows),
            Table("Ratios of SLO rates (simulated)", ["pair", "ratio"], ratios)]
