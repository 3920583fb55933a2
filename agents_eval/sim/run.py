"""One simulated run: a cluster, a gateway playing the sessions, the controller when configured; and the
figures of the run (TTFT, TPOT, SLO attainment, throughput, cost per 1k tokens)."""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from agents_eval.harness.stats import percentile
from agents_eval.sim.model.cluster import Cluster, build_cluster
from agents_eval.sim.model.config import ClusterConfig
from agents_eval.sim.model.controller import control
from agents_eval.sim.model.gateway import Gateway
from agents_eval.sim.model.records import RunLog
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
    latency_p99_s: float = 0.0  # arrival to last token, as the agent benchmark's p99_latency_s


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
             policy: CapacityPolicy | None = None, until_judged: bool = False) -> tuple[Cluster, Summary]:
    """Play `sessions` on the cluster; with `config.controller`, `policy` (default: the config's own
    `CapacityPolicy`) moves its workers. With `until_judged` the run ends once every request arriving before the
    window's end has its last token: what follows cannot change those requests' figures (the sessions' later turns,
    about half of a 40 s window's run; the summary's `steps` and `role_changes` then count up to that end)."""
    env = simpy.Environment()
    cluster = build_cluster(env, config)
    settings = CapacitySettings(**config.capacity)
    gateway = Gateway(cluster, settings, _forecaster(config))
    system = cluster.tokens.fresh(max((s.system_tokens for s in sessions), default=0))
    plays = [env.process(gateway.play(s, system[:s.system_tokens])) for s in sessions]
    if config.controller:
        env.process(control(gateway, policy or CapacityPolicy(settings)))
    end: simpy.Event = simpy.AllOf(env, plays)
    if until_judged and math.isfinite(window.end_s):
        end = simpy.AnyOf(env, [end, env.process(_judged_done(env, gateway, window.end_s))])
    with _collector_off():
        env.run(until=end)
    return cluster, summarize(cluster.log, config, cluster.price_per_hour(), window)


def _judged_done(env: simpy.Environment, gateway: Gateway, end_s: float) -> Generator[simpy.Event, Any, None]:
    """Succeeds when every request that arrived before `end_s` is done (those after it are not judged)."""
    yield env.timeout(end_s)
    yield simpy.AllOf(env, [r.done for r in gateway.live if r.arrival_s < end_s])


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
    latency = np.array([(r.last_token_s or r.arrival_s) - r.arrival_s for r in records])
    return Summary(len(records), duration, len(records) / duration, *_percentiles(ttft), *_percentiles(tpot), met,
                   tokens, cost, len(log.role_changes), log.steps, _percentiles(latency)[2])


def _percentiles(values: np.ndarray) -> tuple[float, float, float]:
    ordered = values.tolist()
    return percentile(ordered, 50), percentile(ordered, 90), percentile(ordered, 99)
