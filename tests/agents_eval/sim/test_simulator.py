"""The simulator: an M/D/1 toy against queueing theory, the engine's own policy objects doing the work, and
runs that repeat under a seed."""

from __future__ import annotations

import gc
import random
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from agents_eval.sim.calibration import KINDS, Calibration
from agents_eval.sim.config import ClusterConfig, EngineKnobs, Pool
from agents_eval.sim.run import simulate
from agents_eval.sim.workload import SimSession, SimTurn, draw_sessions
from engine.capacity import routing
from engine.core import queue_policy as batcher
from engine.core.scheduler import Scheduler
from engine.kv_cache.manager import KVCacheManager

SERVICE_S = 0.01
DISAGGREGATED = {"local_prefill_max_tokens": 0, "local_prefill_max_uncached_share": 0.0, "overlap_weight": 0.0}


def _constant_steps(tmp_path: Path, idle_penalty: tuple[tuple[float, float], ...] = (),
                    co_run_slowdown: dict[str, float] | None = None) -> str:
    """A calibration whose every step lasts SERVICE_S, whatever it computes (plus the penalty after idling, and
    times the slowdown beside another worker's step)."""
    path = tmp_path / "constant.json"
    constant = {"step": SERVICE_S, "seq": 0.0, "linear_flop": 0.0, "attention_flop": 0.0, "byte": 0.0}
    Calibration("tiny", "float32", dict.fromkeys(KINDS, constant), idle_penalty=idle_penalty,
                co_run_slowdown=co_run_slowdown or {}).save(path)
    return str(path)


def _toy(tmp_path: Path, max_num_seqs: int = 1, idle_penalty: tuple[tuple[float, float], ...] = (),
         **fields: Any) -> ClusterConfig:
    pools = (Pool(device="cpu", nodes=1, gpus_per_node=1, tensor_parallel=1, role="prefill"),
             Pool(device="cpu", nodes=1, gpus_per_node=1, tensor_parallel=1, role="decode"))
    return ClusterConfig(name="toy", model="tiny", dtype="float32", pools=pools,
                         engine=EngineKnobs(max_num_seqs=max_num_seqs, max_kv_blocks=4096, prefix_caching=False),
                         calibration=_constant_steps(tmp_path, idle_penalty), capacity=DISAGGREGATED, **fields)


def _poisson_single_turns(rate: float, count: int, seed: int, output_tokens: int = 1) -> list[SimSession]:
    rng, at, sessions = random.Random(seed), 0.0, []
    for index in range(count):
        at += rng.expovariate(rate)
        sessions.append(SimSession(f"s{index}", at, 0, "append", (SimTurn(0.0, 64, output_tokens, "think"),)))
    return sessions


@pytest.mark.slow
def test_prefill_worker_is_an_md1_queue(tmp_path: Path) -> None:
    """Poisson arrivals, one prompt per step of fixed length on the prefill worker: M/D/1, whose mean wait is
    rho x D / (2 (1 - rho))."""
    rate = 60.0
    rho = rate * SERVICE_S
    cluster, _ = simulate(_toy(tmp_path), _poisson_single_turns(rate, 20_000, seed=1))
    waits = [r.ttft_s - SERVICE_S for r in cluster.log.requests]
    assert all(r.prefill_worker == 0 and r.decode_worker == 1 for r in cluster.log.requests)
    assert sum(waits) / len(waits) == pytest.approx(rho * SERVICE_S / (2 * (1 - rho)), rel=0.05)


def test_a_worker_pays_the_idle_penalty_on_its_first_step_after_a_gap(tmp_path: Path) -> None:
    """Two single-step requests 1 s apart on each worker's clock, then a third right behind the second: the
    first step after each idle gap costs the calibration's penalty for that gap, a step back to back none."""
    penalty = 0.004
    sessions = [SimSession(f"s{index}", at, 0, "append", (SimTurn(0.0, 64, 1, "think"),))
                for index, at in enumerate((1.0, 2.0, 2.0 + SERVICE_S / 2))]
    cluster, _ = simulate(_toy(tmp_path, idle_penalty=((0.5, penalty),)), sessions)
    ttfts = [r.ttft_s for r in sorted(cluster.log.requests, key=lambda r: r.arrival_s)]
    assert ttfts[0] == pytest.approx(SERVICE_S + penalty)  # idle since the run's start
    assert ttfts[1] == pytest.approx(SERVICE_S + penalty)
    assert ttfts[2] == pytest.approx(SERVICE_S + penalty - SERVICE_S / 2 + SERVICE_S)  # queued behind, no penalty


def test_a_worker_process_pays_the_hop_before_it_has_a_request_and_its_own_idle_penalty(tmp_path: Path) -> None:
    """Two single-step requests half a step apart: each TTFT carries the hop, the first the worker process's
    idle penalty, and the second, reaching the worker while the first's step runs, queues behind it; the same
    cluster in process pays neither (its in-process idle penalty is none here)."""
    hop, penalty = 0.003, 0.004
    sessions = [SimSession(f"s{index}", at, 0, "append", (SimTurn(0.0, 64, 1, "think"),))
                for index, at in enumerate((1.0, 1.0 + SERVICE_S / 2))]
    config = _toy(tmp_path, worker_processes=True)
    calibration = Calibration.load(Path(config.calibration or ""))
    replace(calibration, worker_hop_s=hop, worker_idle_penalty=((0.5, penalty),)).save(Path(config.calibration or ""))
    cluster, _ = simulate(config, sessions)
    ttfts = [r.ttft_s for r in sorted(cluster.log.requests, key=lambda r: r.arrival_s)]
    assert ttfts[0] == pytest.approx(hop + penalty + SERVICE_S)  # a worker process idle since the start
    assert ttfts[1] == pytest.approx(hop + penalty + SERVICE_S / 2 + SERVICE_S)
    in_process, _ = simulate(config.model_copy(update={"worker_processes": False}), sessions)
    assert sorted(r.ttft_s for r in in_process.log.requests) == pytest.approx([SERVICE_S, 1.5 * SERVICE_S])


def test_a_step_that_starts_beside_another_workers_step_pays_the_co_run_slowdown(tmp_path: Path) -> None:
    """Two colocated workers on the calibrated host, two single-step requests at once (one on each, by load),
    then a third once both are idle: the second step starts while the first runs and pays the prefill factor;
    the others run alone."""
    pools = (Pool(device="cpu", nodes=2, gpus_per_node=1, tensor_parallel=1, role="colocated"),)
    config = ClusterConfig(name="host", model="tiny", dtype="float32", pools=pools,
                           engine=EngineKnobs(max_kv_blocks=4096, prefix_caching=False),
                           calibration=_constant_steps(tmp_path, co_run_slowdown={"prefill": 1.5, "decode": 3.0}))
    sessions = [SimSession(f"s{index}", at, 0, "append", (SimTurn(0.0, 64, 1, "think"),))
                for index, at in enumerate((1.0, 1.0, 2.0))]
    cluster, _ = simulate(config, sessions)
    requests = sorted(cluster.log.requests, key=lambda r: (r.arrival_s, r.ttft_s))
    assert {r.decode_worker for r in requests[:2]} == {0, 1}
    assert [r.ttft_s for r in requests] == pytest.approx([SERVICE_S, 1.5 * SERVICE_S, SERVICE_S])


def _own_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if callable(value) and name != "__init__"}


def test_real_policy_objects_do_the_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, _ = simulate(_toy(tmp_path), _poisson_single_turns(20.0, 50, seed=2, output_tokens=4))
    worker = cluster.workers[0]
    assert type(worker.scheduler) is Scheduler and type(worker.scheduler.kv).__mro__[1] is KVCacheManager
    assert _own_methods(type(worker.scheduler.kv)) == {"_block_hashes"}  # the memoised hash, nothing else
    assert all(r.prefill_worker == 0 for r in cluster.log.requests)  # DistServe routing: every prompt remote

    monkeypatch.setattr(routing, "prefill_locally", lambda *_: True)  # the router's rule, changed in place
    cluster, _ = simulate(_toy(tmp_path), _poisson_single_turns(20.0, 50, seed=2, output_tokens=4))
    assert all(r.prefill_worker is None for r in cluster.log.requests)


def test_queue_policy_change_shows_in_the_simulation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Newest first instead of FCFS, patched on the engine's class: the waits' spread changes."""
    sessions = _poisson_single_turns(90.0, 400, seed=3)
    _, fcfs = simulate(_toy(tmp_path), sessions)
    monkeypatch.setattr(batcher.FcfsPolicy, "order_waiting", lambda self, waiting, now: waiting.reverse())
    _, lifo = simulate(_toy(tmp_path), sessions)
    assert lifo.ttft_p50_s < fcfs.ttft_p50_s and lifo.ttft_p99_s > fcfs.ttft_p99_s


def test_a_run_makes_no_reference_cycles() -> None:
    """simulate() pauses the cyclic collector; that is safe only while reference counting frees everything."""
    from agents_eval.sim.config import cluster_config

    config, sessions = cluster_config("seed-agent"), draw_sessions("swe", seed=4, rate=0.5, duration_s=20)
    simulate(config, sessions)  # first run: imports and module caches
    gc.collect()
    gc.disable()
    try:
        result = simulate(config, sessions)  # kept: the cluster itself is cyclic, and alive through a run
        assert gc.collect() == 0 and result[1].requests
    finally:
        gc.enable()


def test_same_seed_same_run_different_seed_different_run() -> None:
    from agents_eval.sim.config import cluster_config

    config = cluster_config("seed-agent")
    runs = [simulate(config, draw_sessions("swe", seed=seed, rate=0.3, duration_s=20))[1] for seed in (5, 5, 6)]
    assert asdict(runs[0]) == asdict(runs[1])
    assert asdict(runs[0]) != asdict(runs[2])
