"""A shared-memory ring's segment: its layout, and views of it from either side.

Segment layout:

    offset  width  field
         0      8  write position   u64, bytes the sender has published, ever
        64      8  read position    u64, bytes the receiver has released, ever
       128      8  sender state     u64: 0 none yet, 1 connected, 2 closed
       136      8  receiver state   u64: 0 open, 1 closed
       144      8  capacity         u64, bytes of the data area (a multiple of 64)
       256  32768  ack table        ACK_SLOTS u64: slot s % ACK_SLOTS holds s + 1 once the receiver is done
                                    with pull s (the sender's memory it named may be reused)
     33024      -  data area

The data area holds records at 64-byte aligned offsets: a 64-byte record header (u64 kind: 1 frame,
2 wrap, 3 pull: a descriptor of registered sender memory, see `engine.transport.shm.pull`; u64 frame
length), then the frame padded to 64 bytes. A record never straddles the end: the
sender fills the tail with a wrap record and starts over at offset 0. Positions are aligned 8-byte
stores made after the bytes they publish (x86-64 keeps stores in order; weaker CPUs would need a fence).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import sys
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.kv_cache.wire import padded

ACK_SLOTS = 4096  # the most pulls a sender keeps unacknowledged at once
CONTROL_BYTES = 256 + 8 * ACK_SLOTS
RECORD_HEADER = struct.Struct("=QQ")
RECORD_HEADER_BYTES = 64
FRAME_RECORD, WRAP_RECORD, PULL_RECORD = 1, 2, 3
NO_SENDER, SENDER_CONNECTED, SENDER_CLOSED = 0, 1, 2
WRITE_POS, READ_POS, SENDER_STATE, RECEIVER_CLOSED, CAPACITY = 0, 8, 16, 17, 18  # u64 indices


def record_nbytes(frame_nbytes: int) -> int:
    return RECORD_HEADER_BYTES + padded(frame_nbytes)


class Ring:
    """Views of one mapped segment: the control words and the data area."""

    def __init__(self, buf: memoryview) -> None:
        self.control: npt.NDArray[np.uint64] = np.frombuffer(buf, dtype=np.uint64, count=CONTROL_BYTES // 8)
        self.acks = self.control[256 // 8:]
        self.capacity = int(self.control[CAPACITY])
        self.data = buf[CONTROL_BYTES:CONTROL_BYTES + self.capacity]

    def get(self, index: int) -> int:
        return int(self.control[index])

    def set(self, index: int, value: int) -> None:
        self.control[index] = value

    def used(self) -> int:
        return self.get(WRITE_POS) - self.get(READ_POS)

    def ack(self, sequence: int) -> None:
        self.acks[sequence % ACK_SLOTS] = sequence + 1

    def acked(self, sequence: int) -> bool:
        return int(self.acks[sequence % ACK_SLOTS]) == sequence + 1

    def detach(self) -> None:
        self.data.release()
        del self.control, self.acks


class AttachedSegment:
    """An existing segment, mapped without the resource tracker: before Python 3.13 attaching registers it,
    and a tracker outside the receiver's process tree would unlink it when this process exits."""

    def __init__(self, name: str) -> None:
        import _posixshmem

        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            self._mmap = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)

    def close(self) -> None:
        self.buf.release()
        self._mmap.close()


def attach(name: str) -> Any:
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)
    return AttachedSegment(name)


def close_mapping(segment: Any) -> None:
    with contextlib.suppress(BufferError):  # a borrowed tensor still views it: unmapped when that dies
        segment.close()
