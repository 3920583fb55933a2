"""The engine on a CUDA device: the same logits as transformers on the host, and a disaggregated engine whose
KV leaves one worker's GPU and lands in another's, over each transport, with the colocated engine's tokens.
Skipped where torch sees no GPU (CI); run on a GPU machine with `pytest tests/engine/model/test_cuda.py`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.workers.coordinator.worker_engine import WorkerEngine
from engine.workers.deployment import DeploymentSettings
from tests.engine.model.test_engine_parity import STEPS, check_against_hf, prompts
from tests.engine.workers.test_disaggregated import ALWAYS_REMOTE, GREEDY, PROMPTS, SAMPLED, SETTINGS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ON_GPU = SETTINGS.model_copy(update={"device": "cuda"})


def test_batched_chunked_and_cached_runs_on_the_gpu_match_transformers(
        make_hf_checkpoint: Callable[..., Path], load_hf_reference: Callable[[Path], torch.nn.Module]) -> None:
    checkpoint = make_hf_checkpoint("llama")
    model = load_hf_reference(checkpoint)
    engine = LLMEngine(str(checkpoint), EngineSettings(block_size=8, num_kv_blocks=256, max_num_batched_tokens=48,
                                                        device="cuda"))
    assert engine.runner.kv_caches[0].device.type == "cuda"
    assert not torch.backends.cuda.cudnn_sdp_enabled()  # it builds a graph per context length: one per decode step
    batch = prompts(model.config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, return_logits=True)
    cold = engine.generate(batch, params)
    check_against_hf(cold, batch, model)
    warm = engine.generate(batch, params)  # from the prefix cache on the GPU
    check_against_hf(warm, batch, model)
    assert all(r.num_cached_tokens > 0 for r, p in zip(warm, batch, strict=True) if len(p) > 8)


def test_seeded_sampling_on_the_gpu_draws_what_the_host_draws() -> None:
    """The sampled row is drawn on the host with the request's CPU generator; tiny's float32 probabilities on the
    two devices differ far below a draw's resolution."""
    on_host = [r.token_ids for r in LLMEngine("tiny", SETTINGS).generate(PROMPTS, SAMPLED)]
    assert [r.token_ids for r in LLMEngine("tiny", ON_GPU).generate(PROMPTS, SAMPLED)] == on_host


@pytest.fixture(scope="module", params=["shm", "tcp"])
def on_gpus(request: pytest.FixtureRequest) -> Iterator[WorkerEngine]:
    engine = WorkerEngine("tiny", ON_GPU, DeploymentSettings(transport=request.param, kv_timeout_s=5.0),
                                 ALWAYS_REMOTE)
    yield engine
    engine.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_kv_crosses_from_gpu_to_gpu_with_the_colocated_tokens(on_gpus: WorkerEngine,
                                                               params: SamplingParams) -> None:
    before = sum(c.received for c in on_gpus.kv_counters().values())
    results = on_gpus.generate(PROMPTS, params)
    assert [r.token_ids for r in results] == [r.token_ids for r in LLMEngine("tiny", SETTINGS).generate(PROMPTS,
                                                                                                        params)]
    counters = on_gpus.kv_counters().values()
    assert sum(c.received for c in counters) == before + len(PROMPTS)  # the KV came over, none recomputed
    assert sum(c.recomputed + c.timed_out for c in counters) == 0
