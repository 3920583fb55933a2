"""The capacity controller on a live disaggregated engine: a scripted think/act swing moves workers between
roles both ways, and every request finishes exactly once with the colocated engine's tokens."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from engine.capacity.settings import CapacitySettings
from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.core.stats import AgentSignals
from engine.workers import messages as m
from engine.workers.coordinator.worker_engine import WorkerEngine
from engine.workers.deployment import DeploymentSettings

pytestmark = pytest.mark.slow

SETTINGS = EngineSettings(num_kv_blocks=512, block_size=8, max_num_batched_tokens=128)
CAPACITY = CapacitySettings(interval_s=0.05, hold_s=0.3, local_prefill_max_tokens=0,
                            local_prefill_max_uncached_share=0)
THINK = [[1, *range(100 + i, 100 + i + 150)] for i in range(8)]  # long observations, short replies
ACT = [[1, 7 + i, 9, 11] for i in range(8)]  # short observations, long replies
THINK_PARAMS = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
ACT_PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def run_phase(engine: WorkerEngine, prompts: list[list[int]], params: SamplingParams, shift: str,
              share: float, outputs: dict[str, list[int]], finished: Counter[str]) -> None:
    engine.update_signals(AgentSignals(share, shift, time.monotonic()))
    ids = [engine.add_request(p, params, f"{shift}-{i}") for i, p in enumerate(prompts)]
    for request_id in ids:
        outputs[request_id] = []
    deadline = time.monotonic() + 120
    while any(finished[i] == 0 for i in ids) and time.monotonic() < deadline:
        for out in engine.step():
            outputs[out.request_id] += out.new_token_ids
            finished[out.request_id] += out.finished


def test_a_scripted_swing_moves_roles_and_loses_nothing() -> None:
    engine = WorkerEngine("tiny", SETTINGS, DeploymentSettings(prefill=1, decode=2, kv_timeout_s=5.0),
                                 CAPACITY)
    outputs: dict[str, list[int]] = {}
    finished: Counter[str] = Counter()
    try:
        run_phase(engine, THINK, THINK_PARAMS, "think", 0.9, outputs, finished)
        after_think = {w.worker_id: w.role for w in engine.workers}
        time.sleep(CAPACITY.hold_s)
        run_phase(engine, ACT, ACT_PARAMS, "act", 0.1, outputs, finished)
        after_act = {w.worker_id: w.role for w in engine.workers}
        events = engine.capacity.report()["events"]
        counters = engine.kv_counters().values()
    finally:
        engine.shutdown()
    assert list(after_think.values()).count(m.PREFILL) == 2, "the think shift moved a decode worker to prefill"
    assert list(after_act.values()).count(m.PREFILL) == 1, "the act shift moved it back"
    assert [e["kind"] for e in events].count("role_applied") >= 2  # type: ignore[index, union-attr]
    assert set(finished.values()) == {1}, "every request finished exactly once"
    assert sum(c.received for c in counters) > 0
    assert sum(c.timed_out + c.recomputed + c.rejected for c in counters) == 0, "every worker's KV reached its decoder"
    reference = LLMEngine("tiny", SETTINGS)
    expected = [c.token_ids for c in reference.generate(THINK, THINK_PARAMS) + reference.generate(ACT, ACT_PARAMS)]
    got = [outputs[f"think-{i}"] for i in range(len(THINK))] + [outputs[f"act-{i}"] for i in range(len(ACT))]
    assert got == expected
