"""TCP transport: sockets marked with the DSCP of their traffic class (configs/qos.yaml, IP_TOS = dscp << 2).

A sender writes frames with `sendmsg` of [header, the tensor's own bytes, padding], so a tensor (a strided
layer slice included) is never copied in user space; `send_many` joins a layer's consecutive blocks into
one frame and packs many frames into one call. The receiver reads headers and small frames into a
preallocated buffer per connection (many frames per system call, at most READ_AHEAD bytes ahead of what
it has asked for): `recv_borrowed` lends a tensor viewing that buffer; `recv` and `recv_into` read the
payload from the socket straight into the destination tensor (a new one, or the receiver's own blocks),
checksumming each piece as it lands. One receiver accepts any number of senders, taking turns; each
connection's frames arrive in order. A frame whose header cannot be trusted (bad magic, version or header
checksum), or whose rest does not arrive (EOF, or a stall past frame_timeout_s), drops its connection:
that stream has lost its framing.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from engine.kv_cache.wire import (
    ALIGNMENT,
    HEADER_SIZE,
    BadChecksum,
    BadHeader,
    ExpectedShape,
    FrameHeader,
    KVBlock,
    KVWireError,
    PayloadSink,
    check_destination,
    check_shape,
    coalesce,
    decode_payload,
    destination_segments,
    encode,
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
    split_address,
)
from engine.transport.qos import load_qos_config
from engine.transport.tcp.stream import Stream

SCHEME = "tcp"
T = TypeVar("T")
IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024
TIMEVAL = struct.Struct("@ll")  # struct timeval: seconds, microseconds


def traffic_tos(settings: TransportSettings) -> int:
    return load_qos_config(settings.qos_config).traffic_class(settings.traffic_class).tos


def mark_socket(sock: socket.socket, tos: int) -> None:
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
    else:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)


def kernel_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    """A blocking socket whose sends or receives give up after `seconds` (SO_SNDTIMEO / SO_RCVTIMEO, an
    OSError then): unlike Python's own timeout, it costs no poll() before every call."""
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, option, TIMEVAL.pack(int(seconds), int(seconds % 1 * 1_000_000)))


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
        kernel_timeout(self.sock, socket.SO_SNDTIMEO, settings.send_timeout_s)
        self.coalesce_bytes = min(settings.coalesce_bytes, settings.max_frame_bytes - HEADER_SIZE - ALIGNMENT)

    def send(self, block: KVBlock) -> None:
        self._send_parts(encode(block, self._settings.checksum).parts)

    def send_many(self, blocks: Iterable[KVBlock], on_released: Callable[[], None] | None = None) -> None:
        parts: list[Buffer] = []
        for block in coalesce(blocks, self.coalesce_bytes):
            parts += encode(block, self._settings.checksum).parts
            if len(parts) + 3 > IOV_MAX:
                self._send_parts(parts)
                parts = []
        self._send_parts(parts)
        if on_released is not None:
            on_released()

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

    def recv_into(self, place: Placement, timeout_s: float) -> KVBlock | None:
        if self._lent:
            raise TransportError("release the borrowed block before receiving the next")
        deadline = time.monotonic() + timeout_s
        while (stream := self._buffered_stream()) is None:
            if not self._read_ready(deadline):
                return None
        return self._counted(lambda: self._read_frame_into(stream, place))

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
        kernel_timeout(conn, socket.SO_RCVTIMEO, self._settings.frame_timeout_s)
        stream = Stream(conn, self._settings.tcp_buffer_bytes)
        self._selector.register(conn, selectors.EVENT_READ, stream)
        self._streams.append(stream)

    def _cut_frame(self, stream: Stream) -> KVBlock:
        """The next frame, read whole; a header that cannot be trusted or a cut drops the connection."""
        header = self._dropping_on_error(stream, lambda: self._read_header(stream, fill_frame=True))
        return decode_payload(header, stream.take(header.frame_nbytes)[HEADER_SIZE:], self.expected)

    def _read_header(self, stream: Stream, fill_frame: bool) -> FrameHeader:
        stream.fill_to(HEADER_SIZE)
        header = parse_header(stream.view[stream.start:stream.start + HEADER_SIZE])
        if header.frame_nbytes > self._settings.max_frame_bytes:
            raise BadHeader(f"a {header.frame_nbytes}-byte frame exceeds max_frame_bytes")
        if fill_frame:
            stream.fill_to(header.frame_nbytes)
        return header

    def _dropping_on_error(self, stream: Stream, read: Callable[[], T]) -> T:
        try:
            return read()
        except (KVWireError, OSError):
            self._drop(stream)
            raise

    def _read_frame_into(self, stream: Stream, place: Placement) -> KVBlock:
        """The payload goes from the socket into its destination; a rejected frame is skipped whole."""
        header = self._dropping_on_error(stream, lambda: self._read_header(stream, fill_frame=False))
        try:
            check_shape(header, self.expected)
            dest = place(header)
            check_destination(header, dest)
        except KVWireError:
            self._dropping_on_error(stream, lambda: stream.fill_to(header.frame_nbytes))
            stream.take(header.frame_nbytes)
            raise
        segments = destination_segments(dest)
        if segments is None:  # too fragmented to receive into: staged in the buffer
            self._dropping_on_error(stream, lambda: stream.fill_to(header.frame_nbytes))
            dest.copy_(decode_payload(header, stream.take(header.frame_nbytes)[HEADER_SIZE:]).tensor)
        else:
            stream.take(HEADER_SIZE)
            sink = PayloadSink(segments, header.checksum_kind)
            self._dropping_on_error(stream, lambda: self._finish_frame(stream, sink, header))
            if sink.value != header.payload_checksum:
                raise BadChecksum(f"payload checksum mismatch (layer {header.layer}, tokens {header.token_start}..)")
        return KVBlock(header.layer, header.token_start, header.token_end, header.block_hash, dest)

    @staticmethod
    def _finish_frame(stream: Stream, sink: PayloadSink, header: FrameHeader) -> None:
        stream.read_into(sink)
        padding = header.frame_nbytes - HEADER_SIZE - header.payload_nbytes
        stream.fill_to(padding)
        stream.take(padding)

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
