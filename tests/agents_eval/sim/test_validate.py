"""The validation's real runs: the warm-up (untimed requests that run the real engine's first forward passes and,
disaggregated, its KV transfer path, then leave no cached block behind for the measured sessions to hit), and
TTFT counted from each turn's planned arrival."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import numpy as np
import pytest

from agents_eval.sim.real_runs import POLL_S, in_process, play, through_processes
from agents_eval.sim.validate import (
    DEPLOYMENTS,
    RATES,
    WARM_UP_PROMPT_TOKENS,
    figure_rows,
    run_order,
    validate,
    warm_up,
)
from agents_eval.sim.workload import SimSession, SimTurn
from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.output import RequestOutput
from engine.workers.coordinator.worker_engine import WorkerEngine
from engine.workers.deployment import DeploymentSettings


def test_warm_up_runs_every_prompt_and_empties_the_prefix_cache() -> None:
    engine = LLMEngine("tiny", EngineSettings(num_threads=1))
    try:
        warm_up(engine)
        assert engine.stats().prefix_cache_queries > 0
        hits_before = engine.stats().prefix_cache_hits
        warm_up(engine)  # the same prompts again: nothing of the first round is left to hit
        assert engine.stats().prefix_cache_hits == hits_before
    finally:
        engine.shutdown()


def test_disaggregated_warm_up_transfers_kv() -> None:
    engine = WorkerEngine("tiny", EngineSettings(), DeploymentSettings(prefill=1, decode=1, transport="shm"))
    try:
        warm_up(engine)
        assert 1 <= engine.transfers.requests <= len(WARM_UP_PROMPT_TOKENS)
    finally:
        engine.shutdown()


def test_a_turn_due_during_a_step_counts_the_rest_of_that_step() -> None:
    """Session b falls due while the engine's first step (session a's, held 0.2 s) runs: its TTFT is counted from
    when it was due, as the simulator counts it, not from when the loop next looked."""
    engine = LLMEngine("tiny", EngineSettings(num_threads=1))
    held = 0.2
    steps = 0

    def step(wait_s: float) -> list[RequestOutput]:
        nonlocal steps
        steps += 1
        if steps == 1:
            time.sleep(held)
        return in_process(engine)(wait_s)

    sessions = [SimSession(name, start, 0, "append", (SimTurn(0.0, 16, 2, "think"),))
                for name, start in (("a", 0.0), ("b", 0.01))]
    try:
        latencies = play(engine, sessions, engine.config.vocab_size, ttl_s=1.0, step=step)
    finally:
        engine.shutdown()
    assert len(latencies) == 2
    assert min(ttft for ttft, _ in latencies) >= held - 0.01  # a waited for its own step, b for a's


def test_repeated_runs_are_taken_in_turn() -> None:
    """Every (deployment, rate) once before any is taken again, so a slow minute of the host falls on one run of
    each figure, not on all runs of one."""
    order = run_order(3)
    every = [(deployment, rate) for deployment in DEPLOYMENTS for rate in RATES]
    assert order == every * 3


def test_a_figure_is_measured_on_its_runs_pooled() -> None:
    predicted = np.array([[0.040, 0.015]] * 4)
    fast = np.array([[0.030, 0.010], [0.032, 0.011], [0.034, 0.012], [0.036, 0.013]])
    slow = fast + np.array([0.010, 0.002])
    rows = {row["figure"]: row for row in figure_rows("colocated", 0.1, predicted, [fast, slow])}
    ttft = rows["ttft_p50_s"]
    assert ttft["measured"] == pytest.approx(float(np.percentile(np.concatenate([fast, slow])[:, 0], 50)))
    assert ttft["runs"] == pytest.approx([0.033, 0.043])
    assert ttft["relative_error"] == pytest.approx(abs(0.040 - ttft["measured"]) / ttft["measured"])
    assert rows["tpot_p90_s"]["runs"] == pytest.approx([float(np.percentile(fast[:, 1], 90)),
                                                       float(np.percentile(slow[:, 1], 90))])
    assert ttft["requests"] == 4


def test_validation_needs_a_real_run() -> None:
    with pytest.raises(ValueError, match="--repeats"):
        validate(Path("unused.json"), repeats=0)


class _WaitingEngine:
    """Answers each request with one token 30 ms after it arrives. Its step records the wait it was allowed when
    nothing is ready, (when, how long), and returns at once, so the driver asks again and again up to b's
    arrival: a step allowed to wait past it shows whatever the timing."""

    def __init__(self) -> None:
        self.due: dict[str, float] = {}
        self.waits: list[tuple[float, float]] = []
        self.added: list[float] = []  # when each request came in
        self.ids = itertools.count()

    def add_request(self, prompt: list[int], params: object, session: object = None) -> str:
        request_id = f"r{next(self.ids)}"
        self.added.append(time.monotonic())
        self.due[request_id] = self.added[-1] + 0.03
        return request_id

    def has_unfinished(self) -> bool:
        return bool(self.due)

    def step(self, timeout_s: float) -> list[RequestOutput]:
        now = time.monotonic()
        ready = [rid for rid, at in self.due.items() if at <= now]
        if not ready:
            self.waits.append((now, timeout_s))
        for rid in ready:
            del self.due[rid]
        return [RequestOutput(rid, [5], "", True, "length", 1, 0) for rid in ready]


def test_a_waiting_engine_never_waits_past_the_next_turns_arrival() -> None:
    """The worker-process engine's step waits for its workers' outputs; a wait that ran past a turn's arrival
    would put the driver's lateness on that turn's TTFT (the simulator has no such hop). Session b falls due
    while a's reply is awaited."""
    engine = _WaitingEngine()
    sessions = [SimSession(name, start, 0, "append", (SimTurn(0.0, 4, 1, "think"),))
                for name, start in (("a", 0.0), ("b", 0.0137))]
    play(engine, sessions, vocab=100, ttl_s=1.0, step=through_processes(engine))
    b_due = engine.added[0] + 0.0137  # a is added at the driver's start or after: b is due by then at the latest
    before_b = [(at, wait) for at, wait in engine.waits if at < b_due]
    assert before_b, "no wait fell before b's arrival"
    assert all(at + wait <= b_due + 0.0002 for at, wait in before_b)
    assert all(wait <= POLL_S for _, wait in engine.waits)


def test_a_real_run_keeps_its_traced_steps_and_sets_them_against_the_calibration() -> None:
    """The run's steps (the warm-up's left out) come back with its latencies, and `step_rows` gives each step kind
    of each run measured against the calibration."""
    from agents_eval.sim.calibration import FEATURES, Calibration
    from agents_eval.sim.validate import measure, step_rows

    turns = (SimTurn(0.0, 24, 3, "think"), SimTurn(0.05, 8, 3, "act"))
    run = measure(DEPLOYMENTS[0], [SimSession("s", 0.0, 0, "append", turns)], "tiny")
    assert len(run.latencies) == 2
    [(pid, steps)] = run.steps.items()
    assert pid == os.getpid()
    assert sum(samples for step in steps for _, _, samples in step.batch) == 6  # no warm-up step among them
    flat = {name: 0.001 if name == "step" else 0.0 for name in FEATURES}
    rows = step_rows(Calibration("tiny", "float32", {"decode": flat, "prefill": flat}), DEPLOYMENTS[0], 0.1, [run])
    assert {(row["run"], row["kind"]) for row in rows} == {(1, "decode"), (1, "prefill")}
    assert sum(row["steps"] for row in rows) == len(steps)
    for row in rows:
        assert row["predicted_s"] == pytest.approx(0.001 * row["steps"])
        assert row["ratio"] == pytest.approx(row["measured_s"] / row["predicted_s"])


def test_the_figures_are_predicted_again_at_the_runs_own_step_speed() -> None:
    """`at_run_speed` scales the calibration by the factors `run_speed` measures on the runs' traced steps, predicts
    every figure again and sets it against the same measured figure."""
    from agents_eval.sim.calibration import FEATURES, Calibration
    from agents_eval.sim.step_agreement import run_speed
    from agents_eval.sim.validate import at_run_speed, measure

    sessions = [SimSession("s", 0.0, 0, "append", (SimTurn(0.0, 24, 3, "think"), SimTurn(0.05, 8, 3, "act")))]
    run = measure(DEPLOYMENTS[0], sessions, "tiny")
    flat = {name: 0.0001 if name == "step" else 0.0 for name in FEATURES}
    calibration = Calibration("tiny", "float32", {"decode": flat, "prefill": flat})
    key = (DEPLOYMENTS[0], 0.1)
    result = at_run_speed(calibration, {0.1: sessions}, {key: [run]}, "tiny")
    [factors] = result["factors"]
    assert {k: v for k, v in factors.items() if k in ("decode", "prefill")} == run_speed(calibration, [run.steps],
                                                                                         False)
    assert factors["decode"] > 1 and factors["prefill"] > 1  # the tiny model's steps take over 0.1 ms
    rows = result["rows"]
    assert [row["measured"] for row in rows] == [row["measured"] for row in figure_rows(*key, np.zeros((2, 2)),
                                                                                        [run.latencies])]
    ttft = next(row for row in rows if row["figure"] == "ttft_p50_s")
    assert ttft["predicted"] >= factors["prefill"] * 0.0001 * 0.999  # each turn's prompt step, at the scaled time
    assert result["max_relative_error"] == max(row["relative_error"] for row in rows)


@pytest.mark.parametrize(("name", "spec"), [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                            ("NVIDIA A100-SXM4-80GB", None)])
def test_a_gpu_runs_on_the_spec_its_name_gives(monkeypatch: pytest.MonkeyPatch, name: str, spec: str | None) -> None:
    import torch

    from agents_eval.sim.validate import device_spec

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert device_spec("cpu") == "cpu"
    if spec is None:  # "a100-sxm4-80gb" is no word of the spec's name: refused, not guessed
        with pytest.raises(ValueError, match="no spec in configs/devices/ for the GPU 'nvidia a100-sxm4-80gb'"):
            device_spec("cuda")
    else:
        assert device_spec("cuda") == spec


def test_the_datasheet_prediction_runs_the_engines_device_and_dtype_without_a_calibration(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The real runs' deployment, simulated on the roofline of `configs/devices/` for the engine's device: the
    figures beside the same measured ones."""
    from agents_eval.sim.specs import DeviceSpec
    from agents_eval.sim.validate import measure, measured_cluster, on_datasheet

    monkeypatch.setenv("AGENTSERVE_ENGINE_DTYPE", "bfloat16")
    cluster = measured_cluster(DEPLOYMENTS[1], None, "tiny")
    assert (cluster.calibration, cluster.dtype, [pool.device for pool in cluster.pools]) == (
        None, "bfloat16", ["cpu", "cpu"])
    monkeypatch.delenv("AGENTSERVE_ENGINE_DTYPE")
    sessions = [SimSession("s", 0.0, 0, "append", (SimTurn(0.0, 24, 3, "think"), SimTurn(0.05, 8, 3, "act")))]
    run = measure(DEPLOYMENTS[0], sessions, "tiny")
    result = on_datasheet({0.1: sessions}, {(DEPLOYMENTS[0], 0.1): [run]}, "tiny")
    rows = result["rows"]
    assert [row["measured"] for row in rows] == [row["measured"] for row in figure_rows(
        DEPLOYMENTS[0], 0.1, np.zeros((2, 2)), [run.latencies])]
    ttft = next(row for row in rows if row["figure"] == "ttft_p50_s")
    assert ttft["predicted"] >= DeviceSpec.load("cpu").step_overhead_s  # a step on the roofline, at the least
    assert result["max_relative_error"] == max(row["relative_error"] for row in rows)
