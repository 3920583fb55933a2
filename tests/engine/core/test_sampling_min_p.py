"""min_p: tokens less likely than min_p times the most likely one (after temperature) are never drawn."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineSettings
from engine.core.sampling.sampler import RequestError, Sampler, SamplingParams
from engine.workers.coordinator.worker_engine import colocated_engine


def draws(logits: torch.Tensor, params: SamplingParams, count: int) -> list[int]:
    sampler = Sampler()
    sampler.add_request("r", 5)
    return [sampler.sample(logits, ["r"], [params])[0] for _ in range(count)]


def test_min_p_keeps_the_tokens_at_least_that_share_of_the_most_likely() -> None:
    """Probabilities 0.4, 0.3, 0.2, 0.1: min_p 0.45 keeps 0.4, 0.3 and 0.2 (half of 0.4), drops 0.1.
    Frequencies of 20,000 draws within 0.015 of the renormalized probabilities."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    tokens = draws(probs.log().unsqueeze(0), SamplingParams(temperature=1.0, min_p=0.45), 20000)
    frequencies = torch.bincount(torch.tensor(tokens), minlength=4) / len(tokens)
    assert frequencies[0] == 0
    assert torch.allclose(frequencies, torch.tensor([0, 2 / 9, 3 / 9, 4 / 9]), atol=0.015)


def test_min_p_applies_after_temperature() -> None:
    """At temperature 0.5 the probabilities 0.1..0.4 become 1:4:9:16, so min_p 0.3 keeps only the two likeliest."""
    logits = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).log()
    assert set(draws(logits, SamplingParams(temperature=0.5, min_p=0.3), 2000)) == {2, 3}


def test_min_p_one_is_greedy_and_zero_changes_nothing() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(3))
    assert set(draws(logits, SamplingParams(temperature=2.0, min_p=1.0), 50)) == {int(logits.argmax())}
    plain, with_zero = SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, min_p=0.0)
    assert draws(logits, plain, 200) == draws(logits, with_zero, 200)


@pytest.mark.parametrize("min_p", [-0.1, 1.5])
def test_min_p_outside_zero_to_one_is_refused(min_p: float) -> None:
    with pytest.raises(RequestError, match=r"min_p must be in \[0, 1\]"):
        SamplingParams(min_p=min_p).validate()


def test_min_p_reaches_an_engine_in_its_worker_process() -> None:
    """The gateway's default engine runs in a worker process: min_p 1 there is greedy too."""
    engine = colocated_engine("tiny", EngineSettings(num_kv_blocks=64))
    try:
        prompts: list[str | list[int]] = [[1, 40, 41, 42]] * 3
        greedy = engine.generate(prompts[:1], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
        filtered = engine.generate(prompts, [SamplingParams(max_tokens=6, temperature=2.0, min_p=1.0, seed=seed,
                                                            ignore_eos=True) for seed in range(3)])
        assert [done.token_ids for done in filtered] == [greedy[0].token_ids] * 3
    finally:
        engine.shutdown()
