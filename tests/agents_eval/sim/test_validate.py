"""The validation's real runs: the warm-up (untimed requests that run the real engine's first forward passes and,
disaggregated, its KV transfer path, then leave no cached block behind for the measured sessions to hit), and
TTFT counted from each turn's planned arrival."""

from __future__ import annotations

import time

from agents_eval.sim.real_runs import play
from agents_eval.sim.validate import WARM_UP_PROMPT_TOKENS, warm_up
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
