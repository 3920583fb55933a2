"""The cost model against step times computed by hand."""

from __future__ import annotations

import pytest

from agents_eval.sim.model.cost import Link, RooflineTimer, StepWork, experts_touched, step_bytes, step_flops
from agents_eval.sim.model.specs import DeviceSpec, ModelShape

# 2 layers, hidden 4, 4 query / 2 KV columns, vocab 10, a dense MLP of width 8 (3 x 4 x 8 = 96 parameters).
DENSE = ModelShape(layers=2, hidden=4, q_width=4, kv_width=2, vocab=10, dense_mlp_params=96, expert_params=0,
                   num_experts=0, experts_per_token=0, dtype_bytes=2)
DEVICE = DeviceSpec(name="toy", peak_flops=1000.0, memory_bandwidth=100.0, memory_bytes=1e6,
                    interconnect_bandwidth=10.0, flops_efficiency=0.5, bandwidth_efficiency=0.5,
                    step_overhead_s=0.1, price_per_gpu_hour=1.0)


def test_one_decode_step_by_hand() -> None:
    work = StepWork.of([(1, 10, True)])  # one decode token after 10 cached tokens
    assert work == StepWork(seqs=1, tokens=1, sampled=1, attention_pairs=11, context_tokens=10)
    # attention params per layer 2*4*4 + 2*4*2 = 48; active = 2 x (48 + 96) = 288
    # FLOPs: 2*288 + LM head 2*10*4 + attention 4*2 layers*4*11 pairs = 576 + 80 + 352
    assert step_flops(DENSE, work) == 1008
    # bytes: weights (2 x (48 + 96) + 40 LM head) x 2 bytes = 656; KV (10 + 1) x (2*2*2*2 = 16) = 176
    assert step_bytes(DENSE, work) == 832
    # memory-bound: 832 / (100 x 0.5) = 16.64 s over compute 1008 / 500 = 2.016 s, plus 0.1 s overhead
    assert RooflineTimer(DEVICE, DENSE).step_time(work) == pytest.approx(16.74)


def test_prefill_chunk_is_compute_bound_and_pays_all_reduce() -> None:
    work = StepWork.of([(100, 0, True)])
    # pairs 100*101/2 = 5050; FLOPs 2*288*100 + 80 + 4*2*4*5050 = 57600 + 80 + 161600 = 219280
    assert step_flops(DENSE, work) == 219280
    # bytes 656 + 100*16 = 2256 -> 45.12 s; compute 219280 / 500 = 438.56 s
    assert RooflineTimer(DEVICE, DENSE).step_time(work) == pytest.approx(438.66)
    # tensor parallel 2: both halved, plus 2 layers x 2 all-reduces x (2*1/2) x 100*4*2 bytes / 10 B/s = 320 s
    assert RooflineTimer(DEVICE, DENSE, 2).step_time(work) == pytest.approx(0.1 + 219.28 + 320.0)


def test_moe_counts_active_experts_for_flops_and_touched_experts_for_bytes() -> None:
    moe = ModelShape(layers=1, hidden=4, q_width=4, kv_width=4, vocab=10, dense_mlp_params=0, expert_params=96,
                     num_experts=4, experts_per_token=1, dtype_bytes=1)
    assert experts_touched(moe, 2) == pytest.approx(4 * (1 - 0.75**2))  # 1.75
    work = StepWork.of([(1, 0, False), (1, 0, False)])
    # active per token: attention 2*16 + 2*16 = 64, one expert 96, router 16 -> 176
    assert step_flops(moe, work) == 2 * 176 * 2 + 4 * 1 * 4 * 2
    # weights: 64 + 16 + 1.75 * 96 = 248; KV 2 tokens x 2*1*4*1 = 16
    assert step_bytes(moe, work) == pytest.approx(248 + 16)


def test_seed_moe_shape_matches_its_stated_sizes() -> None:
    shape = ModelShape.load("moe27b")
    assert shape.total_params == pytest.approx(27.4e9, rel=0.01)
    assert shape.active_params + 2 * shape.vocab * shape.hidden == pytest.approx(4.8e9, rel=0.01)  # with embeddings
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_link_time() -> None:
    assert Link(bandwidth=100.0, efficiency=0.5, latency_s=1.0).transfer_s(200.0) == pytest.approx(5.0)
