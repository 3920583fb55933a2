"""One contract for every KV transport (inproc, shm, tcp, rdma where a device is present), then what is
particular to each: shm's ring and cleanup, tcp's DSCP marks, rdma's device-free parts."""

from __future__ import annotations

import multiprocessing
import socket
import struct
import threading
import zlib
from collections.abc import Iterator
from multiprocessing.shared_memory import SharedMemory

import pytest
import torch

from engine.kv_cache.wire import (
    HEADER_SIZE,
    BadChecksum,
    BadShape,
    KVBlock,
    TruncatedFrame,
    UnsupportedVersion,
    decode,
    encode,
    encode_into,
    kv_layer_shape,
)
from engine.transport import TRANSPORT_NAMES, make_transport
from engine.transport.base import TransportError, TransportSettings
from engine.transport.rdma import ConnectionParams, RegionLayout, aligned_buffer, imm_to_slot, slot_to_imm
from engine.transport.tcp.transport import TcpReceiver, TcpSender, socket_tos
from tests.engine.transport.transport_links import Link, open_link

SETTINGS = TransportSettings(shm_ring_bytes=1 << 20, frame_timeout_s=0.5, send_timeout_s=10.0)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(2, 16, 8, 64), (2, 3, 2, 8), (2, 1, 1, 4)]


def make_blocks(count: int, seed: int = 0, shape: tuple[int, ...] = (2, 16, 2, 8),
                dtype: torch.dtype = torch.float32) -> list[KVBlock]:
    generator = torch.Generator().manual_seed(seed)
    tokens = shape[1]
    return [KVBlock(i % 16, (i // 16) * tokens, (i // 16 + 1) * tokens, i * 7919,
                    torch.randn(shape, generator=generator).to(dtype)) for i in range(count)]


def assert_same(got: KVBlock | None, want: KVBlock) -> None:
    assert got is not None
    assert (got.layer, got.token_start, got.token_end, got.block_hash) == (
        want.layer, want.token_start, want.token_end, want.block_hash)
    assert got.tensor.dtype == want.tensor.dtype and got.tensor.shape == want.tensor.shape
    assert torch.equal(got.tensor.view(torch.uint8), want.tensor.contiguous().view(torch.uint8))


def rewrite_header(frame: bytes, offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(frame)
    struct.pack_into(fmt, data, offset, value)
    struct.pack_into("!I", data, 60, zlib.crc32(data[:60]))
    return bytes(data)


@pytest.fixture(params=TRANSPORT_NAMES)
def link(request: pytest.FixtureRequest) -> Iterator[Link]:
    with open_link(request.param, SETTINGS) as opened:
        yield opened


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_is_byte_exact(link: Link, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    transport, address, receiver = link
    block = make_blocks(1, shape=shape, dtype=dtype)[0]
    with transport.connect(address) as sender:
        sender.send(block)
        assert_same(receiver.recv(5.0), block)
    assert receiver.counters.accepted == 1 and receiver.counters.rejected == 0


def test_many_blocks_arrive_in_order_through_back_pressure(link: Link) -> None:
    transport, address, receiver = link
    blocks = make_blocks(1200)  # 2.4 MiB of frames through a 1 MiB shm ring
    sender = transport.connect(address)
    thread = threading.Thread(target=sender.send_many, args=(blocks,))
    thread.start()
    for block in blocks:
        assert_same(receiver.recv(10.0), block)
    thread.join()
    sender.close()


def test_borrowed_blocks_hold_the_same_bytes(link: Link) -> None:
    transport, address, receiver = link
    blocks = make_blocks(3)
    with transport.connect(address) as sender:
        sender.send_many(blocks)
        for block in blocks:
            borrowed = receiver.recv_borrowed(5.0)
            assert borrowed is not None
            with borrowed as got:
                assert_same(got, block)


def test_receiver_timeout_returns_none(link: Link) -> None:
    transport, address, receiver = link
    assert receiver.recv(0.05) is None
    with transport.connect(address):
        assert receiver.recv(0.05) is None


def test_corrupted_payload_is_rejected_and_the_stream_goes_on(link: Link) -> None:
    transport, address, receiver = link
    good, corrupt = make_blocks(2)
    frame = bytearray(encode(corrupt).tobytes())
    frame[HEADER_SIZE + 17] ^= 0x40
    with transport.connect(address) as sender:
        sender.send_frame(frame)
        sender.send(good)
        with pytest.raises(BadChecksum):
            receiver.recv(5.0)
        assert_same(receiver.recv(5.0), good)
    assert (receiver.counters.bad_checksum, receiver.counters.accepted) == (1, 1)


def test_wrong_version_is_rejected(link: Link) -> None:
    transport, address, receiver = link
    frame = rewrite_header(encode(make_blocks(1)[0]).tobytes(), 4, "!H", 7)
    with transport.connect(address) as sender:
        sender.send_frame(frame)
        with pytest.raises(UnsupportedVersion):
            receiver.recv(5.0)
    assert receiver.counters.unsupported_version == 1


def test_wrong_shape_is_rejected(link: Link) -> None:
    transport, _, _ = link
    address, receiver = transport.listen(kv_layer_shape(2, 8))
    block = make_blocks(1)[0]
    inconsistent = rewrite_header(encode(block).tobytes(), 44, "!I", 9)  # head_dim 9: not the payload's length
    with receiver, transport.connect(address) as sender:
        sender.send_frame(inconsistent)
        sender.send(make_blocks(1, shape=(2, 16, 4, 8))[0])  # consistent, but 4 kv heads, not the expected 2
        sender.send(block)
        for _ in range(2):
            with pytest.raises(BadShape):
                receiver.recv(5.0)
        assert_same(receiver.recv(5.0), block)
        assert (receiver.counters.bad_shape, receiver.counters.accepted) == (2, 1)


def test_a_transfer_cut_halfway_is_detected(link: Link) -> None:
    transport, address, receiver = link
    frame = encode(make_blocks(1)[0]).tobytes()
    sender = transport.connect(address)
    sender.send_frame(frame[:HEADER_SIZE + 300])
    sender.close()
    with pytest.raises(TruncatedFrame):
        receiver.recv(5.0)
    assert receiver.counters.truncated == 1


def send_from_child(name: str, settings: TransportSettings, address: str, count: int) -> None:
    with make_transport(name, settings).connect(address) as sender:
        sender.send_many(make_blocks(count, seed=5))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["shm", "tcp"])
def test_cross_process_transfer(name: str) -> None:
    address, receiver = make_transport(name, SETTINGS).listen()
    child = multiprocessing.get_context("spawn").Process(target=send_from_child,
                                                         args=(name, SETTINGS, address, 600))
    with receiver:
        child.start()
        for block in make_blocks(600, seed=5):
            assert_same(receiver.recv(60.0), block)
        child.join(30)
    assert child.exitcode == 0


def test_shm_lends_a_view_of_the_ring_once_and_unlinks_on_close() -> None:
    transport = make_transport("shm", SETTINGS)
    address, receiver = transport.listen()
    sender = transport.connect(address)
    with pytest.raises(TransportError, match="already has a sender"):
        transport.connect(address)
    sender.send_many(make_blocks(2))
    borrowed = receiver.recv_borrowed(5.0)
    assert borrowed is not None
    with pytest.raises(TransportError, match="release"):
        receiver.recv_borrowed(0.0)
    borrowed.release()
    borrowed.release()  # a second release is a no-op
    assert receiver.recv(5.0) is not None
    with pytest.raises(TransportError, match="exceeds"):
        sender.send(KVBlock(0, 0, 4096, 0, torch.zeros(2, 4096, 8, 64)))
    receiver.close()
    with pytest.raises(TransportError, match="closed"):
        sender.send(make_blocks(1)[0])
    sender.close()
    with pytest.raises(FileNotFoundError):
        SharedMemory(name=address.removeprefix("shm://"))


@pytest.mark.parametrize(("traffic_class", "tos"), [("decode", 0xC0), ("kv", 0x88), ("background", 0x00)])
def test_tcp_sockets_carry_the_dscp_of_their_class(traffic_class: str, tos: int) -> None:
    settings = SETTINGS.model_copy(update={"traffic_class": traffic_class})
    address, receiver = make_transport("tcp", settings).listen()
    assert isinstance(receiver, TcpReceiver)
    with receiver, make_transport("tcp", settings).connect(address) as sender:
        assert isinstance(sender, TcpSender)
        sender.send(make_blocks(1)[0])
        assert receiver.recv(5.0) is not None
        assert socket_tos(sender.sock) == tos
        assert socket_tos(receiver.listener) == tos
        assert [socket_tos(conn) for conn in receiver.connections] == [tos]


def test_tcp_serves_every_sender_and_grows_its_buffer_for_big_frames() -> None:
    settings = SETTINGS.model_copy(update={"tcp_buffer_bytes": 4096})
    transport = make_transport("tcp", settings)
    address, receiver = transport.listen()
    small, big = make_blocks(4, seed=1), make_blocks(2, seed=2, shape=(2, 64, 8, 16))  # 64 KiB frames
    with receiver, transport.connect(address) as first, transport.connect(address) as second:
        first.send_many(small)
        second.send_many(big)
        got = [receiver.recv(5.0) for _ in range(6)]
        assert receiver.recv(0.05) is None
    from_first = [block for block in got if block is not None and block.tensor.shape[1] == 16]
    from_second = [block for block in got if block is not None and block.tensor.shape[1] == 64]
    for got_block, want in zip(from_first + from_second, small + big, strict=True):
        assert_same(got_block, want)


def test_tcp_lends_one_block_at_a_time() -> None:
    transport = make_transport("tcp", SETTINGS)
    address, receiver = transport.listen()
    with receiver, transport.connect(address) as sender:
        sender.send_many(make_blocks(2))
        borrowed = receiver.recv_borrowed(5.0)
        assert borrowed is not None
        with pytest.raises(TransportError, match="release"):
            receiver.recv_borrowed(0.0)
        borrowed.release()
        assert receiver.recv(5.0) is not None


def test_tcp_stalled_frame_is_cut_after_the_frame_timeout() -> None:
    address, receiver = make_transport("tcp", SETTINGS).listen()
    with receiver, make_transport("tcp", SETTINGS).connect(address) as sender:
        sender.send_frame(encode(make_blocks(1)[0]).tobytes()[:HEADER_SIZE + 10])
        with pytest.raises(TruncatedFrame, match="cut"):
            receiver.recv(5.0)


def test_unknown_transport_and_bad_addresses_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown transport"):
        make_transport("carrier-pigeon")
    with pytest.raises(TransportError):
        make_transport("tcp", SETTINGS).connect("shm://x")
    with pytest.raises(TransportError):
        make_transport("shm", SETTINGS).connect("shm://agentserve-no-such-ring")


@pytest.mark.parametrize("alignment", [64, 4096])
def test_rdma_buffers_are_aligned(alignment: int) -> None:
    for nbytes in (1, 100, 1 << 20):
        buffer = aligned_buffer(nbytes, alignment)
        assert buffer.ctypes.data % alignment == 0 and buffer.nbytes == nbytes and buffer.flags.writeable
    with pytest.raises(ValueError):
        aligned_buffer(10, 48)


def test_rdma_region_sizing_rounds_slots_to_64_bytes() -> None:
    layout = RegionLayout.for_blocks(16, 8, 64, 2, region_bytes=1 << 20)  # fp16 frame: 64 + 32768 bytes
    assert (layout.slot_bytes, layout.num_slots) == (32832, 31)
    assert layout.nbytes <= 1 << 20 and layout.slot_bytes % 64 == 0
    assert RegionLayout.plan(100, 1000) == RegionLayout(128, 7)
    with pytest.raises(ValueError):
        RegionLayout.plan(4096, 1000)


def test_rdma_slots_hold_frames_whose_headers_decode_in_place() -> None:
    layout = RegionLayout.for_blocks(16, 2, 8, 4, region_bytes=1 << 16)
    region = aligned_buffer(layout.nbytes)
    blocks = make_blocks(layout.num_slots)
    for slot, block in enumerate(blocks):
        assert encode_into(block, layout.slot(region, slot)) == encode(block).nbytes <= layout.slot_bytes
    assert region.ctypes.data % 64 == 0
    for slot, block in enumerate(blocks):
        assert_same(decode(layout.slot(region, slot)), block)
    with pytest.raises(IndexError):
        layout.slot(region, layout.num_slots)
    assert all(imm_to_slot(slot_to_imm(slot)) == slot for slot in (0, 1, 255, 70000))
    assert slot_to_imm(1) == socket.htonl(1)


def test_rdma_connection_parameters_round_trip_through_bytes() -> None:
    params = ConnectionParams(qp_num=0x1234, lid=7, gid=bytes(range(16)), psn=0xABCDE, rkey=0xDEADBEEF,
                              addr=0x7F00_0000_1000, slot_bytes=32832, num_slots=31)
    data = params.to_bytes()
    assert len(data) == ConnectionParams.FORMAT.size and ConnectionParams.from_bytes(data) == params
    with pytest.raises(ValueError):
        ConnectionParams.from_bytes(data[:-1])
    with pytest.raises(ValueError):
        ConnectionParams(1 << 24, 0, bytes(16), 0, 0, 0, 64, 1)
    with pytest.raises(ValueError):
        ConnectionParams(1, 0, bytes(16), 0, 0, 0x1001, 64, 1)  # region not 64-byte aligned
