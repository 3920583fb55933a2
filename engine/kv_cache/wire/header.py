"""The 64-byte frame header (layout in `engine.kv_cache.wire`), the checks a receiver runs on it, and the errors
and counters of a rejected frame."""

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
FORMAT_VERSION = 2
READABLE_VERSIONS = frozenset({1, 2})  # a version 1 frame is a version 2 frame of one block
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


def _checksum_functions() -> Mapping[ChecksumKind, Callable[[Any, int], int]]:
    """Each kind's function(data, running value): feeding a payload in pieces gives its one-pass value."""
    functions: dict[ChecksumKind, Callable[[Any, int], int]] = {ChecksumKind.CRC32: zlib.crc32}
    with contextlib.suppress(ImportError):
        import crc32c

        functions[ChecksumKind.CRC32C] = crc32c.crc32c
    return MappingProxyType(functions)


CHECKSUMS = _checksum_functions()
_CHECKSUM_CODES: Mapping[int, ChecksumKind] = MappingProxyType({kind.value: kind for kind in CHECKSUMS})
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


class FrameHeader(NamedTuple):
    dtype: torch.dtype
    checksum_kind: ChecksumKind
    layer: int
    token_start: int
    token_end: int
    block_hash: int  # of the frame's last block
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


def padded(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def frame_nbytes(payload_nbytes: int) -> int:
    return HEADER_SIZE + padded(payload_nbytes)


def payload_nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def parse_header(buffer: bytes | bytearray | memoryview) -> FrameHeader:
    """The framing checks: magic, version, header checksum, known dtype and checksum kind."""
    view = memoryview(buffer)
    if view.nbytes < HEADER_SIZE:
        raise TruncatedFrame(f"{view.nbytes} bytes, less than a {HEADER_SIZE}-byte header")
    if view[:4] != MAGIC:
        raise BadMagic(f"magic {bytes(view[:4])!r}, expected {MAGIC!r}")
    (version,) = _VERSION_AT.unpack_from(view, 4)
    if version not in READABLE_VERSIONS:
        raise UnsupportedVersion(f"format version {version}, this receiver reads {sorted(READABLE_VERSIONS)}")
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
