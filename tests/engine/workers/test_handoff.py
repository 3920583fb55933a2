"""Prefill on one engine, decode on another: the same tokens as one colocated engine."""

from __future__ import annotations

import pytest

from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.kv_cache.wire import KVBlock
from engine.workers.worker.handoff import accept_handoff, read_layer, release, take_handoff

PROMPTS = [[1, *range(10, 10 + n)] for n in (5, 23, 40, 3)]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, seed=7, max_tokens=12, ignore_eos=True)


def make() -> LLMEngine:
    return LLMEngine("tiny", EngineSettings(num_kv_blocks=128, block_size=8, max_num_batched_tokens=32))


def disaggregated(prefill: LLMEngine, decode: LLMEngine, params: SamplingParams,
                  send_kv: bool) -> list[tuple[list[int], str]]:
    ids = [prefill.add_request(p, params, prefill_only=True) for p in PROMPTS]
    results = {i: Completion(i) for i in ids}
    while prefill.has_unfinished():
        for out in prefill.step():
            results[out.request_id].add(out)
    layers = prefill.config.num_hidden_layers
    for request_id in ids:
        assert results[request_id].finish_reason == "prefilled"
        handoff = take_handoff(prefill, request_id)
        tokens = handoff.num_kv_tokens
        kv = [[KVBlock(layer, 0, tokens, 0, read_layer(prefill, request_id, layer, tokens))]
              for layer in range(layers)]  # each layer as one frame
        release(prefill, request_id)
        assert accept_handoff(decode, handoff, kv if send_kv else None) == send_kv
    while decode.has_unfinished():
        for out in decode.step():
            results[out.request_id].add(out)
    assert prefill.kv.num_free_blocks == prefill.num_blocks
    return [(results[i].token_ids, results[i].text) for i in ids]


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("send_kv", [True, False], ids=["kv-sent", "recomputed"])
def test_handoff_gives_colocated_tokens(params: SamplingParams, send_kv: bool) -> None:
    expected = [(r.token_ids, r.text) for r in make().generate(PROMPTS, params)]
    assert disaggregated(make(), make(), params, send_kv) == expected


def test_first_token_that_stops_needs_no_handoff() -> None:
    prefill = make()
    prefill.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=1), prefill_only=True)
    [out] = prefill.step()
    assert out.finish_reason == "length" and not prefill.prefilled
    assert prefill.kv.num_free_blocks == prefill.num_blocks
