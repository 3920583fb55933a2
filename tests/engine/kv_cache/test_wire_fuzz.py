"""Property tests of the KV block wire format: whatever bytes arrive, a receiver gets a block or a
`KVWireError` (which it counts and answers by recomputing), never another exception; every block that
round-trips is byte-exact, a coalesced run of blocks included; every single-byte corruption of a header or
payload is rejected, by the in-place decode and by the strided copy into the receiver's own tensor."""

from __future__ import annotations

import itertools
import math
import struct
import zlib

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.kv_cache.wire import (
    CHECKSUMS,
    CODE_DTYPES,
    HEADER_SIZE,
    MAGIC,
    MAX_NDIM,
    ChecksumKind,
    ExpectedShape,
    KVBlock,
    KVWireError,
    coalesce,
    decode,
    decode_into,
    encode,
    encode_into,
    frame_nbytes,
    parse_header,
    payload_nbytes,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
U32 = st.integers(0, 2**32 - 1)
SMALL_DIM = st.integers(0, 6)  # zero included: an empty shape must be refused, not crash the receiver
EXPECTED = st.sampled_from([None, ExpectedShape((2, None, 2, 4)), ExpectedShape((None,), token_dim=None)])


def crafted_frame(version: int, dtype_code: int, checksum_code: int, layer: int, start: int, end: int,
                  ndim: int, block_hash: int, dims: list[int], payload: bytes, declared_nbytes: int | None) -> bytes:
    """A frame with any field values and a correct header checksum, so decoding gets past the framing."""
    nbytes = len(payload) if declared_nbytes is None else declared_nbytes
    checksum = CHECKSUMS.get(ChecksumKind(checksum_code), zlib.crc32)(payload, 0) if checksum_code in (1, 2) else 0
    body = struct.pack("!4sHBBIIIB3xQ4IQI", MAGIC, version, dtype_code, checksum_code, layer, start, end, ndim,
                       block_hash, *dims, nbytes, checksum)
    return body + struct.pack("!I", zlib.crc32(body)) + payload + bytes(-len(payload) % 64)


@st.composite
def frames_with_any_header(draw: st.DrawFn) -> bytes:
    """Any field values; the payload mostly fits the shape, so frames also reach the payload checks."""
    dtype_code = draw(st.sampled_from([*CODE_DTYPES, 0, 9, 255]))
    ndim = draw(st.integers(0, 6))
    dims = draw(st.lists(SMALL_DIM, min_size=MAX_NDIM, max_size=MAX_NDIM))
    itemsize = CODE_DTYPES[dtype_code].itemsize if dtype_code in CODE_DTYPES else 1
    fitting = math.prod(dims[:ndim]) * itemsize
    return crafted_frame(
        version=draw(st.sampled_from([1, 1, 1, 0, 2, 65535])), dtype_code=dtype_code,
        checksum_code=draw(st.sampled_from([1, 2, 0, 3])),
        layer=draw(U32), start=draw(U32), end=draw(U32), ndim=ndim,
        block_hash=draw(st.integers(0, 2**64 - 1)), dims=dims,
        payload=draw(st.binary(min_size=fitting, max_size=fitting) | st.binary(max_size=512)),
        declared_nbytes=draw(st.none() | st.integers(0, 2**64 - 1)))


@st.composite
def blocks(draw: st.DrawFn) -> KVBlock:
    dtype = draw(st.sampled_from(sorted(CODE_DTYPES.values(), key=str)))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=MAX_NDIM)))
    raw = draw(st.binary(min_size=payload_nbytes(shape, dtype), max_size=payload_nbytes(shape, dtype)))
    start = draw(st.integers(0, 2**32 - 2))
    end = draw(st.integers(start, 2**32 - 1))
    tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).view(shape)
    return KVBlock(draw(U32), start, end, draw(st.integers(0, 2**64 - 1)), tensor)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bytes(a.contiguous().view(torch.uint8).numpy()) == bytes(
        b.contiguous().view(torch.uint8).numpy())


def decode_or_reject(frame: bytes | bytearray, expected: ExpectedShape | None = None) -> KVBlock | None:
    """The block, or None when the frame is rejected with a `KVWireError`; any other exception fails."""
    try:
        return decode(frame, expected)
    except KVWireError:
        return None


@FUZZ
@given(data=st.binary(max_size=1024), expected=EXPECTED)
def test_arbitrary_bytes_are_rejected_cleanly(data: bytes, expected: ExpectedShape | None) -> None:
    assert decode_or_reject(data, expected) is None  # no random bytes pass the magic and header checksum


@FUZZ
@given(data=st.binary(min_size=4, max_size=512))
def test_arbitrary_bytes_behind_the_magic_are_rejected_cleanly(data: bytes) -> None:
    assert decode_or_reject(MAGIC + b"\x00\x01" + data) is None


@FUZZ
@given(frame=frames_with_any_header(), expected=EXPECTED)
def test_any_header_fields_give_a_block_or_a_wire_error(frame: bytes, expected: ExpectedShape | None) -> None:
    block = decode_or_reject(frame, expected)
    if block is not None:  # accepted: it says what its header says and holds the payload's bytes
        (layer, start, end) = struct.unpack_from("!III", frame, 8)
        (nbytes,) = struct.unpack_from("!Q", frame, 48)
        assert (block.layer, block.token_start, block.token_end) == (layer, start, end)
        assert block.tensor.numel() > 0 and start <= end
        assert bytes(block.tensor.contiguous().view(torch.uint8).numpy()) == frame[HEADER_SIZE:HEADER_SIZE + nbytes]


@FUZZ
@given(block=blocks())
def test_every_block_round_trips_byte_exact(block: KVBlock) -> None:
    frame = encode(block).tobytes()
    assert len(frame) == frame_nbytes(block.tensor.nbytes)
    got = decode(frame)
    assert (got.layer, got.token_start, got.token_end, got.block_hash) == (
        block.layer, block.token_start, block.token_end, block.block_hash)
    assert same_bytes(got.tensor, block.tensor)
    dest = bytearray(len(frame))
    assert encode_into(block, memoryview(dest)) == len(frame) and bytes(dest) == frame


@FUZZ
@given(block=blocks(), data=st.data())
def test_any_changed_header_or_payload_byte_is_rejected(block: KVBlock, data: st.DataObject) -> None:
    frame = bytearray(encode(block).tobytes())
    at = data.draw(st.integers(0, HEADER_SIZE + block.tensor.nbytes - 1), label="byte")
    frame[at] ^= data.draw(st.integers(1, 255), label="xor")
    assert decode_or_reject(frame) is None


@FUZZ
@given(block=blocks(), data=st.data())
def test_a_cut_frame_is_rejected(block: KVBlock, data: st.DataObject) -> None:
    frame = encode(block).tobytes()
    cut = data.draw(st.integers(0, HEADER_SIZE + block.tensor.nbytes - 1), label="cut at")
    assert decode_or_reject(frame[:cut]) is None


def decode_into_or_reject(frame: bytes | bytearray, dest: torch.Tensor) -> KVBlock | None:
    try:
        view = memoryview(frame)
        return decode_into(parse_header(view), view[HEADER_SIZE:], dest)
    except KVWireError:
        return None


@st.composite
def split_layers(draw: st.DrawFn) -> tuple[torch.Tensor, list[KVBlock]]:
    """One layer's [2, tokens, heads, dim] cut into consecutive blocks: views of it, or copies."""
    tokens, heads, dim = draw(st.integers(1, 40)), draw(st.integers(1, 3)), draw(st.integers(1, 8))
    layer = torch.randn(2, tokens, heads, dim, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    cuts = sorted(set(draw(st.lists(st.integers(1, tokens - 1), max_size=6)) if tokens > 1 else []))
    bounds = [0, *cuts, tokens]
    as_views = draw(st.booleans())
    blocks = [KVBlock(7, start, end, draw(st.integers(0, 2**64 - 1)),
                      layer[:, start:end] if as_views else layer[:, start:end].clone())
              for start, end in itertools.pairwise(bounds)]
    return layer, blocks


@FUZZ
@given(split=split_layers(), limit=st.integers(1, 1 << 14))
def test_coalesced_runs_round_trip_and_cover_the_layer(split: tuple[torch.Tensor, list[KVBlock]],
                                                        limit: int) -> None:
    layer, blocks = split
    runs = list(coalesce(blocks, limit))
    assert [r.token_start for r in runs[1:]] == [r.token_end for r in runs[:-1]]
    assert runs[0].token_start == 0 and runs[-1].token_end == layer.shape[1]
    ends = {b.token_end: b.block_hash for b in blocks}
    for run in runs:
        assert run.block_hash == ends[run.token_end]  # the run's last block names it
        single = any((b.token_start, b.token_end) == (run.token_start, run.token_end) for b in blocks)
        assert run.tensor.nbytes <= limit or single  # only a block larger than the limit exceeds it
    received = torch.cat([decode(encode(run).tobytes()).tensor for run in runs], dim=1)
    assert same_bytes(received, layer)


@FUZZ
@given(block=blocks(), data=st.data())
def test_decode_into_round_trips_and_rejects_any_changed_byte(block: KVBlock, data: st.DataObject) -> None:
    frame = bytearray(encode(block).tobytes())
    dest = torch.zeros_like(block.tensor)
    got = decode_into_or_reject(frame, dest)
    assert got is not None and got.tensor is dest and same_bytes(dest, block.tensor)
    at = data.draw(st.integers(0, HEADER_SIZE + block.tensor.nbytes - 1), label="byte")
    frame[at] ^= data.draw(st.integers(1, 255), label="xor")
    assert decode_into_or_reject(frame, torch.zeros_like(block.tensor)) is None
