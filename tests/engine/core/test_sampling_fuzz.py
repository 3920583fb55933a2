"""Property tests of the sampler: whatever a request's valid parameters (a temperature however small, any
top-k and top-p) and whatever finite logits the model gives, the sampled token is one the parameters allow
and the engine step does not fail (a failed step stops the engine for every request)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.sampling.sampler import RequestError, Sampler, SamplingParams

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LOGITS = st.lists(st.floats(-1e4, 1e4, width=32), min_size=1, max_size=64)
TEMPERATURES = st.sampled_from([5e-324, 1e-310, 1e-40, 1e-8]) | st.floats(0, 2)
PARAMS = st.builds(SamplingParams, temperature=TEMPERATURES, top_k=st.none() | st.integers(1, 80),
                   top_p=st.floats(0, 1, exclude_min=True), seed=st.integers(0, 2**32))


@FUZZ
@given(logits=LOGITS, params=PARAMS)
def test_any_valid_parameters_sample_an_allowed_token(logits: list[float], params: SamplingParams) -> None:
    params.validate()
    row = torch.tensor(logits, dtype=torch.float32)
    sampler = Sampler()
    sampler.add_request("r", params.seed)
    [token] = sampler.sample(row.unsqueeze(0), ["r"], [params])
    assert 0 <= token < len(logits)
    if params.top_k is not None:  # within the top k (ties at the k-th value included)
        assert row[token] >= torch.topk(row, min(params.top_k, len(logits))).values[-1]
    if params.greedy:
        assert row[token] == row.max()
    if params.temperature < 1e-30:  # a vanishing temperature: a token within a hair of the most likely
        assert row[token] >= row.max() - 1e-30


@FUZZ
@given(seed=st.integers(-2**70, 2**70))
def test_any_seed_is_refused_by_validation_or_seeds_a_generator(seed: int) -> None:
    params = SamplingParams(seed=seed)
    try:
        params.validate()
    except RequestError as error:
        assert "seed" in str(error)
        return
    Sampler().add_request("r", params.seed)
