"""One-copy shm transfers: the receiver pulls straight from the sender's registered shared memory.

The way Mooncake and NIXL move KV within a node. A sender's KV lives in a `SharedRegion` (a named
segment in /dev/shm that its transport registered); a block viewing it travels through the ring as a
pull record: the block's wire header, then a descriptor (sequence number, segment name, byte offset,
strides). The receiver maps the segment once, views the block there and copies it once, straight into
its own KV blocks, then acknowledges the sequence number in the ring's ack table; only then may the
sender reuse that memory (the engine's prefill side keeps a request's blocks until every pull of them
is acknowledged). There is no payload checksum: the bytes never leave this machine's memory, and the
header (with its own checksum) is checked as for any frame.

Pull record body:

    offset  width  field
         0     64  kv_wire header     the block's, payload checksum 0
        64      8  sequence           u64, the sender's count of pulls before this one
        72     32  segment name       ascii, zero padded
       104      8  byte offset        u64, of the block's first element in the segment
       112     32  strides            4 x i64, in elements, zero past ndim
"""

from __future__ import annotations

import contextlib
import os
import struct
import uuid
from collections.abc import Callable, Sequence
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import torch

from engine.kv_cache.wire import HEADER_SIZE, BadShape, ChecksumKind, FrameHeader, KVBlock, header_for, padded
from engine.transport.shm.ring import ACK_SLOTS, Ring, attach, close_mapping

DESCRIPTOR = struct.Struct("=Q32sQ4q")
PULL_BODY_BYTES = HEADER_SIZE + DESCRIPTOR.size
TensorSpec = tuple[tuple[int, ...], torch.dtype]


def region_sizes(specs: Sequence[TensorSpec]) -> list[int]:
    """Bytes each tensor takes in a region (64-byte aligned)."""
    return [padded(torch.Size(shape).numel() * dtype.itemsize) for shape, dtype in specs]


def room_for(nbytes: int) -> bool:
    """Whether /dev/shm has nbytes free: a segment larger than that faults (SIGBUS) when its pages are touched."""
    stats = os.statvfs("/dev/shm")
    return nbytes <= stats.f_bavail * stats.f_frsize


def _extent_bytes(tensor: torch.Tensor) -> int:
    """Bytes from a tensor's first element to one past its last (strides are non-negative)."""
    return (sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True)) + 1) * tensor.element_size()


class SharedRegion:
    """A named shared-memory segment that tensors are carved from, registered with the shm transport so its
    senders send views of it by reference. Its owner unlinks it (`close`)."""

    def __init__(self, specs: Sequence[TensorSpec]) -> None:
        sizes = region_sizes(specs)
        self._segment = SharedMemory(f"agentserve-pull-{uuid.uuid4().hex[:16]}", create=True, size=max(64, sum(sizes)))
        self.name = self._segment.name
        assert self._segment.buf is not None
        base = torch.frombuffer(self._segment.buf, dtype=torch.uint8)
        self._start, self._end = base.data_ptr(), base.data_ptr() + base.numel()
        offsets = [sum(sizes[:index]) for index in range(len(sizes))]
        self.tensors = [base[offset:offset + size].view(dtype)[:torch.Size(shape).numel()].view(shape).zero_()
                        for offset, size, (shape, dtype) in zip(offsets, sizes, specs, strict=True)]

    def offset_of(self, tensor: torch.Tensor) -> int | None:
        """Byte offset of `tensor`'s first element in this segment, or None when it is not wholly inside."""
        start = tensor.data_ptr()
        if any(s < 0 for s in tensor.stride()) or not self._start <= start < self._end:
            return None
        return start - self._start if start + _extent_bytes(tensor) <= self._end else None

    def close(self) -> None:
        """Unlink the segment; mappings (this process's tensors, receivers' views) stay valid until dropped."""
        self.tensors = []
        close_mapping(self._segment)
        with contextlib.suppress(FileNotFoundError):
            self._segment.unlink()


def pack_pull(block: KVBlock, sequence: int, region: SharedRegion, offset: int, checksum: ChecksumKind,
              into: memoryview) -> None:
    strides = (*block.tensor.stride(), 0, 0, 0)[:4]
    into[:HEADER_SIZE] = header_for(block, checksum, 0).pack()
    DESCRIPTOR.pack_into(into, HEADER_SIZE, sequence, region.name.encode(), offset, *strides)


def unpack_descriptor(body: memoryview) -> tuple[int, str, int, tuple[int, ...]]:
    sequence, name, offset, *strides = DESCRIPTOR.unpack_from(body, HEADER_SIZE)
    return sequence, name.rstrip(b"\0").decode(), offset, tuple(strides)


class MappedSegments:
    """The receiver's mappings of its senders' segments, each mapped once, unmapped on close."""

    def __init__(self) -> None:
        self._mapped: dict[str, tuple[Any, torch.Tensor]] = {}

    def view(self, header: FrameHeader, name: str, offset: int, strides: tuple[int, ...]) -> torch.Tensor:
        """The block's tensor in the sender's segment (no copy); BadShape when it reaches outside it."""
        if name not in self._mapped:
            try:
                segment = attach(name)
            except FileNotFoundError:
                raise BadShape(f"no registered segment {name!r} (its sender is gone)") from None
            self._mapped[name] = segment, torch.frombuffer(segment.buf, dtype=torch.uint8)
        data = self._mapped[name][1]
        shape, itemsize = header.shape, header.dtype.itemsize
        strides = strides[:len(shape)]
        extent = (sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1) * itemsize
        if min(strides) < 0 or offset % itemsize or offset + extent > data.numel():
            raise BadShape(f"a pull of {extent} bytes at {offset} reaches outside segment {name!r}")
        return data[offset:offset + extent + (-extent % itemsize)].view(header.dtype).as_strided(shape, strides)

    def close(self) -> None:
        for segment, _ in self._mapped.values():
            close_mapping(segment)
        self._mapped.clear()


class PullTracker:
    """The sender's pulls not yet acknowledged, and what to call once a group of them is."""

    def __init__(self) -> None:
        self.next_sequence = 0
        self._groups: list[tuple[list[int], Callable[[], None]]] = []
        self._unacked: list[int] = []  # sequence numbers, oldest first

    def has_room(self, ring: Ring) -> bool:
        self.poll(ring)
        return not self._unacked or self.next_sequence - self._unacked[0] < ACK_SLOTS

    def take(self) -> int:
        sequence = self.next_sequence
        self.next_sequence += 1
        self._unacked.append(sequence)
        return sequence

    def when_acked(self, sequences: list[int], on_released: Callable[[], None]) -> None:
        self._groups.append((sequences, on_released))

    def poll(self, ring: Ring, everything: bool = False) -> int:
        """Fire the callbacks of fully acknowledged groups (of all, with `everything`: the receiver closed, so
        nothing reads the sender's memory any more); returns how many pulls are still unacknowledged."""
        self._unacked = [] if everything else [s for s in self._unacked if not ring.acked(s)]
        left = set(self._unacked)
        pending = [(seqs, call) for seqs, call in self._groups if left.intersection(seqs)]
        finished = [call for seqs, call in self._groups if not left.intersection(seqs)]
        self._groups = pending
        for call in finished:
            call()
        return len(self._unacked)
