"""The sending side of the shared-memory transport (`engine.transport.shm.transport`): frames copied into the ring,
or, for blocks in registered memory, pull records naming them (`engine.transport.shm.pull`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from engine.kv_cache.wire import HEADER_SIZE, KVBlock, coalesce, encode_into, padded
from engine.transport.base import Buffer, KVSender, TransportError, TransportSettings, poll_until
from engine.transport.shm.pull import PULL_BODY_BYTES, PullTracker, SharedRegion, pack_pull
from engine.transport.shm.ring import (
    FRAME_RECORD,
    NO_SENDER,
    PULL_RECORD,
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


class ShmSender(KVSender):
    def __init__(self, name: str, settings: TransportSettings, regions: Sequence[SharedRegion] = ()) -> None:
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
        self._regions, self._pulls = regions, PullTracker()
        self.coalesce_bytes = min(settings.coalesce_bytes, self._ring.capacity // 4 - 2 * RECORD_HEADER_BYTES)

    def send(self, block: KVBlock) -> None:
        self._send(block)

    def send_many(self, blocks: Iterable[KVBlock], on_released: Callable[[], None] | None = None) -> None:
        """Blocks in registered memory are joined only where they are adjacent there, and sent by reference."""
        pulls = [pull for block in coalesce(blocks, self.coalesce_bytes, copy=not self._regions)
                 if (pull := self._send(block)) is not None]
        if on_released is not None:
            self._pulls.when_acked(pulls, on_released)
        self.poll()

    def poll(self) -> int:
        if self._ring is None:
            return 0
        return self._pulls.poll(self._ring, everything=bool(self._ring.get(RECEIVER_CLOSED)))

    def _send(self, block: KVBlock) -> int | None:
        """Send by reference when the block lies in registered memory and the ack table has room (its
        sequence number), else through the ring (None)."""
        for region in self._regions:
            offset = region.offset_of(block.tensor)
            if offset is not None and self._ring is not None and self._pulls.has_room(self._ring):
                ring, at = self._reserve(PULL_BODY_BYTES)
                sequence = self._pulls.take()
                pack_pull(block, sequence, region, offset, self._settings.checksum, ring.data[at:at + PULL_BODY_BYTES])
                self._publish(ring, at - RECORD_HEADER_BYTES, PULL_BODY_BYTES, PULL_RECORD)
                return sequence
        self._send_copy(block)
        return None

    def _send_copy(self, block: KVBlock) -> None:
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
            self.poll()  # pulls still unacknowledged keep their memory held: the receiver may yet read it
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
    def _publish(ring: Ring, record_offset: int, frame_nbytes: int, kind: int = FRAME_RECORD) -> None:
        RECORD_HEADER.pack_into(ring.data, record_offset, kind, frame_nbytes)
        ring.set(WRITE_POS, ring.get(WRITE_POS) + record_nbytes(frame_nbytes))
