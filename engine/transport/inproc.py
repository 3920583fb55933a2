"""In-process transport: frames through a queue, for tests and a colocated engine.

Frames are encoded and copied once into the queue, so the receiver runs every wire check a remote one
would. Addresses are only meaningful to the transport object that issued them.
"""

from __future__ import annotations

import queue
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.kv_cache.wire import ExpectedShape, KVBlock, decode, encode
from engine.transport.base import (
    Buffer,
    KVReceiver,
    KVSender,
    Transport,
    TransportError,
    TransportSettings,
    split_address,
)

SCHEME = "inproc"


@dataclass
class Channel:
    address: str
    frames: queue.SimpleQueue[bytearray] = field(default_factory=queue.SimpleQueue)
    is_open: bool = True


class InprocSender(KVSender):
    def __init__(self, channel: Channel, settings: TransportSettings) -> None:
        self._channel = channel
        self._settings = settings
        self.coalesce_bytes = settings.coalesce_bytes

    def send(self, block: KVBlock) -> None:
        self.send_frame(encode(block, self._settings.checksum).tobytes())

    def send_frame(self, frame: Buffer) -> None:
        if not self._channel.is_open:
            raise TransportError(f"{self._channel.address} is closed")
        self._channel.frames.put(bytearray(frame))

    def close(self) -> None:
        return None


class InprocReceiver(KVReceiver):
    def __init__(self, channel: Channel, expected: ExpectedShape | None, forget: Callable[[], object]) -> None:
        super().__init__(expected)
        self._channel = channel
        self._forget = forget

    def recv(self, timeout_s: float) -> KVBlock | None:
        try:
            frame = self._channel.frames.get(timeout=timeout_s)
        except queue.Empty:
            return None
        return self._counted(lambda: decode(frame, self.expected))

    def close(self) -> None:
        self._channel.is_open = False
        self._forget()


class InprocTransport(Transport):
    name = SCHEME

    def __init__(self, settings: TransportSettings) -> None:
        super().__init__(settings)
        self._channels: dict[str, Channel] = {}

    def listen(self, expected: ExpectedShape | None = None) -> tuple[str, KVReceiver]:
        channel = Channel(f"{SCHEME}://{uuid.uuid4().hex}")
        self._channels[channel.address] = channel
        return channel.address, InprocReceiver(channel, expected,
                                               lambda: self._channels.pop(channel.address, None))

    def connect(self, address: str) -> KVSender:
        split_address(address, SCHEME)
        channel = self._channels.get(address)
        if channel is None or not channel.is_open:
            raise TransportError(f"nothing listens at {address} in this transport")
        return InprocSender(channel, self.settings)
