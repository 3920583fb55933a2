"""The whole engine (scheduler, chunked prefill, paged cache, prefix reuse, sampler) against transformers.

Eight prompts of different lengths run batched with a small per-step token budget, so prompts are
chunked and decodes mix with prefill chunks; every step's logits must equal the transformers model's
logits over the same tokens, and greedy outputs must equal transformers' own greedy generate.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams

PROMPT_LENGTHS = [5, 17, 33, 64, 3, 100, 48, 20]
STEPS = 32
ATOL = 1e-4


def prompts(vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [[1, *torch.randint(3, vocab, (n - 1,), generator=generator).tolist()] for n in PROMPT_LENGTHS]


def hf_logits(model: torch.nn.Module, prompt: list[int], output: list[int]) -> torch.Tensor:
    """transformers' logits at each position that predicted one of the outputs: [STEPS, vocab]."""
    ids = torch.tensor([prompt + output[:-1]])
    with torch.inference_mode():
        logits = model(ids).logits[0].float()
    return logits[len(prompt) - 1:]


def hf_greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=STEPS, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def check_against_hf(results: list[Completion], batch: list[list[int]], model: torch.nn.Module) -> None:
    for prompt, result in zip(batch, results, strict=True):
        assert len(result.token_ids) == STEPS and len(result.logits) == STEPS
        ours = torch.stack(result.logits)
        reference = hf_logits(model, prompt, result.token_ids)
        torch.testing.assert_close(ours, reference, atol=ATOL, rtol=0)
        assert result.token_ids == reference.argmax(-1).tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_batched_chunked_and_cached_runs_match_transformers(
        arch: str, make_hf_checkpoint: Callable[..., Path],
        load_hf_reference: Callable[[Path], torch.nn.Module]) -> None:
    checkpoint = make_hf_checkpoint(arch)
    model = load_hf_reference(checkpoint)
    engine = LLMEngine(str(checkpoint), EngineSettings(block_size=8, num_kv_blocks=256,
                                                        max_num_batched_tokens=48))
    batch = prompts(model.config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, return_logits=True)

    cold = engine.generate(batch, params)
    check_against_hf(cold, batch, model)
    assert all(r.num_cached_tokens == 0 for r in cold)

    warm = engine.generate(batch, params)
    check_against_hf(warm, batch, model)
    for prompt, result in zip(batch, warm, strict=True):
        assert result.num_cached_tokens == (len(prompt) - 1) // 8 * 8
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]

    for prompt, result in zip(batch[:3], cold[:3], strict=True):
        assert result.token_ids == hf_greedy(model, prompt)
