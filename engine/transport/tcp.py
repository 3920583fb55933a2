"""TCP transport: sockets marked with the DSCP of their traffic class (configs/qos.yaml, IP_TOS = dscp << 2).

A sender writes frames with `sendmsg` of [header, the tensor's own bytes, padding], so a contiguous
tensor is never copied in user space; `send_many` packs many frames into one call. The receiver reads a
header, then `recv_into`s the payload straight into a tensor allocated for it, which the returned block
owns (no further copy). One receiver accepts any number of senders; each connection's frames arrive in
order. A frame whose header cannot be trusted (bad magic, version or header checksum), or whose rest
does not arrive (EOF or a stall past frame_timeout_s), drops its connection: its stream has lost framing.
"""

from __future__ import annotations

import os
import selectors
import socket
import time
from collections.abc import Iterable

import torch

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
    Buffer,
    KVReceiver,
    KVSender,
    Transport,
    TransportError,
    TransportSettings,
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


class TcpReceiver(KVReceiver):
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
        self.connections: list[socket.socket] = []

    def recv(self, timeout_s: float) -> KVBlock | None:
        deadline = time.monotonic() + timeout_s
        while True:
            for key, _ in self._selector.select(max(deadline - time.monotonic(), 0)):
                block = self._on_readable(key.fileobj)  # type: ignore[arg-type]
                if block is not None:
                    return block
            if time.monotonic() >= deadline:
                return None

    def close(self) -> None:
        for conn in list(self.connections):
            self._drop(conn)
        self._selector.close()
        self.listener.close()

    def _on_readable(self, sock: socket.socket) -> KVBlock | None:
        if sock is self.listener:
            conn, _ = self.listener.accept()
            mark_socket(conn, self._tos)
            self._selector.register(conn, selectors.EVENT_READ)
            self.connections.append(conn)
            return None
        header = memoryview(bytearray(HEADER_SIZE))
        try:
            sock.settimeout(self._settings.frame_timeout_s)
            got = sock.recv_into(header)
        except OSError:
            got = 0
        if got == 0:  # closed between frames
            self._drop(sock)
            return None
        return self._counted(lambda: self._finish_frame(sock, header, got))

    def _finish_frame(self, sock: socket.socket, header_buf: memoryview, got: int) -> KVBlock:
        try:
            self._recv_exact(sock, header_buf[got:])
            header = parse_header(header_buf)
            if header.frame_nbytes > self._settings.max_frame_bytes:
                raise BadHeader(f"a {header.frame_nbytes}-byte frame exceeds max_frame_bytes")
            payload = torch.empty(header.frame_nbytes - HEADER_SIZE, dtype=torch.uint8).numpy().data
            self._recv_exact(sock, payload)
        except KVWireError:
            self._drop(sock)
            raise
        return decode_payload(header, payload, self.expected)

    @staticmethod
    def _recv_exact(sock: socket.socket, view: memoryview) -> None:
        while view.nbytes:
            try:
                got = sock.recv_into(view)
            except OSError as error:  # a timeout included: the rest stalled
                raise TruncatedFrame(f"transfer cut: {error or 'stalled'}") from error
            if got == 0:
                raise TruncatedFrame("transfer cut: the sender closed mid-frame")
            view = view[got:]

    def _drop(self, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        self.connections.remove(conn)
        conn.close()


class TcpTransport(Transport):
    name = SCHEME

    def listen(self, expected: ExpectedShape | None = None) -> tuple[str, KVReceiver]:
        receiver = TcpReceiver(self.settings, expected)
        return receiver.address, receiver

    def connect(self, address: str) -> KVSender:
        return TcpSender(address, self.settings)
