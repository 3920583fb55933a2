"""Sends to a worker that never block the serving process: each command is framed as `multiprocessing`'s
`Connection.send` frames it (a 4-byte big-endian length, then the pickle), so the worker's plain `recv` reads
it, and written with MSG_DONTWAIT; what the socket does not take now waits here, in order, for `flush`. A
worker mid-step reads no commands, so a long prompt's Submit can fill the pipe; a blocking send would then
stall the event loop (and every other request) until the step ends."""

from __future__ import annotations

import collections
import os
import select
import socket
import struct
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

MAX_SHORT_FRAME = 0x7FFFFFFF  # longer payloads take Connection's 64-bit header


def frame(obj: object) -> bytes:
    payload = ForkingPickler.dumps(obj)
    size = len(payload)
    header = struct.pack("!i", size) if size <= MAX_SHORT_FRAME else struct.pack("!iQ", -1, size)
    return b"".join((header, payload))  # one copy of the pickle


class Outbox:
    def __init__(self, conn: Connection) -> None:
        self._socket = socket.socket(fileno=os.dup(conn.fileno()))  # its own fd: closing it leaves conn open
        self._queue: collections.deque[memoryview] = collections.deque()

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def send(self, obj: object) -> None:
        """Queue one command and write what the socket takes; raises OSError when the worker's end is closed."""
        self._queue.append(memoryview(frame(obj)))
        self.flush()

    def flush(self) -> bool:
        """Write queued bytes until the socket is full; True when nothing is left queued."""
        while self._queue:
            head = self._queue[0]
            try:
                written = self._socket.send(head, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
            if written < len(head):
                self._queue[0] = head[written:]
            else:
                self._queue.popleft()
        return True

    def drain(self, deadline: float) -> bool:
        """Block until everything queued is written or the deadline passes (shutting down); True when written."""
        while not self.flush():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([], [self._socket], [], left)
        return True

    def close(self) -> None:
        self._queue.clear()
        self._socket.close()
