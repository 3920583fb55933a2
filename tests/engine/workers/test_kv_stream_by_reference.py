"""The engine's disaggregated path over shm, in one process: the prefill engine's KV cache lives in the
transport's registered memory, its layers stream as views of that cache (sent by reference), the decode
side copies them once into its own blocks, and the prefill side's blocks stay held until then."""

from __future__ import annotations

import os
import time

import torch

from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.transport import make_transport
from engine.transport.base import BorrowedBlock, KVReceiver, TransportSettings
from engine.workers.worker.handoff import accept_handoff, read_layer, release, take_handoff
from engine.workers.worker.kv_assembly import KVAssembler
from engine.workers.worker.kv_stream import LayerStreamer, TransferStats

SETTINGS = EngineSettings(num_kv_blocks=128, block_size=8, max_num_batched_tokens=64)
PROMPT = [1, *range(10, 47)]  # four full blocks and a partial one
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def drain(receiver: KVReceiver) -> list[BorrowedBlock]:
    held = []
    while (block := receiver.recv_held(0.2)) is not None:
        held.append(block)
    return held


def released_within(stats: TransferStats, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not stats.released():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_prefill_kv_is_pulled_once_and_held_until_the_decode_side_releases_it() -> None:
    before = {name for name in os.listdir("/dev/shm") if name.startswith("agentserve")}
    transport = make_transport("shm", TransportSettings())
    prefill, decode = LLMEngine("tiny", SETTINGS), LLMEngine("tiny", SETTINGS)
    assert prefill.runner.place_kv_caches(transport.shared_tensors)
    streamer = LayerStreamer(prefill, transport.connect, by_reference=True)
    address, receiver = transport.listen()
    try:
        request_id = prefill.add_request(PROMPT, GREEDY, prefill_only=True)
        streamer.targets[request_id] = address
        completion = Completion(request_id)
        while prefill.has_unfinished():
            for out in prefill.step(streamer.on_layer):
                completion.add(out)
        stats, _ = streamer.finish(request_id)
        handoff = take_handoff(prefill, request_id)
        layers = prefill.config.num_hidden_layers

        held = drain(receiver)
        assert len(held) == layers  # fresh blocks are consecutive: one frame a layer
        for block in held:
            cache = prefill.runner.kv_caches[block.block.layer]
            assert torch.equal(block.block.tensor, read_layer(prefill, request_id, block.block.layer, len(PROMPT)))
            assert block.block.tensor.data_ptr() != cache.data_ptr()  # the receiver's mapping of the same memory
        assert not released_within(stats, 0.05)  # unread: the prefill side may not reuse its blocks

        assembler = KVAssembler(layers, SETTINGS.block_size, timeout_s=5.0)
        for block in held:
            assembler.add(block.block, release=block.release)
        assembler.expect(handoff)
        [done] = assembler.ready()
        assert done.outcome == "received" and accept_handoff(decode, handoff, done.frames)
        assert not released_within(stats, 0.05)
        done.release()
        assert released_within(stats, 5.0)  # acknowledged: now the blocks may go back to the pool
        release(prefill, request_id)

        while decode.has_unfinished():
            for out in decode.step():
                completion.add(out)
        expected = LLMEngine("tiny", SETTINGS).generate([PROMPT], GREEDY)[0].token_ids
        assert completion.token_ids == expected
        assert prefill.kv.num_free_blocks == prefill.num_blocks
    finally:
        streamer.close()
        receiver.close()
        transport.close()
    assert {name for name in os.listdir("/dev/shm") if name.startswith("agentserve")} == before
