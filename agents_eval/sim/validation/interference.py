"""`agentserve bench disagg`'s interference measurement, simulated: decode streams started together while long
prompts arrive on a fixed schedule, on one colocated worker against one prefill + one decode worker (every prompt
prefilled remotely), both stepping at a calibration's times. Its figure is the benchmark's: the p99 of the decode
streams' per-token gaps, disaggregated over colocated (`ratio_p99_tpot_disaggregated_over_colocated`).

The real colocated engine runs two threads on the host's two cores; a calibration times one thread (as each
worker of the disaggregated engine runs), so the simulated colocated worker steps at one thread's times. That
difference is the simulator's, and part of what the ratio validation measures."""

from __future__ import annotations

import itertools
from collections.abc import Generator
from pathlib import Path
from typing import Any

import simpy

from agents_eval.bench.disagg.workload import InterferenceWorkload
from agents_eval.harness.stats import percentile
from agents_eval.sim.calibration.fit import Calibration
from agents_eval.sim.model.blocks import Prompt
from agents_eval.sim.model.cluster import build_cluster
from agents_eval.sim.model.config import ClusterConfig, EngineKnobs, Pool
from agents_eval.sim.model.gateway import Gateway
from engine.capacity.settings import CapacitySettings

ALWAYS_REMOTE = {"overlap_weight": 0.0, "local_prefill_max_tokens": 0, "local_prefill_max_uncached_share": 0.0}


def clusters(calibration: Path, knobs: EngineKnobs) -> tuple[ClusterConfig, ClusterConfig]:
    """One colocated worker, and one prefill + one decode worker over shared memory, every prompt remote."""
    model = Calibration.load(calibration).model
    colocated = ClusterConfig(name="colocated", model=model, pools=(_pool("colocated"),), transport="shm",
                              engine=knobs, calibration=str(calibration), worker_processes=True,
                              capacity={"overlap_weight": 0.0})
    disaggregated = colocated.model_copy(update={"name": "disaggregated",
                                                 "pools": (_pool("prefill"), _pool("decode")),
                                                 "capacity": ALWAYS_REMOTE})
    return colocated, disaggregated


def _pool(role: str) -> Pool:
    return Pool(device="cpu", nodes=1, gpus_per_node=1, tensor_parallel=1, role=role)  # type: ignore[arg-type]


def token_gaps(config: ClusterConfig, workload: InterferenceWorkload) -> list[float]:
    """The decode streams' gaps between consecutive tokens (s), the streams and the prompts played on `config`."""
    env = simpy.Environment()
    cluster = build_cluster(env, config)
    gateway = Gateway(cluster, CapacitySettings(**config.capacity))
    block = config.engine.block_size
    streams = [Prompt(block, cluster.tokens.fresh(workload.decode_prompt)) for _ in range(workload.decodes)]
    prompts = [Prompt(block, cluster.tokens.fresh(workload.prefill_prompt)) for _ in range(workload.prefills)]
    times: list[list[float]] = []
    plays = [env.process(_serve(gateway, f"decode-{i}", p, workload.decode_tokens, 0.0, times))
             for i, p in enumerate(streams)]
    plays += [env.process(_serve(gateway, f"prefill-{i}", p, 2, i * workload.prefill_every_s, None))
              for i, p in enumerate(prompts)]
    env.run(until=simpy.AllOf(env, plays))
    return [b - a for stream in times for a, b in itertools.pairwise(stream)]


def _serve(gateway: Gateway, session_id: str, prompt: Prompt, output_tokens: int, at_s: float,
           times: list[list[float]] | None) -> Generator[simpy.Event, Any, None]:
    env = gateway.cluster.env
    yield env.timeout(at_s)
    record = gateway.serve(session_id, prompt, output_tokens)
    if times is not None:  # before its first step: a step takes simulated time
        record.token_times = []
        times.append(record.token_times)
    yield record.done


def p99_tpot_ratio(calibration: Path, workload: InterferenceWorkload, knobs: EngineKnobs) -> dict[str, float]:
    """Each deployment's p99 token gap (s) and the benchmark's ratio, disaggregated over colocated."""
    colocated, disaggregated = clusters(calibration, knobs)
    p99 = {c.name: percentile(token_gaps(c, workload), 99.0) for c in (colocated, disaggregated)}
    return {**{f"{name}_tpot_p99_s": value for name, value in p99.items()},
            "ratio": p99["disaggregated"] / p99["colocated"] if p99["colocated"] else float("nan")}
