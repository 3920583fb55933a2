"""The KV block wire format: the byte layout of the module docstring, zero-copy encode and decode, and every
rejection with its counter."""

from __future__ import annotations

import struct
import zlib

import numpy
import pytest
import torch

from engine.kv_cache.manager import hash_block_tokens
from engine.kv_cache.wire import (
    ALIGNMENT,
    CHECKSUM_STRIDE,
    CHECKSUMS,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    BadChecksum,
    BadHeader,
    BadMagic,
    BadShape,
    ChecksumKind,
    ExpectedShape,
    KVBlock,
    KVWireError,
    TruncatedFrame,
    UnsupportedVersion,
    WireCounters,
    coalesce,
    decode,
    decode_into,
    encode,
    encode_into,
    kv_layer_shape,
    layer_runs,
    parse_header,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def make_block(tokens: int = 16, kv_heads: int = 8, head_dim: int = 64, dtype: torch.dtype = torch.float32,
               layer: int = 3, seed: int = 0) -> KVBlock:
    generator = torch.Generator().manual_seed(seed)
    tensor = torch.randn(2, tokens, kv_heads, head_dim, generator=generator).to(dtype)
    block_hash = hash_block_tokens(None, list(range(tokens)))
    return KVBlock(layer, 32, 32 + tokens, block_hash, tensor)


def patched(frame: bytes, offset: int, fmt: str, value: int, fix_header_checksum: bool = True) -> bytearray:
    """The frame with one header field rewritten, its header checksum recomputed unless told not to."""
    data = bytearray(frame)
    struct.pack_into(fmt, data, offset, value)
    if fix_header_checksum:
        struct.pack_into("!I", data, 60, zlib.crc32(data[:60]))
    return data


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16, 8, 64), (3, 2, 8), (1, 1, 4)])
def test_round_trip_is_byte_exact(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    block = make_block(*shape, dtype=dtype)
    frame = encode(block).tobytes()
    assert len(frame) % ALIGNMENT == 0
    got = decode(frame, kv_layer_shape(shape[1], shape[2]))
    assert (got.layer, got.token_start, got.token_end, got.block_hash) == (3, 32, 32 + shape[0], block.block_hash)
    assert same_bytes(got.tensor, block.tensor)


def test_header_bytes_follow_the_documented_layout() -> None:
    block = make_block(tokens=16, kv_heads=8, head_dim=64, dtype=torch.bfloat16)
    frame = encode(block, ChecksumKind.CRC32).tobytes()
    payload_len = 2 * 16 * 8 * 64 * 2
    assert frame[0:4] == MAGIC
    assert struct.unpack_from("!HBB", frame, 4) == (FORMAT_VERSION, 3, ChecksumKind.CRC32)
    assert struct.unpack_from("!IIIB3x", frame, 8) == (3, 32, 48, 4)
    assert struct.unpack_from("!Q", frame, 24) == (block.block_hash,)
    assert struct.unpack_from("!4I", frame, 32) == (2, 16, 8, 64)
    assert struct.unpack_from("!QI", frame, 48) == (payload_len, zlib.crc32(frame[64:64 + payload_len]))
    assert struct.unpack_from("!I", frame, 60) == (zlib.crc32(frame[:60]),)
    assert len(frame) == HEADER_SIZE + payload_len


def test_padding_keeps_the_next_frame_aligned() -> None:
    block = make_block(tokens=1, kv_heads=1, head_dim=3)  # 24-byte payload
    frame = encode(block).tobytes()
    assert len(frame) == 128 and frame[64 + 24:] == bytes(40)


def test_encode_views_the_tensor_and_decode_views_the_buffer() -> None:
    block = make_block()
    frame = encode(block)
    block.tensor[0, 0, 0, 0] = 123.0
    assert torch.frombuffer(bytearray(frame.segments[0][:4]), dtype=torch.float32).item() == 123.0
    buffer = bytearray(encode(block).tobytes())
    got = decode(buffer)
    buffer[HEADER_SIZE:HEADER_SIZE + 4] = struct.pack("=f", 7.0)
    assert got.tensor[0, 0, 0, 0].item() == 7.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_encode_into_copies_a_strided_slice_once(dtype: torch.dtype) -> None:
    cache = torch.randn(2, 64, 4, 16).to(dtype)  # one layer's cache: [2, slots, kv_heads, head_dim]
    block = KVBlock(0, 16, 32, 9, cache[:, 16:32])
    assert not block.tensor.is_contiguous()
    dest = bytearray(encode(block).nbytes)
    assert encode_into(block, memoryview(dest)) == len(dest)
    assert bytes(dest) == encode(block).tobytes()
    assert same_bytes(decode(dest).tensor, cache[:, 16:32])


def test_decode_of_read_only_bytes_copies_into_an_owned_tensor() -> None:
    frame = encode(make_block()).tobytes()
    got = decode(frame)
    # torch warns about a read-only buffer only once a process, so check the aliasing itself as well
    frame_start = numpy.frombuffer(frame, dtype=numpy.uint8).ctypes.data
    assert not frame_start <= got.tensor.data_ptr() < frame_start + len(frame)
    got.tensor.add_(1)  # writable, no warning (warnings fail tests: see filterwarnings in pyproject.toml)


@pytest.mark.parametrize(("offset", "fmt", "value", "error"), [
    (0, "!4s", b"XXXX", BadMagic),
    (4, "!H", FORMAT_VERSION + 1, UnsupportedVersion),
    (4, "!H", 0, UnsupportedVersion),
    (6, "!B", 99, BadHeader),  # unknown dtype code
    (7, "!B", 9, BadHeader),  # unknown checksum kind
    (20, "!B", 5, BadHeader),  # ndim past 4
    (12, "!I", 49, BadHeader),  # token start past token end (48)
    (36, "!I", 17, BadShape),  # shape no longer matches the payload length
    (48, "!Q", 999, BadShape),  # payload length no longer matches the shape
])
def test_bad_header_fields_are_rejected(offset: int, fmt: str, value: object, error: type[KVWireError]) -> None:
    frame = bytearray(encode(make_block()).tobytes())
    struct.pack_into(fmt, frame, offset, value)
    struct.pack_into("!I", frame, 60, zlib.crc32(frame[:60]))
    with pytest.raises(error):
        decode(frame)


def test_a_flipped_header_bit_fails_the_header_checksum() -> None:
    frame = patched(encode(make_block()).tobytes(), 8, "!I", 4, fix_header_checksum=False)
    with pytest.raises(BadChecksum, match="header"):
        decode(frame)


def test_a_flipped_payload_bit_fails_the_payload_checksum() -> None:
    frame = bytearray(encode(make_block()).tobytes())
    frame[HEADER_SIZE + 100] ^= 0x01
    with pytest.raises(BadChecksum, match="payload"):
        decode(frame)


def test_truncated_frames_are_rejected() -> None:
    frame = encode(make_block()).tobytes()
    with pytest.raises(TruncatedFrame):
        decode(frame[:40])
    with pytest.raises(TruncatedFrame):
        decode(frame[:HEADER_SIZE + 100])


def test_expected_shape_is_enforced() -> None:
    frame = encode(make_block(kv_heads=4)).tobytes()
    with pytest.raises(BadShape, match="is not"):
        decode(frame, kv_layer_shape(8, 64))
    decode(frame, ExpectedShape((2, None, 4, 64)))
    token_range_mismatch = patched(frame, 16, "!I", 40)  # token end 40: 8 tokens, the shape holds 16
    with pytest.raises(BadShape, match="tokens"):
        decode(token_range_mismatch, kv_layer_shape(4, 64))


def test_counters_count_each_reason() -> None:
    counters = WireCounters()
    for error in (BadChecksum("x"), BadChecksum("y"), BadShape("z"), TruncatedFrame("t")):
        counters.reject(error)
    counters.accepted += 5
    assert (counters.bad_checksum, counters.bad_shape, counters.truncated, counters.rejected) == (2, 1, 1, 4)


def test_crc32c_when_available() -> None:
    frame = encode(make_block(), ChecksumKind.CRC32).tobytes()
    as_crc32c = patched(frame, 7, "!B", ChecksumKind.CRC32C)
    if ChecksumKind.CRC32C not in CHECKSUMS:
        with pytest.raises(BadHeader, match="not available"):
            parse_header(as_crc32c)
        pytest.skip("crc32c package not installed: CRC32C frames are refused, CRC32 is used")
    assert decode(encode(make_block(), ChecksumKind.CRC32C).tobytes()).layer == 3


@pytest.mark.parametrize("kwargs", [dict(layer=-1), dict(token_start=5, token_end=4), dict(block_hash=2**64)])
def test_blocks_that_do_not_fit_the_format_are_refused(kwargs: dict[str, int]) -> None:
    fields = dict(layer=0, token_start=0, token_end=1, block_hash=0, tensor=torch.zeros(2, 1, 1, 4)) | kwargs
    with pytest.raises(ValueError):
        KVBlock(**fields)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        KVBlock(0, 0, 0, 0, torch.zeros(2, 0, 1, 4))


def test_version_1_frames_are_still_read() -> None:
    block = make_block()
    got = decode(patched(encode(block).tobytes(), 4, "!H", 1))
    assert got.block_hash == block.block_hash and same_bytes(got.tensor, block.tensor)


def test_encode_views_a_strided_layer_slice_without_copying() -> None:
    cache = torch.randn(2, 64, 4, 16)
    frame = encode(KVBlock(0, 16, 32, 9, cache[:, 16:32]))
    addresses = [numpy.frombuffer(segment, dtype=numpy.uint8).ctypes.data for segment in frame.segments]
    assert addresses == [cache[0, 16].data_ptr(), cache[1, 16].data_ptr()]  # the K run and the V run
    assert same_bytes(decode(frame.tobytes()).tensor, cache[:, 16:32])


def test_a_payload_longer_than_a_stride_is_checksummed_as_one_pass() -> None:
    block = make_block(tokens=512)  # 2 MiB of float32: eight strides
    assert block.tensor.nbytes > 4 * CHECKSUM_STRIDE
    for kind in CHECKSUMS:
        dest = bytearray(encode(block, kind).nbytes)
        encode_into(block, memoryview(dest), kind)
        payload = dest[HEADER_SIZE:HEADER_SIZE + block.tensor.nbytes]
        assert struct.unpack_from("!I", dest, 56) == (CHECKSUMS[kind](payload, 0),)
        assert bytes(dest) == encode(block, kind).tobytes()


def layer_in_blocks(cache: torch.Tensor, layer: int, block: int) -> list[KVBlock]:
    """Views of one layer's cache, one per block, each hashed by its own chained hash."""
    hashes: list[int] = []
    for start in range(0, cache.shape[1], block):
        hashes.append(hash_block_tokens(hashes[-1] if hashes else None, list(range(start, start + block))))
    return [KVBlock(layer, start, min(start + block, cache.shape[1]), h, cache[:, start:start + block])
            for h, start in zip(hashes, range(0, cache.shape[1], block), strict=True)]


def test_a_layers_consecutive_blocks_coalesce_into_one_view() -> None:
    cache = torch.randn(2, 70, 2, 8)
    blocks = layer_in_blocks(cache, 5, 16)  # four full blocks and a partial one
    [run] = coalesce(blocks, 1 << 20)
    assert (run.layer, run.token_start, run.token_end, run.block_hash) == (5, 0, 70, blocks[-1].block_hash)
    assert run.tensor.data_ptr() == cache.data_ptr() and same_bytes(run.tensor, cache)
    got = decode(encode(run).tobytes(), kv_layer_shape(2, 8))
    assert same_bytes(got.tensor, cache)


def test_coalescing_stops_at_gaps_layers_and_the_size_limit() -> None:
    cache = torch.randn(2, 64, 2, 8)
    blocks = layer_in_blocks(cache, 0, 16)
    other_layer = KVBlock(1, 64, 80, 3, torch.randn(2, 16, 2, 8))
    separate = [KVBlock(1, 80, 96, 4, torch.randn(2, 16, 2, 8))]  # not a view of the one before: joined by a copy
    runs = list(coalesce([*blocks[:2], blocks[3], other_layer, *separate], 1 << 20))
    assert [(r.layer, r.token_start, r.token_end) for r in runs] == [(0, 0, 32), (0, 48, 64), (1, 64, 96)]
    assert same_bytes(runs[2].tensor, torch.cat([other_layer.tensor, separate[0].tensor], dim=1))
    small = list(coalesce(blocks, 2 * blocks[0].tensor.nbytes))
    assert [(r.token_start, r.token_end, r.block_hash) for r in small] == [
        (0, 32, blocks[1].block_hash), (32, 64, blocks[3].block_hash)]


def test_decode_into_writes_the_receivers_own_strided_blocks() -> None:
    block = make_block(tokens=16, kv_heads=4, head_dim=8)
    frame = memoryview(encode(block).tobytes())
    header = parse_header(frame)
    cache = torch.zeros(2, 64, 4, 8)
    got = decode_into(header, frame[HEADER_SIZE:], cache[:, 16:32])
    assert got.tensor.data_ptr() == cache[:, 16:32].data_ptr() and same_bytes(cache[:, 16:32], block.tensor)
    assert not cache[:, :16].any() and not cache[:, 32:].any()
    transposed = torch.zeros(2, 4, 16, 8).transpose(1, 2)  # too fragmented to view: staged through one copy
    assert same_bytes(decode_into(header, frame[HEADER_SIZE:], transposed).tensor, block.tensor)
    with pytest.raises(BadShape, match="destination"):
        decode_into(header, frame[HEADER_SIZE:], torch.zeros(2, 16, 4, 9))
    corrupt = bytearray(frame)
    corrupt[HEADER_SIZE + 5] ^= 0x10
    with pytest.raises(BadChecksum):
        decode_into(header, memoryview(corrupt)[HEADER_SIZE:], cache[:, 16:32])


def test_layer_runs_cut_a_layer_at_whole_blocks_and_name_each_run_by_its_last_block() -> None:
    kv = torch.randn(2, 70, 2, 8)
    hashes = [hash_block_tokens(None, [i]) for i in range(5)]  # four blocks of 16 and a partial one
    block_bytes = kv[:, :16].nbytes
    runs = layer_runs(3, kv, hashes, 16, 2 * block_bytes + 1)
    assert [(r.layer, r.token_start, r.token_end, r.block_hash) for r in runs] == [
        (3, 0, 32, hashes[1]), (3, 32, 64, hashes[3]), (3, 64, 70, hashes[4])]
    assert all(r.tensor.data_ptr() == kv[:, r.token_start].data_ptr() for r in runs)  # views, no copies
    assert [r.token_end for r in layer_runs(3, kv, hashes, 16, 0)] == [16, 32, 48, 64, 70]  # a block at least
    assert layer_runs(3, kv[:, :0], [], 16, 1 << 20) == []
    with pytest.raises(ValueError, match="hashes"):
        layer_runs(3, kv, hashes[:4], 16, 1 << 20)
