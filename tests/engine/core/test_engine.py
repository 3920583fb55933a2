"""The colocated engine end to end on the built-in tiny model and tokenizer."""

from __future__ import annotations

import pytest

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import RequestError, SamplingParams


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine("tiny", EngineSettings(num_kv_blocks=256, max_num_batched_tokens=64))


def run_streamed(engine: LLMEngine, prompt: str | list[int], params: SamplingParams) -> tuple[list[str], dict]:
    request_id = engine.add_request(prompt, params)
    deltas, last = [], None
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id == request_id
            deltas.append(out.new_text)
            last = out
    assert last is not None and last.finished
    return deltas, {"finish_reason": last.finish_reason}


def test_second_run_reuses_the_prefix_and_gives_the_same_tokens(engine: LLMEngine) -> None:
    prompt = "The agent opened the file and read the first forty lines of the log output. " * 3
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    [cold] = engine.generate([prompt], params)
    [warm] = engine.generate([prompt], params)
    block = engine.settings.block_size
    assert cold.num_cached_tokens == 0
    assert warm.num_cached_tokens == (cold.num_prompt_tokens - 1) // block * block > 0
    assert warm.token_ids == cold.token_ids and warm.text == cold.text
    assert cold.finish_reason == "length" and len(cold.token_ids) == 12


def test_stop_string_truncates_and_streaming_never_takes_text_back(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    [free] = engine.generate(["tool result: ok"], params)
    assert len(free.text) > 8
    stop = free.text[5:8]
    cut = free.text.index(stop)
    deltas, last = run_streamed(engine, "tool result: ok", SamplingParams(
        temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]))
    assert "".join(deltas) == free.text[:cut]
    assert last["finish_reason"] == "stop"


def test_stop_token_ids_and_eos(engine: LLMEngine) -> None:
    [free] = engine.generate([[1, 50, 60, 70]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    third = free.token_ids[2]
    [stopped] = engine.generate([[1, 50, 60, 70]], SamplingParams(temperature=0, max_tokens=10,
                                                                  stop_token_ids=[third], ignore_eos=True))
    assert stopped.token_ids == free.token_ids[:free.token_ids.index(third) + 1]
    assert stopped.finish_reason == "stop"


def test_seeded_sampling_is_reproducible_in_a_busy_batch(engine: LLMEngine) -> None:
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=16, ignore_eos=True)
    [alone] = engine.generate(["sample me"], seeded)
    others = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    results = engine.generate(["noise one", "sample me", "noise two has more words"],
                              [others, seeded, others])
    assert results[1].token_ids == alone.token_ids


def test_abort_frees_blocks_at_once(engine: LLMEngine) -> None:
    free_before = engine.kv.num_free_blocks
    request_id = engine.add_request("abort me please", SamplingParams(max_tokens=100, ignore_eos=True))
    engine.step()
    assert engine.kv.num_free_blocks < free_before
    out = engine.abort(request_id)
    assert out is not None and out.finished and out.finish_reason == "abort"
    assert engine.kv.num_free_blocks == free_before
    assert not engine.has_unfinished()
    assert engine.abort(request_id) is None


def test_preemption_under_a_small_cache_gives_the_same_tokens() -> None:
    roomy = LLMEngine("tiny", EngineSettings(num_kv_blocks=256, enable_prefix_caching=False))
    tight = LLMEngine("tiny", EngineSettings(num_kv_blocks=10, block_size=4, enable_prefix_caching=False))
    prompts = [[1, *range(10 + i, 20 + i)] for i in range(4)]
    params = SamplingParams(temperature=0.7, seed=5, max_tokens=14, ignore_eos=True)
    expected = [r.token_ids for r in roomy.generate(prompts, params)]
    got = tight.generate(prompts, params)
    assert [r.token_ids for r in got] == expected
    assert tight.scheduler.num_preemptions > 0
    assert tight.kv.num_free_blocks == 10


@pytest.mark.parametrize(("prompt", "params", "message"), [
    ("", SamplingParams(), "prompt is empty"),
    ([], SamplingParams(), "prompt is empty"),
    ([1, 99999], SamplingParams(), "prompt token ids must be in"),
    ([1] * 2048, SamplingParams(), "prompt has 2048 tokens; the model's context is 2048"),
    ("hi", SamplingParams(max_tokens=0), "max_tokens must be at least 1"),
])
def test_bad_requests_are_rejected(engine: LLMEngine, prompt: str | list[int], params: SamplingParams,
                                   message: str) -> None:
    with pytest.raises(RequestError, match=message):
        engine.add_request(prompt, params)
    assert not engine.has_unfinished()


def test_prompt_larger_than_the_cache_is_rejected() -> None:
    small = LLMEngine("tiny", EngineSettings(num_kv_blocks=4, block_size=4))
    with pytest.raises(RequestError, match="prompt needs 5 KV blocks; the cache has 4"):
        small.add_request(list(range(1, 17)), SamplingParams())


def test_logprobs_of_sampled_and_top_tokens(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=3, logprobs=2, return_logits=True, ignore_eos=True)
    [result] = engine.generate([[1, 30, 31]], params)
    assert [lp.token_id for lp in result.logprobs] == result.token_ids
    for lp, logits in zip(result.logprobs, result.logits, strict=True):
        expected = logits.log_softmax(-1)
        assert abs(lp.logprob - float(expected[lp.token_id])) < 1e-5
        assert [token for token, _ in lp.top] == expected.topk(2).indices.tolist()
        assert lp.top[0][0] == lp.token_id  # greedy picks the most likely token
