"""Blocks to frames and back: encode (views, for `sendmsg`), encode into a buffer, decode in place or into
the receiver's own tensor, and the coalescing of a layer's consecutive blocks into one frame."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from engine.kv_cache.wire.header import (
    ALIGNMENT,
    CHECKSUMS,
    DEFAULT_CHECKSUM,
    DTYPE_CODES,
    HEADER_SIZE,
    MAX_NDIM,
    BadChecksum,
    BadShape,
    ChecksumKind,
    ExpectedShape,
    FrameHeader,
    TruncatedFrame,
    check_shape,
    frame_nbytes,
    padded,
    parse_header,
    payload_nbytes,
)
from engine.kv_cache.wire.payload import PayloadSink, checksum_of, destination_segments, source_segments

_ZEROS = bytes(ALIGNMENT)


@dataclass
class KVBlock:
    """One layer's K and V for tokens [token_start, token_end): one block, or a run of a layer's consecutive
    blocks, whose `block_hash` is then the last block's (a chained hash names the whole run)."""

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
class EncodedFrame:
    """A frame as parts, for `sendmsg`: the payload segments view the tensor's own memory (no copy), a
    strided layer slice included."""

    header: bytes
    segments: tuple[memoryview, ...]
    padding: bytes

    @property
    def parts(self) -> tuple[bytes | memoryview, ...]:
        return self.header, *self.segments, self.padding

    @property
    def nbytes(self) -> int:
        return HEADER_SIZE + sum(segment.nbytes for segment in self.segments) + len(self.padding)

    def tobytes(self) -> bytes:
        return b"".join(self.parts)


def header_for(block: KVBlock, checksum_kind: ChecksumKind, payload_checksum: int) -> FrameHeader:
    shape = tuple(block.tensor.shape)
    return FrameHeader(block.tensor.dtype, checksum_kind, block.layer, block.token_start, block.token_end,
                       block.block_hash, shape, payload_nbytes(shape, block.tensor.dtype), payload_checksum)


def encode(block: KVBlock, checksum_kind: ChecksumKind = DEFAULT_CHECKSUM) -> EncodedFrame:
    segments = tuple(source_segments(block.tensor))
    header = header_for(block, checksum_kind, checksum_of(segments, checksum_kind))
    return EncodedFrame(header.pack(), segments, _ZEROS[:padded(header.payload_nbytes) - header.payload_nbytes])


def encode_into(block: KVBlock, dest: memoryview, checksum_kind: ChecksumKind = DEFAULT_CHECKSUM) -> int:
    """Write the frame into `dest` (one copy of the tensor, strided or not, checksummed stride by stride as
    it is copied); returns the frame's size."""
    nbytes = payload_nbytes(tuple(block.tensor.shape), block.tensor.dtype)
    if dest.nbytes < frame_nbytes(nbytes):
        raise ValueError(f"a {frame_nbytes(nbytes)}-byte frame does not fit {dest.nbytes} bytes")
    sink = PayloadSink([dest[HEADER_SIZE:HEADER_SIZE + nbytes]], checksum_kind)
    for segment in source_segments(block.tensor):
        sink.write(segment)
    dest[HEADER_SIZE + nbytes:frame_nbytes(nbytes)] = _ZEROS[:padded(nbytes) - nbytes]
    dest[:HEADER_SIZE] = header_for(block, checksum_kind, sink.value).pack()
    return frame_nbytes(nbytes)


def _checked(header: FrameHeader, payload: memoryview, expected: ExpectedShape | None) -> memoryview:
    if payload.nbytes < header.payload_nbytes:
        raise TruncatedFrame(f"payload of {payload.nbytes} bytes, the header promises {header.payload_nbytes}")
    check_shape(header, expected)
    return payload[:header.payload_nbytes]


def _bad_checksum(header: FrameHeader) -> BadChecksum:
    return BadChecksum(f"payload checksum mismatch (layer {header.layer}, tokens {header.token_start}..)")


def decode_payload(header: FrameHeader, payload: memoryview, expected: ExpectedShape | None = None) -> KVBlock:
    """The block whose tensor views `payload` (no copy); a read-only buffer is copied once."""
    payload = _checked(header, payload, expected)
    if CHECKSUMS[header.checksum_kind](payload, 0) != header.payload_checksum:
        raise _bad_checksum(header)
    data = bytearray(payload) if payload.readonly else payload
    tensor = torch.frombuffer(data, dtype=header.dtype).view(header.shape)
    return KVBlock(header.layer, header.token_start, header.token_end, header.block_hash, tensor)


def check_destination(header: FrameHeader, dest: torch.Tensor) -> None:
    if tuple(dest.shape) != header.shape or dest.dtype != header.dtype:
        raise BadShape(f"a {header.shape} {header.dtype} frame does not fit a {tuple(dest.shape)} {dest.dtype} "
                       "destination")


def decode_into(header: FrameHeader, payload: memoryview, dest: torch.Tensor,
                expected: ExpectedShape | None = None) -> KVBlock:
    """Check the frame and copy its payload into `dest` (the header's shape and dtype, strided or not), each
    stride checksummed as it is copied. After a BadChecksum the destination holds the corrupt bytes."""
    payload = _checked(header, payload, expected)
    check_destination(header, dest)
    segments = destination_segments(dest)
    if segments is None:
        dest.copy_(decode_payload(header, payload).tensor)
    else:
        sink = PayloadSink(segments, header.checksum_kind)
        sink.write(payload)
        if sink.value != header.payload_checksum:
            raise _bad_checksum(header)
    return KVBlock(header.layer, header.token_start, header.token_end, header.block_hash, dest)


def decode(buffer: bytes | bytearray | memoryview, expected: ExpectedShape | None = None) -> KVBlock:
    view = memoryview(buffer).cast("B")
    header = parse_header(view)
    return decode_payload(header, view[HEADER_SIZE:], expected)


def layer_runs(layer: int, kv: torch.Tensor, block_hashes: Sequence[int], block_tokens: int,
               max_payload_bytes: int) -> list[KVBlock]:
    """One layer's KV `[2, tokens, ...]` from token 0, in blocks of `block_tokens` (the last may be partial)
    with these chained hashes, as runs of whole blocks of at most `max_payload_bytes` (one block at least):
    views of `kv`, each hashed by its last block. What a sender of a whole layer hands to `send_many`."""
    tokens = kv.shape[1]
    if len(block_hashes) != -(-tokens // block_tokens):
        raise ValueError(f"{len(block_hashes)} hashes for {tokens} tokens in blocks of {block_tokens}")
    if tokens == 0:
        return []
    run_tokens = max(1, max_payload_bytes // (kv.nbytes // tokens * block_tokens)) * block_tokens
    return [KVBlock(layer, start, end, block_hashes[(end - 1) // block_tokens], kv[:, start:end])
            for start in range(0, tokens, run_tokens) for end in (min(start + run_tokens, tokens),)]


def coalesce(blocks: Iterable[KVBlock], max_payload_bytes: int, copy: bool = True) -> Iterator[KVBlock]:
    """Runs of consecutive blocks of one layer, each as one block of at most `max_payload_bytes` (a single
    block larger than that stays alone): their token ranges meet, their tensors differ only in dim 1, which
    holds each range's tokens. A run of views of one tensor becomes a view of it; any other run is copied,
    or, with `copy` False, not joined (blocks sent by reference must stay views of the sender's memory)."""
    run: list[KVBlock] = []
    nbytes = 0
    for block in blocks:
        size = block.tensor.nbytes
        if run and (nbytes + size > max_payload_bytes or not _continues(run[-1], block)
                    or not (copy or _adjacent_view([run[-1], block]) is not None)):
            yield _joined(run)
            run, nbytes = [], 0
        run.append(block)
        nbytes += size
    if run:
        yield _joined(run)


def _continues(last: KVBlock, block: KVBlock) -> bool:
    if last.layer != block.layer or last.token_end != block.token_start:
        return False
    a, b = last.tensor.shape, block.tensor.shape
    if a != b and (len(a) != len(b) or a[0] != b[0] or a[2:] != b[2:]):  # equal shapes: the common case, fast
        return False
    return (len(b) >= 2 and last.tensor.dtype == block.tensor.dtype
            and a[1] == last.token_end - last.token_start and b[1] == block.token_end - block.token_start)


def _joined(run: list[KVBlock]) -> KVBlock:
    first, last = run[0], run[-1]
    if len(run) == 1:
        return first
    tensor = _adjacent_view(run)
    if tensor is None:
        tensor = torch.cat([block.tensor for block in run], dim=1)
    return KVBlock(first.layer, first.token_start, last.token_end, last.block_hash, tensor)


def _adjacent_view(run: list[KVBlock]) -> torch.Tensor | None:
    """One view of the run when its tensors are views of one tensor, each starting where the last ends."""
    first = run[0].tensor
    base, stride, step = first._base, first.stride(), first.stride(1) * first.element_size()
    if base is None:
        return None
    pointer, tokens = first.data_ptr(), 0
    for block in run:
        tensor = block.tensor
        if tensor._base is not base or tensor.data_ptr() != pointer or tensor.stride() != stride:
            return None
        tokens = block.token_end - run[0].token_start
        pointer = first.data_ptr() + tokens * step
    return first.as_strided((first.shape[0], tokens, *first.shape[2:]), stride, first.storage_offset())
