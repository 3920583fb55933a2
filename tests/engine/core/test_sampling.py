from __future__ import annotations

import pytest
import torch

from engine.core.sampling.sampler import RequestError, Sampler, SamplingParams


def random_logits(rows: int = 1, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def draw(sampler: Sampler, request_id: str, params: SamplingParams, steps: int) -> list[int]:
    return [sampler.sample(random_logits(seed=i), [request_id], [params])[0] for i in range(steps)]


def test_same_seed_same_tokens_different_seed_differs() -> None:
    params = SamplingParams(temperature=1.0, seed=7)
    sampler = Sampler()
    for request_id in ("a", "b"):
        sampler.add_request(request_id, 7)
    sampler.add_request("c", 8)
    a, b, c = (draw(sampler, r, params, 40) for r in ("a", "b", "c"))
    assert a == b
    assert a != c


def test_saved_generator_state_continues_the_same_sequence() -> None:
    params = SamplingParams(temperature=0.8, seed=3)
    reference = Sampler()
    reference.add_request("r", 3)
    expected = draw(reference, "r", params, 30)

    first = Sampler()
    first.add_request("r", 3)
    head = draw(first, "r", params, 12)
    state = first.get_state("r")
    moved = Sampler()  # e.g. another process
    moved.add_request("r", None)
    moved.set_state("r", state)
    tail = [moved.sample(random_logits(seed=i), ["r"], [params])[0] for i in range(12, 30)]
    assert head + tail == expected


def test_greedy_takes_argmax_and_consumes_no_randomness() -> None:
    sampler = Sampler()
    sampler.add_request("g", 0)
    logits = random_logits(rows=3)
    greedy = SamplingParams(temperature=0)
    before = sampler.get_state("g").clone()
    assert sampler.sample(logits, ["g"] * 3, [greedy] * 3) == logits.argmax(-1).tolist()
    assert torch.equal(sampler.get_state("g"), before)


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    sampler = Sampler()
    sampler.add_request("r", 1)
    logits = random_logits(rows=1)
    best = int(logits.argmax())
    for params in (SamplingParams(temperature=2.0, top_k=1), SamplingParams(temperature=2.0, top_p=1e-6)):
        assert {sampler.sample(logits, ["r"], [params])[0] for _ in range(20)} == {best}


def test_top_k_restricts_support() -> None:
    sampler = Sampler()
    sampler.add_request("r", 2)
    logits = random_logits(rows=1)
    allowed = set(torch.topk(logits[0], 5).indices.tolist())
    seen = {sampler.sample(logits, ["r"], [SamplingParams(temperature=5.0, top_k=5)])[0] for _ in range(200)}
    assert seen <= allowed and len(seen) > 1


def test_draws_follow_the_distribution_in_a_batch_of_mixed_rows() -> None:
    """A step's rows drawn together (temperature only, top-k, greedy) each follow their own distribution; a token
    of zero probability is never drawn. Frequencies of 20,000 draws within 0.015 of the probabilities."""
    sampler = Sampler()
    for request_id in "abc":
        sampler.add_request(request_id, ord(request_id))
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    logits = probs.log().expand(3, 5).contiguous()
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=0)]
    counts = torch.zeros(3, 5)
    for _ in range(20000):
        for row, token in enumerate(sampler.sample(logits, ["a", "b", "c"], params)):
            counts[row, token] += 1
    frequencies = counts / 20000
    assert torch.allclose(frequencies[0], probs, atol=0.015)
    assert torch.allclose(frequencies[1], torch.tensor([0, 0, 3 / 7, 4 / 7, 0]), atol=0.015)
    assert frequencies[2].tolist() == [0, 0, 0, 1, 0]


@pytest.mark.parametrize(("params", "message"), [
    (SamplingParams(max_tokens=0), "max_tokens must be at least 1"),
    (SamplingParams(temperature=-1), "temperature must be >= 0"),
    (SamplingParams(top_k=0), "top_k must be >= 1"),
    (SamplingParams(top_p=0), "top_p must be in (0, 1]"),
    (SamplingParams(stop=[""]), "stop strings must not be empty"),
])
def test_invalid_params_are_rejected(params: SamplingParams, message: str) -> None:
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace("]", r"\]")):
        params.validate()
