"""Shared-memory transport: one single-producer single-consumer ring per `listen()`, across processes.

The receiver creates the segment (`multiprocessing.shared_memory`, a uuid name) and unlinks it on close;
one sender attaches by name. The segment's layout is in `engine.transport.shm_ring`.

The sender copies each tensor once, straight into the ring (strided sources included), checksumming
stride by stride as it copies; a coalesced frame is at most a quarter of the ring, so the sender fills
one while the receiver drains another. The receiver checks the frame in place and either lends a tensor
viewing the ring (`recv_borrowed`) or copies it once, checksumming as it copies, into a tensor of its
own (`recv`) or one the caller names (`recv_into`: the receiver's own KV blocks).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from engine.kv_wire import (
    HEADER_SIZE,
    ExpectedShape,
    KVBlock,
    KVWireError,
    check_shape,
    decode,
    decode_into,
    encode_into,
    padded,
    parse_header,
)
from engine.transport.base import (
    BorrowedBlock,
    Buffer,
    KVReceiver,
    KVSender,
    Placement,
    Transport,
    TransportError,
    TransportSettings,
    ZeroCopyReceiver,
    poll_until,
    split_address,
)
from engine.transport.shm_ring import (
    CAPACITY,
    CONTROL_BYTES,
    FRAME_RECORD,
    NO_SENDER,
    READ_POS,
    RECEIVER_CLOSED,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    SENDER_CLOSED,
    SENDER_CONNECTED,
    SENDER_STATE,
    WRAP_RECORD,
    WRITE_POS,
    Ring,
    attach,
    close_mapping,
    record_nbytes,
)

SCHEME = "shm"


class ShmSender(KVSender):
    def __init__(self, name: str, settings: TransportSettings) -> None:
        try:
            self._segment = attach(name)
        except FileNotFoundError:
            raise TransportError(f"no shared-memory ring named {name!r}") from None
        self._ring: Ring | None = Ring(self._segment.buf)
        self._settings = settings
        if self._ring.get(SENDER_STATE) != NO_SENDER or self._ring.get(RECEIVER_CLOSED):
            self._detach()
            raise TransportError(f"ring {name!r} already has a sender or is closed (one sender per listen)")
        self._ring.set(SENDER_STATE, SENDER_CONNECTED)
        self.coalesce_bytes = min(settings.coalesce_bytes, self._ring.capacity // 4 - 2 * RECORD_HEADER_BYTES)

    def send(self, block: KVBlock) -> None:
        frame_nbytes = HEADER_SIZE + padded(block.tensor.numel() * block.tensor.element_size())
        ring, offset = self._reserve(frame_nbytes)
        encode_into(block, ring.data[offset:offset + frame_nbytes], self._settings.checksum)
        self._publish(ring, offset - RECORD_HEADER_BYTES, frame_nbytes)

    def send_frame(self, frame: Buffer) -> None:
        view = memoryview(frame).cast("B")
        ring, offset = self._reserve(view.nbytes)
        ring.data[offset:offset + view.nbytes] = view
        self._publish(ring, offset - RECORD_HEADER_BYTES, view.nbytes)

    def close(self) -> None:
        if self._ring is not None:
            self._ring.set(SENDER_STATE, SENDER_CLOSED)
            self._detach()

    def _detach(self) -> None:
        if self._ring is not None:
            self._ring.detach()
            self._ring = None
            close_mapping(self._segment)

    def _reserve(self, frame_nbytes: int) -> tuple[Ring, int]:
        """Wait for room for one record; returns the ring and the data offset of the record's frame."""
        if self._ring is None:
            raise TransportError("this sender is closed")
        ring = self._ring
        needed = record_nbytes(frame_nbytes)
        if needed > ring.capacity:
            raise TransportError(f"a {frame_nbytes}-byte frame exceeds the {ring.capacity}-byte ring")
        deadline = time.monotonic() + self._settings.send_timeout_s
        offset = ring.get(WRITE_POS) % ring.capacity
        tail = ring.capacity - offset
        if tail < needed:
            self._wait_for_room(ring, tail, deadline)
            RECORD_HEADER.pack_into(ring.data, offset, WRAP_RECORD, 0)
            ring.set(WRITE_POS, ring.get(WRITE_POS) + tail)
            offset = 0
        self._wait_for_room(ring, needed, deadline)
        return ring, offset + RECORD_HEADER_BYTES

    def _wait_for_room(self, ring: Ring, nbytes: int, deadline: float) -> None:
        if ring.capacity - ring.used() >= nbytes and not ring.get(RECEIVER_CLOSED):
            return

        def room_or_closed() -> bool:
            return ring.capacity - ring.used() >= nbytes or bool(ring.get(RECEIVER_CLOSED))

        if not poll_until(room_or_closed, deadline, self._settings.poll_interval_s):
            raise TransportError(f"no room in the ring for {self._settings.send_timeout_s} s (receiver stalled)")
        if ring.get(RECEIVER_CLOSED):
            raise TransportError("the receiver closed the ring")

    @staticmethod
    def _publish(ring: Ring, record_offset: int, frame_nbytes: int) -> None:
        RECORD_HEADER.pack_into(ring.data, record_offset, FRAME_RECORD, frame_nbytes)
        ring.set(WRITE_POS, ring.get(WRITE_POS) + record_nbytes(frame_nbytes))


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

    def recv_borrowed(self, timeout_s: float) -> BorrowedBlock | None:
        """The next block viewing the ring; the ring holds it (and everything after it) until release."""
        if self._lent:
            raise TransportError("release the previous borrowed block before receiving the next")
        record = self._next_record(time.monotonic() + timeout_s)
        if record is None:
            return None
        offset, frame_nbytes = record
        ring = self._live_ring()
        try:
            block = self._counted(lambda: decode(ring.data[offset:offset + frame_nbytes], self.expected))
        except KVWireError:
            self._advance(record_nbytes(frame_nbytes))
            raise
        self._lent = True
        return BorrowedBlock(block, _Lease(self, record_nbytes(frame_nbytes)))

    def recv_into(self, place: Placement, timeout_s: float) -> KVBlock | None:
        """The next frame copied out of the ring into `place(header)`; its record is released at once."""
        if self._lent:
            raise TransportError("release the borrowed block before receiving the next")
        record = self._next_record(time.monotonic() + timeout_s)
        if record is None:
            return None
        offset, frame_nbytes = record
        frame = self._live_ring().data[offset:offset + frame_nbytes]
        try:
            return self._counted(lambda: self._decode_into(frame, place))
        finally:
            self._advance(record_nbytes(frame_nbytes))

    def _decode_into(self, frame: memoryview, place: Placement) -> KVBlock:
        header = parse_header(frame)
        check_shape(header, self.expected)
        return decode_into(header, frame[HEADER_SIZE:], place(header), self.expected)

    def return_lease(self, nbytes: int) -> None:
        self._advance(nbytes)
        self._lent = False

    def _advance(self, nbytes: int) -> None:
        if self._ring is not None:
            self._ring.set(READ_POS, self._ring.get(READ_POS) + nbytes)

    def close(self) -> None:
        if self._ring is None:
            return
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

    def _next_record(self, deadline: float) -> tuple[int, int] | None:
        """(data offset, length) of the next frame, skipping wrap records; None on timeout or when the
        sender has closed and nothing is left."""
        ring = self._live_ring()

        def readable() -> bool:
            return ring.used() > 0 or ring.get(SENDER_STATE) == SENDER_CLOSED

        while (ring.used() > 0 or poll_until(readable, deadline, self._settings.poll_interval_s)) and ring.used():
            offset = ring.get(READ_POS) % ring.capacity
            kind, frame_nbytes = RECORD_HEADER.unpack_from(ring.data, offset)
            if kind == FRAME_RECORD:
                return offset + RECORD_HEADER_BYTES, frame_nbytes
            self._advance(ring.capacity - offset)
        return None


class ShmTransport(Transport):
    name = SCHEME

    def listen(self, expected: ExpectedShape | None = None) -> tuple[str, KVReceiver]:
        receiver = ShmReceiver(self.settings, expected)
        return f"{SCHEME}://{receiver.name}", receiver

    def connect(self, address: str) -> KVSender:
        return ShmSender(split_address(address, SCHEME), self.settings)
