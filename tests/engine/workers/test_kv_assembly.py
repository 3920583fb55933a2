"""Decode-side assembly of frames (single blocks or runs of a layer's consecutive blocks) into Full Blocks,
matched to requests by chained hashes."""

from __future__ import annotations

import torch

from engine.core.sampling.sampler import SamplingParams
from engine.kv_cache.wire import KVBlock, layer_runs
from engine.workers.messages import Handoff
from engine.workers.worker.kv_assembly import KVAssembler
from engine.workers.worker.kv_stream import wire_hashes

LAYERS, BLOCK = 2, 4


def handoff(request_id: str, prompt: list[int]) -> Handoff:
    return Handoff(request_id, prompt, 7, SamplingParams(), b"", 0)


def layers_for(prompt: list[int], seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, len(prompt), 2, 8, generator=generator) for _ in range(LAYERS)]


def blocks_of(prompt: list[int], kv: list[torch.Tensor], run_bytes: int = 0) -> list[KVBlock]:
    """Every layer's frames: one per block (run_bytes 0), or runs of blocks of up to run_bytes."""
    hashes = wire_hashes(prompt, BLOCK, ())
    return [b for layer, t in enumerate(kv) for b in layer_runs(layer, t, hashes, BLOCK, run_bytes)]


def test_blocks_arriving_before_the_handoff_in_any_order_assemble() -> None:
    prompt = list(range(1, 11))  # two full blocks and a partial one
    kv = layers_for(prompt, 0)
    assembler = KVAssembler(LAYERS, BLOCK, timeout_s=5.0)
    for block in reversed(blocks_of(prompt, kv)):
        assembler.add(block, now=0.0)
    assembler.expect(handoff("r", prompt), now=0.0)
    [done] = assembler.ready(now=0.1)
    assert done.outcome == "received" and done.kv_layers is not None
    for got, want in zip(done.kv_layers, kv, strict=True):
        assert torch.equal(got, want)
    assert assembler.counters.received == 1


def test_missing_blocks_time_out_and_corrupt_ones_fail_everything_waiting() -> None:
    prompt = list(range(1, 11))
    assembler = KVAssembler(LAYERS, BLOCK, timeout_s=1.0)
    assembler.expect(handoff("slow", prompt), now=0.0)
    for block in blocks_of(prompt, layers_for(prompt, 1))[:-1]:
        assembler.add(block, now=0.0)
    assert assembler.ready(now=0.5) == []
    [late] = assembler.ready(now=1.5)
    assert late.outcome == "timed_out" and late.kv_layers is None
    assembler.expect(handoff("victim", [9, 9, 9]), now=2.0)
    assembler.reject("BadChecksum")
    [victim] = assembler.ready(now=2.1)
    assert victim.outcome == "rejected" and assembler.counters.by_reason == {"BadChecksum": 1}


def test_two_requests_sharing_a_prefix_each_get_their_blocks() -> None:
    first, second = list(range(1, 9)), [*range(1, 9), 50, 51]
    assembler = KVAssembler(LAYERS, BLOCK, timeout_s=5.0)
    kv_first, kv_second = layers_for(first, 2), layers_for(second, 3)
    for block in blocks_of(first, kv_first) + blocks_of(second, kv_second):
        assembler.add(block, now=0.0)
    assembler.expect(handoff("a", first), now=0.0)
    assembler.expect(handoff("b", second), now=0.0)
    done = {d.handoff.request_id: d for d in assembler.ready(now=0.0)}
    assert done["a"].outcome == done["b"].outcome == "received"
    assert done["b"].kv_layers is not None and done["b"].kv_layers[0].shape[1] == len(second)
    assert torch.equal(done["b"].kv_layers[1][:, 8:], kv_second[1][:, 8:])


def test_runs_of_blocks_assemble_and_a_whole_layer_frame_is_used_as_it_is() -> None:
    prompt = list(range(1, 24))  # five full blocks and a partial one
    kv = layers_for(prompt, 4)
    block_bytes = kv[0][:, :BLOCK].nbytes
    assembler = KVAssembler(LAYERS, BLOCK, timeout_s=5.0)
    frames = blocks_of(prompt, kv[:1], run_bytes=2 * block_bytes) + blocks_of(prompt, kv, run_bytes=1 << 20)[1:]
    assert [(f.token_start, f.token_end) for f in frames] == [(0, 8), (8, 16), (16, 23), (0, 23)]
    for frame in reversed(frames):
        assembler.add(frame, now=0.0)
    assembler.expect(handoff("r", prompt), now=0.0)
    [done] = assembler.ready(now=0.0)
    assert done.outcome == "received" and done.kv_layers is not None
    assert all(torch.equal(got, want) for got, want in zip(done.kv_layers, kv, strict=True))
    assert done.kv_layers[1] is frames[-1].tensor  # one frame held the whole layer: no copy


def test_a_run_whose_last_hash_does_not_match_is_not_taken() -> None:
    prompt, other = list(range(1, 11)), [*range(1, 9), 77, 78]  # same first two blocks, another partial one
    kv = layers_for(prompt, 5)
    assembler = KVAssembler(LAYERS, BLOCK, timeout_s=1.0)
    for frame in blocks_of(other, layers_for(other, 6), run_bytes=1 << 20):
        assembler.add(frame, now=0.0)
    assembler.expect(handoff("r", prompt), now=0.0)
    assert assembler.ready(now=0.5) == []
    for frame in blocks_of(prompt, kv)[2::3]:  # the partial block of each layer, alone
        assembler.add(frame, now=0.5)
    assert assembler.ready(now=0.6) == []  # the other request's runs end on another hash: tokens 0..8 missing
    for frame in blocks_of(prompt, kv):
        assembler.add(frame, now=0.6)
    [done] = assembler.ready(now=0.7)
    assert done.outcome == "received" and done.kv_layers is not None
    assert all(torch.equal(got, want) for got, want in zip(done.kv_layers, kv, strict=True))
