"""The capacity controller on simulated time: every `interval_s` the engine's `CapacityPolicy` reads a
`LoadSnapshot` of the simulated workers (the gateway's admitted work, the decode step time, the predictor's
forecast when configured) and its moves change the workers' roles at once (a role change takes effect after
the worker's current step; its requests stay)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from agents_eval.sim.gateway import Gateway
from agents_eval.sim.records import RoleChange
from engine.capacity.policy import CapacityPolicy
from engine.capacity.signals import DECODE, PREFILL, LoadSnapshot, role_figures
from engine.core.stats import mean_line


def snapshot(gateway: Gateway) -> LoadSnapshot:
    cluster, now = gateway.cluster, gateway.cluster.env.now
    steps = role_figures(DECODE, [(w.role, w.decode_step_s) for w in cluster.workers])
    rates = role_figures(PREFILL, [(w.role, w.prefill_tokens_per_s) for w in cluster.workers])
    forecast = gateway.forecaster.forecast(gateway.settings.forecast_horizon_s, now) if gateway.forecaster else None
    return LoadSnapshot(now, tuple(w.load() for w in cluster.workers),
                        tpot_s=sum(steps) / len(steps) if steps else None,
                        prefill_tokens_per_s=sum(rates) / len(rates) if rates else None,
                        forecast_prefill_tokens=forecast.prefill_tokens if forecast else 0.0,
                        forecast_decode_tokens=forecast.decode_tokens if forecast else 0.0,
                        admitted=gateway.admitted(), routed=gateway.routed(),
                        max_streams_per_worker=cluster.config.engine.max_num_seqs,
                        decode_line=mean_line(role_figures(DECODE, [(w.role, w.rates.decode_line.line())
                                                                    for w in cluster.workers])))


def control(gateway: Gateway, policy: CapacityPolicy) -> Generator[simpy.Event, Any, None]:
    cluster = gateway.cluster
    while True:
        decision = policy.decide(snapshot(gateway))
        for move in decision.moves:
            cluster.by_id(move.worker_id).set_role(move.role)
            cluster.log.role_changes.append(RoleChange(cluster.env.now, move.worker_id, move.role))
        if decision.moves or not cluster.log.splits:
            prefill = sum(w.role == PREFILL for w in cluster.workers)
            cluster.log.splits.append((cluster.env.now, prefill, len(cluster.workers) - prefill))
        yield cluster.env.timeout(gateway.settings.interval_s)
