"""Block-sparse history: a request attends to a set of history blocks (spans at block granularity, the engine's
`query` selection included) and the result equals dense attention over exactly those tokens, against
`transformers` under the equivalent 4-D mask; with nothing skipped it equals the dense path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.model.block_selection import ATTENTION_DECAY, block_attention
from engine.model.mask import MaskedSpan, QuerySelection, ScoredPolicy, spans_skipping_blocks
from tests.engine.model.test_masks import hf_masked_logits

BLOCK = 8
PROMPT_LEN = 72  # 9 blocks
STEPS = 8
SETTINGS = EngineSettings(block_size=BLOCK, num_kv_blocks=64, max_num_batched_tokens=32)
PARAMS = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, return_logits=True)


def prompt() -> list[int]:
    return [1, *torch.randint(3, 300, (PROMPT_LEN - 1,), generator=torch.Generator().manual_seed(5)).tolist()]


def run(engine: LLMEngine, spans: list[MaskedSpan], selection: QuerySelection | None = None
        ) -> tuple[list[int], torch.Tensor, tuple[MaskedSpan, ...]]:
    """Tokens, logits per step, and every span the request's attention skipped (the engine's selections too)."""
    request_id = engine.add_request(prompt(), PARAMS, masked_spans=spans, selection=selection)
    seq = engine._seqs[request_id]
    tokens, logits = [], []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
            logits += out.logits
    return tokens, torch.stack(logits), seq.attention_spans


SKIPPED = {
    "history blocks while decoding": spans_skipping_blocks([1, 2, 4, 6], BLOCK, PROMPT_LEN),
    "blocks skipped by the prefill's last chunk too": spans_skipping_blocks([2, 3, 5], BLOCK, 48),
    "three quarters of the history": spans_skipping_blocks(range(1, 8), BLOCK, PROMPT_LEN - 8),
}


@pytest.mark.parametrize("shape", list(SKIPPED))
def test_skipped_blocks_equal_dense_attention_over_the_rest(
        shape: str, make_hf_checkpoint: Callable[..., Path], load_hf_reference: Callable[[Path], torch.nn.Module]
) -> None:
    checkpoint = make_hf_checkpoint("llama")
    model = load_hf_reference(checkpoint)
    engine = LLMEngine(str(checkpoint), SETTINGS)
    tokens, logits, spans = run(engine, SKIPPED[shape])
    reference = hf_masked_logits(model, prompt() + tokens[:-1], list(spans))[PROMPT_LEN - 1:]
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=0)


def test_nothing_skipped_is_the_dense_path(make_hf_checkpoint: Callable[..., Path]) -> None:
    engine = LLMEngine(str(make_hf_checkpoint("llama")), SETTINGS)
    dense_tokens, dense_logits, _ = run(engine, [])
    engine.reset_prefix_cache()
    tokens, logits, spans = run(engine, [], QuerySelection(budget=1.0, refresh_steps=1, recent_tokens=BLOCK))
    assert spans == () and tokens == dense_tokens
    assert torch.equal(logits, dense_logits)


@pytest.mark.parametrize("policy", ["query", "attention"])
def test_query_selection_is_exact_over_the_blocks_it_picks(
        make_hf_checkpoint: Callable[..., Path], load_hf_reference: Callable[[Path], torch.nn.Module],
        policy: ScoredPolicy) -> None:
    """Half the history is skipped, picked anew every 3 decode steps (by key bounds, `query`, or by the
    attention given, `attention`): each step equals dense attention over the blocks in force at its position,
    and the picks change (spans closed, others opened)."""
    checkpoint = make_hf_checkpoint("llama")
    model = load_hf_reference(checkpoint)
    engine = LLMEngine(str(checkpoint), SETTINGS)
    selection = QuerySelection(budget=0.5, refresh_steps=3, sink_tokens=4, recent_tokens=BLOCK, policy=policy)
    tokens, logits, spans = run(engine, [], selection)
    assert spans and all(span.from_position > PROMPT_LEN for span in spans)
    assert any(span.until_position is not None for span in spans), "the selection never changed"
    reference = hf_masked_logits(model, prompt() + tokens[:-1], list(spans))[PROMPT_LEN - 1:]
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=0)
    dense = hf_masked_logits(model, prompt() + tokens[:-1], [])[PROMPT_LEN - 1:]
    assert not torch.allclose(dense[2:], reference[2:], atol=1e-3), "the selection must skip something"
    assert len(engine.runner.summaries) == 0  # dropped with the request


def test_block_summaries_follow_the_kv_to_other_blocks() -> None:
    """Summaries come from the KV itself: KV read out (a hand-off, a demotion to a tier) and written back into
    other blocks (the decode side, a promotion) summarises the same, and blocks summarised before are not redone."""
    engine = LLMEngine("tiny", EngineSettings(block_size=BLOCK, num_kv_blocks=64))
    runner = engine.runner
    for cache in runner.kv_caches:
        cache.copy_(torch.randn(cache.shape, generator=torch.Generator().manual_seed(3)))
    before = runner.summaries.bounds("a", [0, 1, 2, 3], runner.kv_caches).clone()
    moved = [10, 11, 12, 13]
    for layer in range(len(runner.kv_caches)):
        runner.write_kv(layer, moved, 0, runner.read_kv(layer, [0, 1, 2, 3], 4 * BLOCK))
    assert torch.equal(runner.summaries.bounds("b", moved, runner.kv_caches), before)
    keys = runner.kv_caches[1][0, 2 * BLOCK:3 * BLOCK]
    assert torch.equal(before[1, 0, 2], keys.amin(dim=0)) and torch.equal(before[1, 1, 2], keys.amax(dim=0))
    runner.kv_caches[0][0, :BLOCK] += 1.0  # block 0 changed after it was summarised for "a": kept as it was
    assert torch.equal(runner.summaries.bounds("a", [0, 1, 2, 3, 4], runner.kv_caches)[:, :, :4], before)
    runner.release("a")
    runner.release("b")
    assert len(runner.summaries) == 0


def test_attention_scores_are_each_block_s_share_of_the_attention_accumulated() -> None:
    """A block's score is the largest share of any layer's query head's attention its tokens get (a softmax over
    the blocks' tokens, worked out here head by head), and a later pick adds its shares to the earlier ones,
    halved."""
    engine = LLMEngine("tiny", EngineSettings(block_size=BLOCK, num_kv_blocks=64))
    runner, config = engine.runner, engine.config
    for cache in runner.kv_caches:
        cache.copy_(torch.randn(cache.shape, generator=torch.Generator().manual_seed(5)))
    blocks = [3, 1, 7]
    queries = torch.randn(config.num_hidden_layers, config.num_attention_heads, config.head_dim,
                          generator=torch.Generator().manual_seed(6))
    scale = config.head_dim ** -0.5
    group = config.num_attention_heads // config.num_key_value_heads
    expected = torch.zeros(len(blocks))
    for layer, cache in enumerate(runner.kv_caches):
        keys = torch.cat([cache[0, b * BLOCK:(b + 1) * BLOCK] for b in blocks])  # [tokens, kv_heads, D]
        for head in range(config.num_attention_heads):
            weights = torch.softmax(keys[:, head // group] @ queries[layer, head] * scale, dim=0)
            expected = torch.maximum(expected, weights.view(len(blocks), BLOCK).sum(dim=1))
    first = runner.summaries.attention("a", queries, blocks, runner.kv_caches, scale).clone()
    torch.testing.assert_close(first, expected)
    second = runner.summaries.attention("a", queries, [*blocks, 9], runner.kv_caches, scale)
    shares = block_attention(queries, runner.kv_caches, [*blocks, 9], BLOCK, scale)
    torch.testing.assert_close(second, shares + torch.cat((first * ATTENTION_DECAY, torch.zeros(1))))
    runner.release("a")
    assert len(runner.summaries) == 0


def test_whole_blocks_are_gathered_as_the_token_slots() -> None:
    engine = LLMEngine("tiny", EngineSettings(block_size=BLOCK, num_kv_blocks=64))
    runner = engine.runner
    cache = torch.randn(runner.kv_caches[0].shape, generator=torch.Generator().manual_seed(4))
    table = [9, 3, 20, 21, 7]
    visible = torch.ones(4 * BLOCK + 3, dtype=torch.bool)
    visible[BLOCK:3 * BLOCK] = False
    blocks = runner._whole_blocks(visible, table)
    assert blocks is not None and blocks.block_ids.tolist() == [9, 21, 7]
    slots = runner._block_slots(table)[:visible.numel()][visible]
    assert torch.equal(blocks.gather(cache, int(visible.sum())), cache.index_select(1, slots))
    visible[BLOCK + 1] = True  # a block partly visible: slot by slot
    assert runner._whole_blocks(visible, table) is None
