"""KV block wire format: one layer's K and V for a token range of one block, as one self-checking frame.

A prefill worker streams Layer Blocks (one layer of one block: `[1, tokens, bytes]`) and the decode worker
assembles them into Full Blocks (`[layer, tokens, bytes]`). Each Layer Block travels as one frame: a 64-byte
header in network byte order, the payload (the tensor's bytes in C order, for a KV cache layer slice
`[2, tokens, kv_heads, head_dim]`, K then V), then zero padding to a multiple of 64 bytes, so frames laid
end to end keep every header and payload 64-byte aligned (what shared-memory rings and RDMA regions need).

    offset  width  field
    ------  -----  ----------------------------------------------------------------------
         0      4  magic             b"AKVB"
         4      2  version           u16, FORMAT_VERSION
         6      1  dtype             u8: 1 float32, 2 float16, 3 bfloat16, 4 float64, 5 int8, 6 uint8,
                                     7 float8_e4m3fn, 8 float8_e5m2
         7      1  checksum kind     u8: 1 CRC32C (Castagnoli), 2 CRC32 (IEEE, zlib)
         8      4  layer             u32 layer index
        12      4  token start       u32 position of the first token
        16      4  token end         u32 one past the last token
        20      1  ndim              u8, 1..4
        21      3  reserved          zero
        24      8  block hash        u64 chained hash (engine.block_manager.hash_block_tokens)
        32     16  shape             4 x u32, zero past ndim
        48      8  payload length    u64 bytes, = product(shape) x dtype size
        56      4  payload checksum  u32 over the payload bytes (not the padding)
        60      4  header checksum   u32 CRC32 over bytes 0..59
        64      n  payload
      64+n      p  zero padding, p = -n mod 64

Checks run cheapest first: magic, version (before anything whose layout a newer version may change),
header checksum, then shape against the payload length and the receiver's expected shape, then the
payload checksum. CRC32C is used when the `crc32c` package is installed (hardware CRC instructions), else
zlib's CRC32; the frame names the one it carries.
"""

from __future__ import annotations

import contextlib
import math
import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from enum import IntEnum
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import torch

MAGIC = b"AKVB"
FORMAT_VERSION = 1
HEADER_SIZE = 64
ALIGNMENT = 64
MAX_NDIM = 4
_HEADER_BODY = struct.Struct("!4sHBBIIIB3xQ4IQI")  # bytes 0..59
_HEADER_CHECKSUM = struct.Struct("!I")  # bytes 60..63
_VERSION_AT = struct.Struct("!H")

DTYPE_CODES: Mapping[torch.dtype, int] = MappingProxyType({
    torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float64: 4, torch.int8: 5, torch.uint8: 6,
    torch.float8_e4m3fn: 7, torch.float8_e5m2: 8,
})
CODE_DTYPES: Mapping[int, torch.dtype] = MappingProxyType({code: dtype for dtype, code in DTYPE_CODES.items()})


class ChecksumKind(IntEnum):
    CRC32C = 1
    CRC32 = 2


def _checksum_functions() -> Mapping[ChecksumKind, Callable[[Any], int]]:
    functions: dict[ChecksumKind, Callable[[Any], int]] = {ChecksumKind.CRC32: zlib.crc32}
    with contextlib.suppress(ImportError):
        import crc32c

        functions[ChecksumKind.CRC32C] = crc32c.crc32c
    return MappingProxyType(functions)


CHECKSUMS = _checksum_functions()
_CHECKSUM_CODES: Mapping[int, ChecksumKind] = MappingProxyType({kind.value: kind for kind in CHECKSUMS})
_ZEROS = bytes(ALIGNMENT)
DEFAULT_CHECKSUM = ChecksumKind.CRC32C if ChecksumKind.CRC32C in CHECKSUMS else ChecksumKind.CRC32


class KVWireError(Exception):
    """A frame the receiver rejects; `reason` names the WireCounters field that counts it."""

    reason: ClassVar[str] = "bad_header"


class BadMagic(KVWireError):
    reason = "bad_magic"


class UnsupportedVersion(KVWireError):
    reason = "unsupported_version"


class BadHeader(KVWireError):
    reason = "bad_header"


class BadShape(KVWireError):
    reason = "bad_shape"


class BadChecksum(KVWireError):
    reason = "bad_checksum"


class TruncatedFrame(KVWireError):
    """Fewer bytes than the header promises: a cut transfer."""

    reason = "truncated"


@dataclass
class WireCounters:
    accepted: int = 0
    bad_magic: int = 0
    unsupported_version: int = 0
    bad_header: int = 0
    bad_shape: int = 0
    bad_checksum: int = 0
    truncated: int = 0

    def reject(self, error: KVWireError) -> None:
        setattr(self, error.reason, getattr(self, error.reason) + 1)

    @property
    def rejected(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self)) - self.accepted


@dataclass
class KVBlock:
    """One layer's K and V for tokens [token_start, token_end) of one block (a Layer Block)."""

    layer: int
    token_start: int
    token_end: int
    block_hash: int
    tensor: torch.Tensor  # [2, tokens, kv_heads, head_dim]: K then V

    def __post_init__(self) -> None:
        if not (0 <= self.layer < 2**32 and 0 <= self.token_start <= self.token_end < 2**32):
            raise ValueError(f"layer {self.layer} or token range [{self.token_start}, {self.token_end}) "
                             "does not fit the wire format")
        if not 0 <= self.block_hash < 2**64:
            raise ValueError("block_hash must be an unsigned 64-bit int")
        if self.tensor.dtype not in DTYPE_CODES or not 1 <= self.tensor.dim() <= MAX_NDIM:
            raise ValueError(f"unsupported tensor {self.tensor.dtype} of {self.tensor.dim()} dims")
        if self.tensor.numel() == 0 or self.tensor.device.type != "cpu":
            raise ValueError("the tensor must be non-empty and in host memory")


@dataclass(frozen=True)
class ExpectedShape:
    """What a receiver accepts: `dims` with None for any size; dim `token_dim` must equal the token count."""

    dims: tuple[int | None, ...]
    token_dim: int | None = 1

    def mismatch(self, header: FrameHeader) -> str | None:
        if len(header.shape) != len(self.dims) or any(
                want is not None and want != got for want, got in zip(self.dims, header.shape, strict=True)):
            return f"shape {header.shape} is not {self.dims}"
        tokens = header.token_end - header.token_start
        if self.token_dim is not None and header.shape[self.token_dim] != tokens:
            return f"shape {header.shape} does not hold the {tokens} tokens of its range"
        return None


def kv_layer_shape(kv_heads: int, head_dim: int) -> ExpectedShape:
    return ExpectedShape((2, None, kv_heads, head_dim))


class FrameHeader(NamedTuple):
    dtype: torch.dtype
    checksum_kind: ChecksumKind
    layer: int
    token_start: int
    token_end: int
    block_hash: int
    shape: tuple[int, ...]
    payload_nbytes: int
    payload_checksum: int
    version: int = FORMAT_VERSION

    @property
    def frame_nbytes(self) -> int:
        return frame_nbytes(self.payload_nbytes)

    def pack(self) -> bytes:
        dims = self.shape + (0,) * (MAX_NDIM - len(self.shape))
        body = _HEADER_BODY.pack(MAGIC, self.version, DTYPE_CODES[self.dtype], self.checksum_kind, self.layer,
                                 self.token_start, self.token_end, len(self.shape), self.block_hash, *dims,
                                 self.payload_nbytes, self.payload_checksum)
        return body + _HEADER_CHECKSUM.pack(zlib.crc32(body))


@dataclass(frozen=True)
class EncodedFrame:
    """A frame as parts, for `sendmsg`: the payload is a view of the tensor's own memory when it is
    contiguous (no copy)."""

    header: bytes
    payload: memoryview
    padding: bytes

    @property
    def parts(self) -> tuple[bytes | memoryview, ...]:
        return self.header, self.payload, self.padding

    @property
    def nbytes(self) -> int:
        return HEADER_SIZE + self.payload.nbytes + len(self.padding)

    def tobytes(self) -> bytes:
        return b"".join(self.parts)


def padded(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def frame_nbytes(payload_nbytes: int) -> int:
    return HEADER_SIZE + padded(payload_nbytes)


def payload_nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous tensor as a flat memoryview of its own memory."""
    return tensor.detach().reshape(-1).view(torch.uint8).numpy().data


def _header_for(block: KVBlock, checksum_kind: ChecksumKind, payload_checksum: int) -> FrameHeader:
    shape = tuple(block.tensor.shape)
    return FrameHeader(block.tensor.dtype, checksum_kind, block.layer, block.token_start, block.token_end,
                       block.block_hash, shape, payload_nbytes(shape, block.tensor.dtype), payload_checksum)


def encode(block: KVBlock, checksum_kind: ChecksumKind = DEFAULT_CHECKSUM) -> EncodedFrame:
    payload = tensor_bytes(block.tensor.contiguous())
    header = _header_for(block, checksum_kind, CHECKSUMS[checksum_kind](payload))
    return EncodedFrame(header.pack(), payload, _ZEROS[:padded(payload.nbytes) - payload.nbytes])


def encode_into(block: KVBlock, dest: memoryview, checksum_kind: ChecksumKind = DEFAULT_CHECKSUM) -> int:
    """Write the frame into `dest` (one copy of the tensor, strided or not); returns the frame's size."""
    shape = tuple(block.tensor.shape)
    nbytes = payload_nbytes(shape, block.tensor.dtype)
    if dest.nbytes < frame_nbytes(nbytes):
        raise ValueError(f"a {frame_nbytes(nbytes)}-byte frame does not fit {dest.nbytes} bytes")
    payload = dest[HEADER_SIZE:HEADER_SIZE + nbytes]
    torch.frombuffer(payload, dtype=block.tensor.dtype).view(shape).copy_(block.tensor)
    dest[HEADER_SIZE + nbytes:frame_nbytes(nbytes)] = _ZEROS[:padded(nbytes) - nbytes]
    dest[:HEADER_SIZE] = _header_for(block, checksum_kind, CHECKSUMS[checksum_kind](payload)).pack()
    return frame_nbytes(nbytes)


def parse_header(buffer: bytes | bytearray | memoryview) -> FrameHeader:
    """The framing checks: magic, version, header checksum, known dtype and checksum kind."""
    view = memoryview(buffer)
    if view.nbytes < HEADER_SIZE:
        raise TruncatedFrame(f"{view.nbytes} bytes, less than a {HEADER_SIZE}-byte header")
    if view[:4] != MAGIC:
        raise BadMagic(f"magic {bytes(view[:4])!r}, expected {MAGIC!r}")
    (version,) = _VERSION_AT.unpack_from(view, 4)
    if version != FORMAT_VERSION:
        raise UnsupportedVersion(f"format version {version}, this receiver reads {FORMAT_VERSION}")
    (header_checksum,) = _HEADER_CHECKSUM.unpack_from(view, _HEADER_BODY.size)
    if zlib.crc32(view[:_HEADER_BODY.size]) != header_checksum:
        raise BadChecksum("header checksum mismatch")
    return _unpack_fields(view)


def _unpack_fields(view: memoryview) -> FrameHeader:
    (_, version, dtype_code, checksum_code, layer, start, end, ndim, block_hash, *dims, nbytes,
     payload_checksum) = _HEADER_BODY.unpack_from(view)
    if dtype_code not in CODE_DTYPES:
        raise BadHeader(f"unknown dtype code {dtype_code}")
    if checksum_code not in _CHECKSUM_CODES:
        raise BadHeader(f"checksum kind {checksum_code} is unknown or not available here")
    if not 1 <= ndim <= MAX_NDIM:
        raise BadHeader(f"ndim {ndim} outside 1..{MAX_NDIM}")
    if start > end:
        raise BadHeader(f"token range [{start}, {end}) ends before it starts")
    return FrameHeader(CODE_DTYPES[dtype_code], _CHECKSUM_CODES[checksum_code], layer, start, end, block_hash,
                       tuple(dims[:ndim]), nbytes, payload_checksum, version)


def check_shape(header: FrameHeader, expected: ExpectedShape | None = None) -> None:
    if 0 in header.shape:
        raise BadShape(f"shape {header.shape} holds no elements")
    if payload_nbytes(header.shape, header.dtype) != header.payload_nbytes:
        raise BadShape(f"payload of {header.payload_nbytes} bytes is not shape {header.shape} of {header.dtype}")
    problem = None if expected is None else expected.mismatch(header)
    if problem is not None:
        raise BadShape(problem)


def decode_payload(header: FrameHeader, payload: memoryview, expected: ExpectedShape | None = None) -> KVBlock:
    """The block whose tensor views `payload` (no copy); a read-only buffer is copied once."""
    if payload.nbytes < header.payload_nbytes:
        raise TruncatedFrame(f"payload of {payload.nbytes} bytes, the header promises {header.payload_nbytes}")
    check_shape(header, expected)
    payload = payload[:header.payload_nbytes]
    if CHECKSUMS[header.checksum_kind](payload) != header.payload_checksum:
        raise BadChecksum(f"payload checksum mismatch (layer {header.layer}, tokens {header.token_start}..)")
    data = bytearray(payload) if payload.readonly else payload
    tensor = torch.frombuffer(data, dtype=header.dtype).view(header.shape)
    return KVBlock(header.layer, header.token_start, header.token_end, header.block_hash, tensor)


def decode(buffer: bytes | bytearray | memoryview, expected: ExpectedShape | None = None) -> KVBlock:
    view = memoryview(buffer).cast("B")
    header = parse_header(view)
    return decode_payload(header, view[HEADER_SIZE:], expected)
