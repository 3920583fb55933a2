"""Structured outputs across the prefill/decode split: the decode worker rebuilds each request's grammar from
the tokens the prefill worker accepted (its first sampled token, after any the grammar forced before it), so the
constrained tokens are those of the colocated engine; a worker killed mid-JSON is re-run and still valid."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.capacity.settings import CapacitySettings
from engine.config import EngineSettings
from engine.llm_engine import LLMEngine
from engine.sampling import SamplingParams
from engine.worker.coordinator import DisaggregatedEngine
from engine.worker.deployment import DeploymentSettings
from tests.engine.test_structured import PROMPTS, constrained, is_valid

pytestmark = pytest.mark.slow

SETTINGS = EngineSettings(num_kv_blocks=256, block_size=8, max_num_batched_tokens=64)
ALWAYS_REMOTE = CapacitySettings(enabled=False, local_prefill_max_tokens=0, local_prefill_max_uncached_share=0)


@pytest.fixture(scope="module")
def disaggregated() -> Iterator[DisaggregatedEngine]:
    engine = DisaggregatedEngine("tiny", SETTINGS, DeploymentSettings(transport="shm", kv_timeout_s=2.0),
                                 ALWAYS_REMOTE)
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
def test_disaggregated_gives_the_colocated_constrained_tokens(disaggregated: DisaggregatedEngine,
                                                               temperature: float) -> None:
    params = [constrained(seed, temperature=temperature) for seed in range(len(PROMPTS))]
    expected = LLMEngine("tiny", SETTINGS).generate(PROMPTS, params)
    got = disaggregated.generate(PROMPTS, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert all(is_valid(r.text) for r in got), [r.text for r in got]
    assert disaggregated.stats().grammar.constrained_requests >= len(PROMPTS)
    assert disaggregated.stats().grammar.forced_tokens > 0


def test_unconstrained_requests_beside_constrained_ones_are_unchanged(disaggregated: DisaggregatedEngine) -> None:
    free = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    params = [free if i % 2 else constrained(i) for i in range(len(PROMPTS))]
    expected = LLMEngine("tiny", SETTINGS).generate(PROMPTS, params)
    assert [r.token_ids for r in disaggregated.generate(PROMPTS, params)] == [r.token_ids for r in expected]
