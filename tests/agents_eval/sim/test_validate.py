"""The validation's warm-up: untimed requests that run the real engine's first forward passes and, disaggregated,
its KV transfer path, then leave no cached block behind for the measured sessions to hit."""

from __future__ import annotations

from agents_eval.sim.validate import WARM_UP_PROMPT_TOKENS, warm_up
from engine.config import EngineSettings
from engine.llm_engine import LLMEngine
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
