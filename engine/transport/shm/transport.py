"""Shared-memory transport: one single-producer single-consumer ring per `listen()`, across processes.

The receiver creates the segment (`multiprocessing.shared_memory`, a uuid name) and unlinks it on close;
one sender attaches by name. The segment's layout is in `engine.transport.shm.ring`.

A block viewing memory registered with the transport (`shared_tensors`: the engine's KV cache when it
serves over shm) is not copied into the ring: a pull record names it and the receiver copies it once,
straight from the sender's segment, then acknowledges it (`engine.transport.shm.pull`). Any other block
takes the two-copy path below.

The sender copies each tensor once, straight into the ring (strided sources included), checksumming
stride by stride as it copies; a coalesced frame is at most a quarter of the ring, so the sender fills
one while the receiver drains another. The receiver checks the frame in place and either lends a tensor
viewing the ring (`recv_borrowed`) or copies it once, checksumming as it copies, into a tensor of its
own (`recv`) or one the caller names (`recv_into`: the receiver's own KV blocks).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from multiprocessing.shared_memory import SharedMemory

import numpy as np
import torch

from engine.kv_cache.wire import (
    HEADER_SIZE,
    ExpectedShape,
    KVBlock,
    KVWireError,
    check_destination,
    check_shape,
    decode,
    decode_into,
    padded,
    parse_header,
)
from engine.kv_cache.wire.header import FrameHeader
from engine.transport.base import (
    BorrowedBlock,
    KVReceiver,
    KVSender,
    Placement,
    Transport,
    TransportError,
    TransportSettings,
    ZeroCopyReceiver,
    _no_release,
    new_tensor,
    poll_until,
    split_address,
)
from engine.transport.shm.pull import (
    PULL_BODY_BYTES,
    MappedSegments,
    SharedRegion,
    TensorSpec,
    region_sizes,
    room_for,
    unpack_descriptor,
)
from engine.transport.shm.ring import (
    CAPACITY,
    CONTROL_BYTES,
    FRAME_RECORD,
    PULL_RECORD,
    READ_POS,
    RECEIVER_CLOSED,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    SENDER_CLOSED,
    SENDER_STATE,
    Ring,
    close_mapping,
    record_nbytes,
)
from engine.transport.shm.sender import ShmSender

SCHEME = "shm"
log = logging.getLogger(__name__)


class _Lease:
    """Releases one record once, however often it is called, and never after the receiver closed."""

    def __init__(self, receiver: ShmReceiver, nbytes: int) -> None:
        self._receiver = receiver
        self._nbytes = nbytes
        self._done = False

    def __call__(self) -> None:
        if not self._done:
            self._done = True
            self._receiver.return_lease(self._nbytes)


class _Ack:
    """Acknowledges one pull once, however often it is called (nothing after the receiver closed)."""

    def __init__(self, receiver: ShmReceiver, sequence: int) -> None:
        self._receiver, self._sequence, self._done = receiver, sequence, False

    def __call__(self) -> None:
        if not self._done:
            self._done = True
            self._receiver.acknowledge(self._sequence)


class ShmReceiver(ZeroCopyReceiver):
    def __init__(self, settings: TransportSettings, expected: ExpectedShape | None) -> None:
        super().__init__(expected)
        capacity = padded(settings.shm_ring_bytes)
        self._segment = SharedMemory(f"agentserve-{uuid.uuid4().hex[:16]}", create=True,
                                     size=CONTROL_BYTES + capacity)
        self.name = self._segment.name
        buf = self._segment.buf
        assert buf is not None
        np.frombuffer(buf, dtype=np.uint64, count=CONTROL_BYTES // 8)[CAPACITY] = capacity
        self._ring: Ring | None = Ring(buf)
        self._settings = settings
        self._lent = False
        self._segments = MappedSegments()

    def recv_borrowed(self, timeout_s: float) -> BorrowedBlock | None:
        """The next block viewing the ring (which holds it, and everything after it, until release), or the
        sender's memory for a pull (released to the sender, acknowledged, on release)."""
        record = self._next_free_record(timeout_s)
        if record is None:
            return None
        kind, offset, frame_nbytes = record
        if kind == PULL_RECORD:
            return self._pulled(offset)
        ring = self._live_ring()
        try:
            block = self._counted(lambda: decode(ring.data[offset:offset + frame_nbytes], self.expected))
        except KVWireError:
            self._advance(record_nbytes(frame_nbytes))
            raise
        self._lent = True
        return BorrowedBlock(block, _Lease(self, record_nbytes(frame_nbytes)))

    def recv_held(self, timeout_s: float) -> BorrowedBlock | None:
        """A pull as a view of the sender's memory, held until released; a ring frame copied out at once."""
        record = self._next_free_record(timeout_s)
        if record is None:
            return None
        if record[0] == PULL_RECORD:
            return self._pulled(record[1])
        block = self._take(record, new_tensor)
        return BorrowedBlock(block, _no_release)

    def recv_into(self, place: Placement, timeout_s: float) -> KVBlock | None:
        """The next block copied into `place(header)`: a ring frame (its record released at once), or a pull,
        copied straight from the sender's memory and acknowledged."""
        record = self._next_free_record(timeout_s)
        return None if record is None else self._take(record, place)

    def _take(self, record: tuple[int, int, int], place: Placement) -> KVBlock:
        kind, offset, frame_nbytes = record
        frame = self._live_ring().data[offset:offset + frame_nbytes]
        try:
            if kind == PULL_RECORD:
                return self._counted(lambda: self._pull_into(frame, place))
            return self._counted(lambda: self._decode_into(frame, place))
        finally:
            self._advance(record_nbytes(frame_nbytes))

    def _decode_into(self, frame: memoryview, place: Placement) -> KVBlock:
        header = parse_header(frame)
        check_shape(header, self.expected)
        return decode_into(header, frame[HEADER_SIZE:], place(header), self.expected)

    def _pull_into(self, body: memoryview, place: Placement) -> KVBlock:
        """One copy, sender's memory to `place(header)`, then the ack (no payload checksum: see shm_pull). A
        rejected pull is acknowledged too: nothing will read it."""
        try:
            header, source = self._pull_view(body)
            dest = place(header)
            check_destination(header, dest)
            dest.copy_(source)
        finally:
            self.acknowledge(unpack_descriptor(body)[0])
        return KVBlock(header.layer, header.token_start, header.token_end, header.block_hash, dest)

    def _pulled(self, offset: int) -> BorrowedBlock:
        body = self._live_ring().data[offset:offset + PULL_BODY_BYTES]
        sequence = unpack_descriptor(body)[0]
        try:
            header, source = self._counted(lambda: self._pull_view(body))
        except KVWireError:
            self.acknowledge(sequence)
            raise
        finally:
            self._advance(record_nbytes(PULL_BODY_BYTES))
        block = KVBlock(header.layer, header.token_start, header.token_end, header.block_hash, source)
        return BorrowedBlock(block, _Ack(self, sequence))

    def _pull_view(self, body: memoryview) -> tuple[FrameHeader, torch.Tensor]:
        """The pull's checked header and the block's tensor in the sender's segment (no copy)."""
        header = parse_header(body)
        check_shape(header, self.expected)
        _, name, offset, strides = unpack_descriptor(body)
        return header, self._segments.view(header, name, offset, strides)

    def acknowledge(self, sequence: int) -> None:
        """The sender may reuse the memory pull `sequence` named."""
        if self._ring is not None:
            self._ring.ack(sequence)

    def return_lease(self, nbytes: int) -> None:
        self._advance(nbytes)
        self._lent = False

    def _advance(self, nbytes: int) -> None:
        if self._ring is not None:
            self._ring.set(READ_POS, self._ring.get(READ_POS) + nbytes)

    def close(self) -> None:
        if self._ring is None:
            return
        self._segments.close()
        self._ring.set(RECEIVER_CLOSED, 1)
        self._ring.detach()
        self._ring = None
        close_mapping(self._segment)
        with contextlib.suppress(FileNotFoundError):
            self._segment.unlink()

    def _live_ring(self) -> Ring:
        if self._ring is None:
            raise TransportError(f"{SCHEME}://{self.name} is closed")
        return self._ring

    def _next_free_record(self, timeout_s: float) -> tuple[int, int, int] | None:
        if self._lent:
            raise TransportError("release the borrowed block before receiving the next")
        return self._next_record(time.monotonic() + timeout_s)

    def _next_record(self, deadline: float) -> tuple[int, int, int] | None:
        """(kind, data offset, length) of the next frame or pull, skipping wrap records; None on timeout or
        when the sender has closed and nothing is left."""
        ring = self._live_ring()

        def readable() -> bool:
            return ring.used() > 0 or ring.get(SENDER_STATE) == SENDER_CLOSED

        while (ring.used() > 0 or poll_until(readable, deadline, self._settings.poll_interval_s)) and ring.used():
            offset = ring.get(READ_POS) % ring.capacity
            kind, frame_nbytes = RECORD_HEADER.unpack_from(ring.data, offset)
            if kind in (FRAME_RECORD, PULL_RECORD):
                return kind, offset + RECORD_HEADER_BYTES, frame_nbytes
            self._advance(ring.capacity - offset)
        return None


class ShmTransport(Transport):
    name = SCHEME

    def __init__(self, settings: TransportSettings) -> None:
        super().__init__(settings)
        self._regions: list[SharedRegion] = []

    def shared_tensors(self, specs: Sequence[TensorSpec]) -> list[torch.Tensor] | None:
        """None when /dev/shm has no room for them (its blocks then take the two-copy ring)."""
        nbytes = sum(region_sizes(specs))
        if not room_for(nbytes):
            log.warning("no room for %d bytes of registered KV in /dev/shm: shm transfers copy twice", nbytes)
            return None
        region = SharedRegion(specs)
        self._regions.append(region)
        return list(region.tensors)

    def close(self) -> None:
        for region in self._regions:
            region.close()
        self._regions.clear()

    def listen(self, expected: ExpectedShape | None = None) -> tuple[str, KVReceiver]:
        receiver = ShmReceiver(self.settings, expected)
        return f"{SCHEME}://{receiver.name}", receiver

    def connect(self, address: str) -> KVSender:
        return ShmSender(split_address(address, SCHEME), self.settings, self._regions)
