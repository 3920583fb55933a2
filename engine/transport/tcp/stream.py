"""One TCP connection's receive side: a buffer that headers and small frames are read into, many per
system call, and the direct path that reads a payload from the socket into its destination."""

from __future__ import annotations

import socket

from engine.kv_cache.wire import PayloadSink, TruncatedFrame

READ_AHEAD = 64 << 10  # bytes read into the buffer beyond what the reader waits for


class Stream:
    """One connection's receive buffer: `recv_into` appends at `end`, frames are cut from `start`."""

    def __init__(self, sock: socket.socket, nbytes: int) -> None:
        self.sock = sock
        self.buffer = bytearray(nbytes)
        self.view = memoryview(self.buffer)
        self.start = self.end = 0
        self.eof = False

    @property
    def unread(self) -> int:
        return self.end - self.start

    def read_some(self) -> None:
        """One `recv_into` (the socket is readable) into the free tail; marks EOF."""
        if self.end == len(self.buffer) and self.start:
            self.make_room(self.unread + 1)
        if self.end < len(self.buffer):
            got = self.sock.recv_into(self.view[self.end:self.end + READ_AHEAD])
            self.end += got
            self.eof = got == 0

    def fill_to(self, nbytes: int) -> None:
        """Wait until `nbytes` unread bytes are here; a stall past the socket timeout or an EOF cuts."""
        if self.unread >= nbytes:
            return
        self.make_room(nbytes)
        while self.unread < nbytes:
            try:
                got = self.sock.recv_into(self.view[self.end:])
            except OSError as error:  # a timeout included: the rest stalled
                raise TruncatedFrame(f"transfer cut: {error or 'stalled'}") from error
            if got == 0:
                raise TruncatedFrame("transfer cut: the sender closed mid-frame")
            self.end += got

    def read_into(self, sink: PayloadSink) -> None:
        """Fill the sink: first from the buffer, then from the socket straight into the sink's memory."""
        sink.write(self.take(min(self.unread, sink.remaining)))
        while sink.remaining:
            room = sink.room(sink.remaining)  # as much as the socket has: each piece is checksummed on arrival
            try:
                got = self.sock.recv_into(room)
            except OSError as error:
                raise TruncatedFrame(f"transfer cut: {error or 'stalled'}") from error
            if got == 0:
                raise TruncatedFrame("transfer cut: the sender closed mid-frame")
            sink.landed(room[:got])

    def make_room(self, nbytes: int) -> None:
        """Room for `nbytes` from `start`: the unread bytes move to the front, into a larger buffer if needed."""
        if self.start + nbytes <= len(self.buffer):
            return
        unread = self.view[self.start:self.end]
        if nbytes > len(self.buffer):
            self.buffer = bytearray(nbytes)
            self.view = memoryview(self.buffer)
        self.view[:unread.nbytes] = unread
        self.start, self.end = 0, unread.nbytes

    def take(self, nbytes: int) -> memoryview:
        """The next `nbytes`, viewed in place: valid until the next read into this buffer."""
        frame = self.view[self.start:self.start + nbytes]
        self.start += nbytes
        if self.start == self.end:
            self.start = self.end = 0
        return frame
