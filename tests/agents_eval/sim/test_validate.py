"""The validation's real runs: the warm-up (untimed requests that run the real engine's first forward passes and,
disaggregated, its KV transfer path, then leave no cached block behind for the measured sessions to hit), and
TTFT counted from each turn's planned arrival."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from agents_eval.sim.real_runs import play
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
from engine.llm_engine import LLMEngine
from engine.output import RequestOutput
from engine.worker.coordinator import DisaggregatedEngine
from engine.worker.deployment import DeploymentSettings


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
    engine = DisaggregatedEngine("tiny", EngineSettings(), DeploymentSettings(prefill=1, decode=1, transport="shm"))
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

    def step() -> list[RequestOutput]:
        nonlocal steps
        steps += 1
        if steps == 1:
            time.sleep(held)
        return engine.step()

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
