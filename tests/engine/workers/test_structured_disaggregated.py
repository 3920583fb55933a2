"""Structured outputs across the prefill/decode split: the decode worker rebuilds each request's grammar from
the tokens the prefill worker accepted (its first sampled token, after any the grammar forced before it), so the
constrained tokens are those of the colocated engine; a worker killed mid-JSON is re-run and still valid."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.capacity.settings import CapacitySettings
from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.workers.coordinator.worker_engine import WorkerEngine
from engine.workers.deployment import DeploymentSettings
from tests.engine.core.test_structured import PROMPTS, constrained, is_valid
from tests.engine.workers.test_disaggregated import kill_worker

pytestmark = pytest.mark.slow

SETTINGS = EngineSettings(num_kv_blocks=256, block_size=8, max_num_batched_tokens=64)
ALWAYS_REMOTE = CapacitySettings(enabled=False, local_prefill_max_tokens=0, local_prefill_max_uncached_share=0)


@pytest.fixture(scope="module")
def disaggregated() -> Iterator[WorkerEngine]:
    engine = WorkerEngine("tiny", SETTINGS, DeploymentSettings(transport="shm", kv_timeout_s=2.0),
                                 ALWAYS_REMOTE)
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
def test_disaggregated_gives_the_colocated_constrained_tokens(disaggregated: WorkerEngine,
                                                               temperature: float) -> None:
    params = [constrained(seed, temperature=temperature) for seed in range(len(PROMPTS))]
    expected = LLMEngine("tiny", SETTINGS).generate(PROMPTS, params)
    got = disaggregated.generate(PROMPTS, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert all(is_valid(r.text) for r in got), [r.text for r in got]
    assert disaggregated.stats().grammar.constrained_requests >= len(PROMPTS)
    assert disaggregated.stats().grammar.forced_tokens > 0


def test_unconstrained_requests_beside_constrained_ones_are_unchanged(disaggregated: WorkerEngine) -> None:
    free = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    params = [free if i % 2 else constrained(i) for i in range(len(PROMPTS))]
    expected = LLMEngine("tiny", SETTINGS).generate(PROMPTS, params)
    assert [r.token_ids for r in disaggregated.generate(PROMPTS, params)] == [r.token_ids for r in expected]


def test_a_decode_worker_killed_mid_json_is_rerun_to_the_same_valid_json() -> None:
    engine = WorkerEngine("tiny", SETTINGS, DeploymentSettings(transport="shm", kv_timeout_s=2.0),
                                 ALWAYS_REMOTE)
    params = [constrained(seed) for seed in range(len(PROMPTS))]
    try:
        ids = [engine.add_request(p, sp) for p, sp in zip(PROMPTS, params, strict=True)]
        results = {i: Completion(i) for i in ids}
        killed = False
        while engine.has_unfinished():
            for out in engine.step():
                results[out.request_id].add(out)
                if not killed and len(results[out.request_id].token_ids) >= 3:  # inside the JSON object
                    kill_worker(engine, 1)
                    killed = True
        assert killed and engine.dead_workers == [1]
        expected = LLMEngine("tiny", SETTINGS).generate(PROMPTS, params)
        assert [results[i].token_ids for i in ids] == [r.token_ids for r in expected]
        assert all(is_valid(results[i].text) for i in ids)
    finally:
        engine.shutdown()
