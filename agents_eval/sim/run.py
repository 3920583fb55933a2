"""One simulated run: a cluster, a gateway playing the sessions, the controller when configured; and the
figures of the run (TTFT, TPOT, SLO attainment, throughput, cost per 1k tokens)."""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import simpy

from agents_eval.sim.cluster import Cluster, build_cluster
from agents_eval.sim.config import ClusterConfig
from agents_eval.sim.controller import control
from agents_eval.sim.gateway import Gateway
from agents_eval.sim.records import RunLog
from agents_eval.sim.workload import SimSession
from engine.capacity.policy import CapacityPolicy
from engine.capacity.settings import CapacitySettings
from engine.core.slo import load_slo_config


@dataclass(frozen=True)
class Summary:
    requests: int
    duration_s: float  # the window's length (or first arrival to last reply when open-ended)
    throughput_rps: float  # requests arriving in the window per second, all of them served
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    attainment: float  # share of requests meeting both the TTFT and the TPOT target of the run's SLO class
    output_tokens: int
    cost_per_1k_tokens: float  # the cluster's GPU-hour price over the run, per 1,000 output tokens
    role_changes: int
    steps: int


@dataclass(frozen=True)
class Window:
    """Requests arriving in [start_s, end_s) are the ones a run is judged by (a warm-up before start_s)."""

    start_s: float = 0.0
    end_s: float = float("inf")

    @property
    def length_s(self) -> float | None:
        """The window's length; None when open-ended (a run is then measured from first arrival to last reply).
        A bounded window is the denominator of throughput even when few requests arrive in it."""
        return self.end_s - self.start_s if math.isfinite(self.end_s) else None


def simulate(config: ClusterConfig, sessions: list[SimSession], window: Window = Window(),
             policy: CapacityPolicy | None = None) -> tuple[Cluster, Summary]:
    """Play `sessions` on the cluster; with `config.controller`, `policy` (default: the config's own
    `CapacityPolicy`) moves its workers."""
    env = simpy.Environment()
    cluster = build_cluster(env, config)
    settings = CapacitySettings(**config.capacity)
    gateway = Gateway(cluster, settings, _forecaster(config))
    system = cluster.tokens.fresh(max((s.system_tokens for s in sessions), default=0))
    plays = [env.process(gateway.play(s, system[:s.system_tokens])) for s in sessions]
    if config.controller:
        env.process(control(gateway, policy or CapacityPolicy(settings)))
    with _collector_off():
        env.run(until=simpy.AllOf(env, plays))
    return cluster, summarize(cluster.log, config, cluster.price_per_hour(), window)


@contextlib.contextmanager
def _collector_off() -> Iterator[None]:
    """Pause the cyclic garbage collector for the run. A run makes no reference cycles (reference counting
    frees all its garbage; tests/agents_eval/sim checks), yet with the workers' KV blocks and the sessions' long
    token lists on the heap, its passes over them took a quarter of the CPU time of a scale run's first 90 s."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _forecaster(config: ClusterConfig) -> object:
    if not config.predictor:
        return None
    from predictor.forecast import LoadForecaster  # loads the shipped model (torch)

    return LoadForecaster()


def summarize(log: RunLog, config: ClusterConfig, price_per_hour: float, window: Window = Window()) -> Summary:
    records = [r for r in log.requests if window.start_s <= r.arrival_s < window.end_s]
    if not records:
        raise ValueError("no request arrived in the run's window")
    slo = config.slo or load_slo_config().slo_class(config.slo_class)
    ttft = np.array([r.ttft_s for r in records])
    tpot = np.array([r.tpot_s for r in records])
    duration = window.length_s or max(max(r.last_token_s or r.arrival_s for r in records)
                                      - min(r.arrival_s for r in records), 1e-9)
    tokens = sum(r.tokens for r in records)
    met = float(np.mean((ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)))
    cost = price_per_hour * duration / 3600 / tokens * 1000
    return Summary(len(records), duration, len(records) / duration, *_percentiles(ttft), *_percentiles(tpot), met,
                   tokens, cost, len(log.role_changes), log.steps)


def _percentiles(values: np.ndarray) -> tuple[float, float, float]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return float(p50), float(p90), float(p99)
