"""The KV block wire format: the byte layout of the module docstring, zero-copy encode and decode, and every
rejection with its counter."""

from __future__ import annotations

import struct
import zlib

import numpy
import pytest
import torch

from engine.block_manager import hash_block_tokens
from engine.kv_wire import (
    ALIGNMENT,
    CHECKSUMS,
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
    decode,
    encode,
    encode_into,
    kv_layer_shape,
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
    assert struct.unpack_from("!HBB", frame, 4) == (1, 3, ChecksumKind.CRC32)
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
    assert torch.frombuffer(bytearray(frame.payload[:4]), dtype=torch.float32).item() == 123.0
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
    (4, "!H", 2, UnsupportedVersion),
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
