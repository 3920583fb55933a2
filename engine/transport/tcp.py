"""TCP transport: sockets marked with the DSCP of their traffic class (configs/qos.yaml, IP_TOS = dscp << 2).

A sender writes frames with `sendmsg` of [header, the tensor's own bytes, padding], so a contiguous
tensor is never copied in user space; `send_many` packs many frames into one call. The receiver
`recv_into`s a preallocated buffer per connection (many frames per system call) and cuts frames from it:
`recv_borrowed` lends a tensor viewing that buffer, `recv` copies it once into a tensor of its own. One
receiver accepts any number of senders, taking turns; each connection's frames arrive in order. A frame
whose header cannot be trusted (bad magic, version or header checksum), or whose rest does not arrive
(EOF, or a stall past frame_timeout_s), drops its connection: that stream has lost its framing.
"""

from __future__ import annotations

import os
import selectors
import socket
import time
from collections.abc import Iterable

from engine.kv_wire import (
    HEADER_SIZE,
    BadHeader,
    ExpectedShape,
    KVBlock,
    KVWireError,
    TruncatedFrame,
    decode_payload,
    encode,
    parse_header,
)
from engine.qos import load_qos_config
from engine.transport.base import (
    BorrowedBlock,
    Buffer,
    KVReceiver,
    KVSender,
    Transport,
    TransportError,
    TransportSettings,
    ZeroCopyReceiver,
    split_address,
)

SCHEME = "tcp"
IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


def traffic_tos(settings: TransportSettings) -> int:
    return load_qos_config(settings.qos_config).traffic_class(settings.traffic_class).tos


def mark_socket(sock: socket.socket, tos: int) -> None:
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
    else:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)


def socket_tos(sock: socket.socket) -> int:
    if sock.family == socket.AF_INET6:
        return sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS)
    return sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)


def format_address(host: str, port: int, scheme: str = SCHEME) -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def parse_address(address: str, scheme: str = SCHEME) -> tuple[str, int]:
    host, _, port = split_address(address, scheme).rpartition(":")
    if not host or not port.isdigit():
        raise TransportError(f"{address!r} is not {scheme}://HOST:PORT")
    return host.strip("[]"), int(port)


def _unsent(views: list[memoryview], sent: int) -> list[memoryview]:
    index = 0
    while index < len(views) and sent >= views[index].nbytes:
        sent -= views[index].nbytes
        index += 1
    rest = views[index:]
    if rest and sent:
        rest[0] = rest[0][sent:]
    return rest


class TcpSender(KVSender):
    def __init__(self, address: str, settings: TransportSettings) -> None:
        self._settings = settings
        try:
            self.sock = socket.create_connection(parse_address(address), timeout=settings.connect_timeout_s)
        except OSError as error:
            raise TransportError(f"cannot connect to {address}: {error}") from error
        mark_socket(self.sock, traffic_tos(settings))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(settings.send_timeout_s)

    def send(self, block: KVBlock) -> None:
        self._send_parts(encode(block, self._settings.checksum).parts)

    def send_many(self, blocks: Iterable[KVBlock]) -> None:
        parts: list[Buffer] = []
        for block in blocks:
            parts += encode(block, self._settings.checksum).parts
            if len(parts) + 3 > IOV_MAX:
                self._send_parts(parts)
                parts = []
        self._send_parts(parts)

    def send_frame(self, frame: Buffer) -> None:
        self._send_parts([frame])

    def close(self) -> None:
        self.sock.close()

    def _send_parts(self, parts: Iterable[Buffer]) -> None:
        views = [memoryview(part).cast("B") for part in parts]
        try:
            while views:
                views = _unsent(views, self.sock.sendmsg(views[:IOV_MAX]))
        except OSError as error:
            raise TransportError(f"send failed: {error}") from error


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
            got = self.sock.recv_into(self.view[self.end:])
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


class TcpReceiver(ZeroCopyReceiver):
    """Borrowed blocks view the connection's receive buffer; release one before receiving the next."""

    def __init__(self, settings: TransportSettings, expected: ExpectedShape | None) -> None:
        super().__init__(expected)
        self._settings = settings
        self._tos = traffic_tos(settings)
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        self.listener = socket.create_server((settings.host, settings.port), family=family, backlog=128)
        mark_socket(self.listener, self._tos)
        self.address = format_address(settings.host, self.listener.getsockname()[1])
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ)
        self._streams: list[Stream] = []
        self._lent = False

    @property
    def connections(self) -> list[socket.socket]:
        return [stream.sock for stream in self._streams]

    def recv_borrowed(self, timeout_s: float) -> BorrowedBlock | None:
        if self._lent:
            raise TransportError("release the previous borrowed block before receiving the next")
        deadline = time.monotonic() + timeout_s
        while (stream := self._buffered_stream()) is None:
            if not self._read_ready(deadline):
                return None
        block = self._counted(lambda: self._cut_frame(stream))
        self._lent = True
        return BorrowedBlock(block, self._return_lease)

    def close(self) -> None:
        for stream in list(self._streams):
            self._drop(stream)
        self._selector.close()
        self.listener.close()

    def _return_lease(self) -> None:
        self._lent = False

    def _buffered_stream(self) -> Stream | None:
        """A stream with unread bytes, taking turns (it moves to the back)."""
        for index, stream in enumerate(self._streams):
            if stream.unread:
                self._streams.append(self._streams.pop(index))
                return stream
        return None

    def _read_ready(self, deadline: float) -> bool:
        """Accept new senders and read what arrived; False once the deadline passed with nothing to read."""
        events = self._selector.select(max(deadline - time.monotonic(), 0))
        for key, _ in events:
            if key.fileobj is self.listener:
                self._accept()
                continue
            stream: Stream = key.data
            stream.read_some()
            if stream.eof and not stream.unread:  # closed between frames
                self._drop(stream)
        return bool(events) or time.monotonic() < deadline

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        mark_socket(conn, self._tos)
        conn.settimeout(self._settings.frame_timeout_s)
        stream = Stream(conn, self._settings.tcp_buffer_bytes)
        self._selector.register(conn, selectors.EVENT_READ, stream)
        self._streams.append(stream)

    def _cut_frame(self, stream: Stream) -> KVBlock:
        """The next frame, read whole; a header that cannot be trusted or a cut drops the connection."""
        try:
            stream.fill_to(HEADER_SIZE)
            header = parse_header(stream.view[stream.start:stream.start + HEADER_SIZE])
            if header.frame_nbytes > self._settings.max_frame_bytes:
                raise BadHeader(f"a {header.frame_nbytes}-byte frame exceeds max_frame_bytes")
            stream.fill_to(header.frame_nbytes)
        except KVWireError:
            self._drop(stream)
            raise
        return decode_payload(header, stream.take(header.frame_nbytes)[HEADER_SIZE:], self.expected)

    def _drop(self, stream: Stream) -> None:
        self._selector.unregister(stream.sock)
        self._streams.remove(stream)
        stream.sock.close()


class TcpTransport(Transport):
    name = SCHEME

    def listen(self, expected: ExpectedShape | None = None) -> tuple[str, KVReceiver]:
        receiver = TcpReceiver(self.settings, expected)
        return receiver.address, receiver

    def connect(self, address: str) -> KVSender:
        return TcpSender(address, self.settings)
