"""Parity of engine.model.llama with Hugging Face `transformers` on one checkpoint, through the paged KV cache."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model.attention import AttentionMetadata, QuerySpan, causal_mask, new_kv_cache
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import load_model

BLOCK_SIZE = 4
NUM_SLOTS = 64 * BLOCK_SIZE
ATOL = 1e-4
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}  # with head_dim 16 all three frequency bands occur
CASES: dict[str, dict[str, Any]] = {
    "llama": {},
    "llama-tied": {"tie": True},
    "llama-rope-llama3": {"rope_scaling": LLAMA3_ROPE},
    "llama-rope-linear": {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "llama-rope-dynamic": {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    "qwen2": {"arch": "qwen2"},
    "qwen2-tied": {"arch": "qwen2", "tie": True},
}


@dataclass
class Seq:
    """A test sequence with its own (scattered) KV blocks."""

    tokens: list[int]
    blocks: list[int]
    num_computed: int = 0

    def slots(self, end: int) -> torch.Tensor:
        positions = torch.arange(end)
        return torch.tensor(self.blocks)[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE


class Runner:
    """Drives the model as a model runner does: prefill chunks first, then one token per decode."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        config, dtype = model.config, model.model.embed_tokens.weight.dtype
        self.model = model
        self.kv_caches = [new_kv_cache(NUM_SLOTS, config.num_key_value_heads, config.head_dim, dtype)
                          for _ in range(config.num_hidden_layers)]

    def step(self, chunks: list[tuple[Seq, int]], decodes: list[Seq]) -> torch.Tensor:
        """Run `(seq, num_new)` prefill chunks and single-token decodes; logits of every new token."""
        ids, positions, slots, spans = [], [], [], []
        for seq, num_new in chunks:
            start, end = seq.num_computed, seq.num_computed + num_new
            spans.append(QuerySpan(len(ids), num_new, seq.slots(end), causal_mask(start, num_new)))
            ids += seq.tokens[start:end]
            positions += range(start, end)
            slots += seq.slots(end)[start:].tolist()
        for seq in decodes:
            spans.append(QuerySpan(len(ids), 1, seq.slots(seq.num_computed + 1), None))  # sees all its context
            ids.append(seq.tokens[seq.num_computed])
            positions.append(seq.num_computed)
            slots.append(int(seq.slots(seq.num_computed + 1)[-1]))
        meta = AttentionMetadata(torch.tensor(slots), spans)
        with torch.inference_mode():
            hidden = self.model(torch.tensor(ids), torch.tensor(positions), self.kv_caches, meta)
            logits = self.model.compute_logits(hidden)
        for seq, num_new in chunks:
            seq.num_computed += num_new
        for seq in decodes:
            seq.num_computed += 1
        return logits


def random_tokens(n: int, vocab_size: int, seed: int) -> list[int]:
    return torch.randint(vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(params=list(CASES))
def checkpoint(request: pytest.FixtureRequest, make_hf_checkpoint: Callable[..., Path]) -> Path:
    return make_hf_checkpoint(**CASES[request.param])


@pytest.fixture
def pair(checkpoint: Path, load_hf_reference: Callable[[Path], torch.nn.Module]
         ) -> tuple[Runner, Callable[[list[int]], torch.Tensor]]:
    """Our model behind a Runner, and a function giving the HF logits of a whole token sequence."""
    hf = load_hf_reference(checkpoint)

    def reference(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return hf(torch.tensor([tokens])).logits[0]

    return Runner(load_model(str(checkpoint)).model), reference


def test_single_prefill_matches_transformers(pair: tuple[Runner, Callable]) -> None:
    runner, reference = pair
    seq = Seq(random_tokens(37, 320, seed=1), blocks=[9, 3, 17, 0, 5, 30, 12, 2, 40, 11])
    logits = runner.step([(seq, 37)], [])
    torch.testing.assert_close(logits, reference(seq.tokens), atol=ATOL, rtol=0)


def test_chunked_prefill_matches_transformers(pair: tuple[Runner, Callable]) -> None:
    runner, reference = pair
    seq = Seq(random_tokens(37, 320, seed=2), blocks=[7, 1, 22, 14, 3, 50, 8, 9, 31, 4])
    logits = torch.cat([runner.step([(seq, 20)], []), runner.step([(seq, 17)], [])])
    torch.testing.assert_close(logits, reference(seq.tokens), atol=ATOL, rtol=0)


def test_decode_batch_matches_transformers(pair: tuple[Runner, Callable]) -> None:
    runner, reference = pair
    a = Seq(random_tokens(15, 320, seed=3), blocks=[5, 2, 11, 0])
    b = Seq(random_tokens(26, 320, seed=4), blocks=[8, 1, 13, 20, 6, 3, 9])
    ref_a, ref_b = reference(a.tokens), reference(b.tokens)
    first = runner.step([(a, 11), (b, 15)], [])
    torch.testing.assert_close(first, torch.cat([ref_a[:11], ref_b[:15]]), atol=ATOL, rtol=0)
    mixed = runner.step([(b, 8)], [a])  # b's second chunk and a's decode in one step
    torch.testing.assert_close(mixed, torch.cat([ref_b[15:23], ref_a[11:12]]), atol=ATOL, rtol=0)
    for _ in range(3):
        position_a, position_b = a.num_computed, b.num_computed
        logits = runner.step([], [a, b])
        expected = torch.stack([ref_a[position_a], ref_b[position_b]])
        torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_sharded_checkpoint_loads_same_weights(make_hf_checkpoint: Callable[..., Path]) -> None:
    sharded = make_hf_checkpoint(max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    ours = load_model(str(sharded)).model.state_dict()
    single = load_model(str(make_hf_checkpoint())).model.state_dict()
    assert ours.keys() == single.keys()
    assert all(torch.equal(ours[name], single[name]) for name in ours)


def test_bfloat16_model_is_close_and_returns_float32_logits(
        make_hf_checkpoint: Callable[..., Path],
        load_hf_reference: Callable[[Path], torch.nn.Module]) -> None:
    checkpoint = make_hf_checkpoint()
    loaded = load_model(str(checkpoint), dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    seq = Seq(random_tokens(20, 320, seed=5), blocks=[3, 0, 7, 1, 9])
    logits = Runner(loaded.model).step([(seq, 20)], [])
    assert logits.dtype == torch.float32
    with torch.no_grad():
        expected = load_hf_reference(checkpoint)(torch.tensor([seq.tokens])).logits[0]
    torch.testing.assert_close(logits, expected, atol=0.1, rtol=0)
