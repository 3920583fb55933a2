"""The contract of every KV transport for a layer's blocks sent as runs and received straight into the
receiver's own blocks (`recv_into`): byte-exact, one frame per run, every corruption still rejected."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from engine.kv_cache.wire import (
    HEADER_SIZE,
    BadChecksum,
    BadShape,
    FrameHeader,
    KVBlock,
    TruncatedFrame,
    encode,
    layer_runs,
)
from engine.transport import TRANSPORT_NAMES, make_transport
from engine.transport.base import Placement, TransportSettings
from tests.engine.transport.transport_links import Link, open_link

SETTINGS = TransportSettings(shm_ring_bytes=1 << 20, frame_timeout_s=0.5, tcp_buffer_bytes=4096)


@pytest.fixture(params=TRANSPORT_NAMES)
def link(request: pytest.FixtureRequest) -> Iterator[Link]:
    with open_link(request.param, SETTINGS) as opened:
        yield opened


def layer_kv(tokens: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(2, tokens, 4, 16, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def views_of(layer: int, kv: torch.Tensor, block: int) -> list[KVBlock]:
    """One view of `kv` per block, hashed 1000 x layer + block index."""
    tokens = kv.shape[1]
    return [KVBlock(layer, start, min(start + block, tokens), 1000 * layer + start // block, kv[:, start:start + block])
            for start in range(0, tokens, block)]


def placed_in(cache: list[torch.Tensor]) -> Placement:
    """Each frame goes into its layer's cache at its tokens: a strided view, K and V apart."""

    def place(header: FrameHeader) -> torch.Tensor:
        return cache[header.layer][:, header.token_start:header.token_end]
    return place


def test_a_layers_blocks_arrive_as_one_frame_in_the_receivers_blocks(link: Link) -> None:
    transport, address, receiver = link
    layers = [layer_kv(70, seed) for seed in range(3)]  # four blocks of 16 and a partial one per layer
    cache = [torch.zeros(2, 80, 4, 16, dtype=torch.bfloat16) for _ in layers]
    with transport.connect(address) as sender:
        for layer, kv in enumerate(layers):
            sender.send_many(views_of(layer, kv, 16))
        got = [receiver.recv_into(placed_in(cache), 5.0) for _ in layers]
        assert receiver.recv_into(placed_in(cache), 0.05) is None
    for layer, (block, kv) in enumerate(zip(got, layers, strict=True)):
        assert block is not None and (block.layer, block.token_start, block.token_end) == (layer, 0, 70)
        assert block.block_hash == 1000 * layer + 4  # the last block's
        assert torch.equal(cache[layer][:, :70], kv) and not cache[layer][:, 70:].any()
        assert block.tensor.data_ptr() == cache[layer].data_ptr()
    assert receiver.counters.accepted == 3


def test_runs_are_cut_to_the_senders_frame_limit(link: Link) -> None:
    transport, address, receiver = link
    kv = layer_kv(1024)  # 256 KiB: a quarter of the 1 MiB shm ring is less
    with transport.connect(address) as sender:
        runs = layer_runs(0, kv, list(range(64)), 16, sender.coalesce_bytes)
        assert all(run.tensor.nbytes <= sender.coalesce_bytes for run in runs)
        assert len(runs) > 1 or transport.name != "shm"
        thread = threading.Thread(target=sender.send_many, args=(runs,))
        thread.start()
        cache = [torch.zeros_like(kv)]
        got = [receiver.recv_into(placed_in(cache), 5.0) for _ in runs]
        thread.join()
    assert [(b.token_start, b.token_end, b.block_hash) for b in got if b is not None] == [
        (r.token_start, r.token_end, r.block_hash) for r in runs]
    assert torch.equal(cache[0], kv)


def test_corrupt_or_misfit_frames_are_rejected_by_recv_into_and_the_stream_goes_on(link: Link) -> None:
    transport, address, receiver = link
    good, corrupt = KVBlock(0, 0, 64, 1, layer_kv(64, 1)), KVBlock(1, 0, 64, 2, layer_kv(64, 2))
    frame = bytearray(encode(corrupt).tobytes())
    frame[HEADER_SIZE + 4000] ^= 0x08
    cache = [torch.zeros(2, 64, 4, 16, dtype=torch.bfloat16) for _ in range(2)]
    with transport.connect(address) as sender:
        sender.send_frame(frame)
        sender.send(good)
        sender.send(good)
        with pytest.raises(BadChecksum):
            receiver.recv_into(placed_in(cache), 5.0)
        with pytest.raises(BadShape, match="destination"):
            receiver.recv_into(lambda header: torch.zeros(2, 64, 4, 15, dtype=torch.bfloat16), 5.0)
        block = receiver.recv_into(placed_in(cache), 5.0)
    assert block is not None and torch.equal(cache[0], good.tensor)
    assert (receiver.counters.bad_checksum, receiver.counters.bad_shape, receiver.counters.accepted) == (1, 1, 1)


@pytest.mark.parametrize("name", ["shm", "tcp"])
def test_a_fragmented_destination_is_filled_through_one_staging_copy(name: str) -> None:
    transport = make_transport(name, SETTINGS)
    address, receiver = transport.listen()
    kv = layer_kv(32)
    transposed = torch.zeros(2, 4, 32, 16, dtype=torch.bfloat16).transpose(1, 2)  # too many pieces to view
    with receiver, transport.connect(address) as sender:
        sender.send(KVBlock(0, 0, 32, 5, kv))
        block = receiver.recv_into(lambda header: transposed, 5.0)
    assert block is not None and torch.equal(transposed, kv)


def test_tcp_reads_a_big_payload_into_the_destination_and_detects_a_cut() -> None:
    transport = make_transport("tcp", SETTINGS)
    address, receiver = transport.listen()
    kv = layer_kv(1024)  # 256 KiB through a 4 KiB receive buffer
    frame = encode(KVBlock(0, 0, 1024, 9, kv)).tobytes()
    with receiver:
        with transport.connect(address) as sender:
            sender.send_many(views_of(0, kv, 16))
            cache = [torch.zeros_like(kv)]
            assert receiver.recv_into(placed_in(cache), 5.0) is not None and torch.equal(cache[0], kv)
        with transport.connect(address) as sender:
            sender.send_frame(frame[:HEADER_SIZE + 100_000])
            with pytest.raises(TruncatedFrame, match="cut"):
                receiver.recv_into(placed_in(cache), 5.0)
    assert receiver.counters.truncated == 1
