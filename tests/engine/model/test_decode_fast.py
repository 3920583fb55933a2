"""The decode fast paths give the very numbers of the general ones: rotary positions by a roll, a lone
sequence's attention without the shared output buffer, a context of consecutive slots read in place, fused
quantized projections, 2-D quantized inputs."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as QType

from engine.config import ModelConfig
from engine.model.attention import AttentionMetadata, QuerySpan, new_kv_cache, paged_attention
from engine.model.gguf.quantized import Int4Linear
from engine.model.gguf.reader import GGUFTensor
from engine.model.llama import apply_rope, rope_inv_freq, rope_tables
from tests.engine.model.gguf_files import encode

CONFIG = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


def test_rope_by_roll_equals_rotate_half_bit_for_bit() -> None:
    positions = torch.tensor([0, 5, 63])
    angles = torch.outer(positions.float(), rope_inv_freq(CONFIG))
    cos, sin = torch.cat((angles, angles), -1).cos()[:, None], torch.cat((angles, angles), -1).sin()[:, None]
    x = torch.randn(3, 4, CONFIG.head_dim)
    half = CONFIG.head_dim // 2
    expected = x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
    table_cos, table_signed_sin = rope_tables(CONFIG)
    assert torch.equal(apply_rope(x, table_cos[positions][:, None], table_signed_sin[positions][:, None]), expected)


def test_a_lone_sequence_attends_as_it_does_in_a_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    kv_cache = new_kv_cache(64, KV_HEADS, HEAD_DIM, torch.float32)
    kv_cache.normal_(generator=generator)
    q = torch.randn(2, HEADS, HEAD_DIM, generator=generator)
    k, v = (torch.randn(2, KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2))
    first = QuerySpan(0, 1, torch.tensor([3, 9, 12, 40]), None)  # scattered slots, new token last
    second = QuerySpan(1, 1, torch.tensor([20, 21, 50]), None)
    both = paged_attention(q, k, v, kv_cache.clone(), AttentionMetadata(torch.tensor([40, 50]), [first, second]), 0.25)
    alone = paged_attention(q[:1], k[:1], v[:1], kv_cache.clone(), AttentionMetadata(torch.tensor([40]), [first]), 0.25)
    assert torch.equal(alone, both[:1])
    assert not torch.equal(both[0], both[1])


def test_consecutive_slots_are_read_in_place_as_scattered_ones_are_gathered() -> None:
    generator = torch.Generator().manual_seed(1)
    kv_cache = new_kv_cache(64, KV_HEADS, HEAD_DIM, torch.float32)
    kv_cache.normal_(generator=generator)
    in_place, scattered = torch.arange(20, 27), torch.tensor([2, 40, 5, 33, 9, 60, 11])
    kv_cache[:, scattered[:-1]] = kv_cache[:, in_place[:-1]]  # the same context, new token aside
    q = torch.randn(1, HEADS, HEAD_DIM, generator=generator)
    k, v = (torch.randn(1, KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2))
    outs = []
    for slots in (in_place, scattered):
        span = QuerySpan(0, 1, slots, None)
        outs.append(paged_attention(q, k, v, kv_cache, AttentionMetadata(slots[-1:], [span]), 0.25))
    assert QuerySpan(0, 1, in_place, None).first_slot == 20 and QuerySpan(0, 1, scattered, None).first_slot is None
    assert torch.equal(outs[0], outs[1])


def int4_tensor(name: str, rows: int, seed: int) -> GGUFTensor:
    values = np.random.default_rng(seed).standard_normal((rows, 128)).astype(np.float32)
    return GGUFTensor(name, QType.Q4_1, (rows, 128), encode(values, QType.Q4_1, seed=seed))


def test_fused_int4_projections_equal_the_separate_ones() -> None:
    parts = [int4_tensor("q", 64, 1), int4_tensor("k", 32, 2), int4_tensor("v", 32, 3)]
    biases = [torch.randn(64), torch.randn(32), torch.randn(32)]
    x = torch.randn(5, 128)
    fused = Int4Linear(parts, torch.cat(biases))(x)
    separate = [Int4Linear([part], bias)(x) for part, bias in zip(parts, biases, strict=True)]
    assert torch.equal(fused, torch.cat(separate, dim=-1))


def test_int4_layer_takes_2d_and_batched_inputs_alike() -> None:
    layer = Int4Linear([int4_tensor("w", 64, 4)], None)
    x = torch.randn(2, 3, 128)
    assert torch.equal(layer(x), layer(x.reshape(6, 128)).reshape(2, 3, 64))
