"""The one interface every KV transport implements, and the settings they share.

A receiver listens first and publishes its address; a sender connects to the address and ships Layer
Blocks as `engine.kv_cache.wire` frames; `send_many` joins a layer's consecutive blocks into one frame (up to
`coalesce_bytes`). A receiver checks every frame (magic, version, checksums, shape), counts it in
`counters`, and raises the `KVWireError` of a rejected one, which the decode side answers by recomputing
that KV. `recv` returns a block that owns its memory; `recv_borrowed` may hand out a view into the
transport's own buffer (zero copy), valid until it is released; `recv_into` copies the payload straight
into a tensor the caller names for the frame (its KV blocks), checksumming as it copies; `recv_held` hands
out blocks the caller may keep, many at once, until it releases each.

Sending by reference (shm only, `engine.transport.shm.pull`): a transport that can register memory hands
out tensors there (`shared_tensors`); a block viewing them travels as a small descriptor and the receiver
copies it once, straight from the sender's memory. Such a block's memory must stay untouched until the
receiver releases it: `send_many`'s `on_released` says when (at once for every other transport, whose send
copies the bytes), as the sender `poll`s.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from engine.kv_cache.wire import (
    DEFAULT_CHECKSUM,
    ChecksumKind,
    ExpectedShape,
    FrameHeader,
    KVBlock,
    KVWireError,
    WireCounters,
    check_destination,
    coalesce,
    header_for,
)

Buffer = bytes | bytearray | memoryview
Decoded = TypeVar("Decoded")
Placement = Callable[[FrameHeader], torch.Tensor]  # a checked header -> the tensor its payload goes into


class TransportError(Exception):
    """The connection itself failed: peer gone, no room before the deadline, address unusable."""


class TransportSettings(BaseModel):
    """Knobs of every transport; the engine's settings nest one of these."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    traffic_class: str = "kv"  # a class of configs/qos.yaml: sets the DSCP mark (tcp) and service level (rdma)
    qos_config: str | None = None  # path of the QoS YAML; None: configs/qos.yaml
    host: str = "127.0.0.1"  # where tcp and the rdma bootstrap listen
    port: int = Field(default=0, ge=0, le=65535)  # 0: an ephemeral port
    checksum: ChecksumKind = DEFAULT_CHECKSUM
    connect_timeout_s: float = Field(default=5.0, gt=0)
    send_timeout_s: float = Field(default=10.0, gt=0)  # a sender waiting for room longer than this fails
    frame_timeout_s: float = Field(default=5.0, gt=0)  # a frame whose rest stalls longer than this is cut
    max_frame_bytes: int = Field(default=1 << 30, gt=0)
    coalesce_bytes: int = Field(default=16 << 20, ge=0)  # most payload bytes send_many joins into one frame
    shm_ring_bytes: int = Field(default=64 << 20, ge=1 << 16)
    tcp_buffer_bytes: int = Field(default=4 << 20, ge=1 << 12)  # a tcp connection's receive buffer
    poll_interval_s: float = Field(default=0.0005, gt=0)  # longest sleep between polls of a ring or queue
    rdma_device: str | None = None  # None: the first device
    rdma_port: int = Field(default=1, ge=1)
    rdma_gid_index: int = Field(default=0, ge=0)
    rdma_region_bytes: int = Field(default=64 << 20, gt=0)
    rdma_max_frame_bytes: int = Field(default=1 << 20, gt=0)  # slot size of the registered region


@dataclass
class BorrowedBlock:
    """A received block whose tensor may view the transport's buffer; `release` hands the room back."""

    block: KVBlock
    release: Callable[[], None]

    def __enter__(self) -> KVBlock:
        return self.block

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.release()


def _no_release() -> None:
    return None


class KVSender(ABC):
    coalesce_bytes: int = 0  # set by each transport: its settings' limit, or less where its frames must fit

    @abstractmethod
    def send(self, block: KVBlock) -> None: ...

    @abstractmethod
    def send_frame(self, frame: Buffer) -> None:
        """Ship bytes that are already one encoded frame, as they are (relays; tests of rejection)."""

    @abstractmethod
    def close(self) -> None: ...

    def send_many(self, blocks: Iterable[KVBlock], on_released: Callable[[], None] | None = None) -> None:
        """Send the blocks in order, a layer's consecutive ones joined into one frame (`kv_wire.coalesce`);
        `on_released` is called once the receiver no longer reads the blocks' memory (here: at once)."""
        for block in coalesce(blocks, self.coalesce_bytes):
            self.send(block)
        if on_released is not None:
            on_released()

    def poll(self) -> int:
        """Call the `on_released` of blocks the receiver is done with; returns how many sends by reference
        it may still read."""
        return 0

    def flush(self, timeout_s: float) -> bool:
        """Wait until the receiver reads none of this sender's memory (False: not within timeout_s)."""
        return poll_until(lambda: self.poll() == 0, time.monotonic() + timeout_s, 0.0005)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


class KVReceiver(ABC):
    def __init__(self, expected: ExpectedShape | None) -> None:
        self.expected = expected
        self.counters = WireCounters()

    @abstractmethod
    def recv(self, timeout_s: float) -> KVBlock | None:
        """The next block, owning its memory; None when none arrives within timeout_s."""

    @abstractmethod
    def close(self) -> None: ...

    def recv_borrowed(self, timeout_s: float) -> BorrowedBlock | None:
        block = self.recv(timeout_s)
        return None if block is None else BorrowedBlock(block, _no_release)

    def recv_held(self, timeout_s: float) -> BorrowedBlock | None:
        """The next block, to keep as long as the caller needs, many at once, then release: a view of the
        sender's memory where the block was sent by reference (release lets the sender reuse it), else a
        block owning its memory (release does nothing)."""
        block = self.recv(timeout_s)
        return None if block is None else BorrowedBlock(block, _no_release)

    def recv_into(self, place: Placement, timeout_s: float) -> KVBlock | None:
        """The next block, its payload copied into `place(header)` (the header's shape and dtype, a strided view
        of the receiver's blocks included); None on timeout. A frame rejected after its payload started landing
        leaves those bytes in the destination: the receiver recomputes that KV."""
        borrowed = self.recv_borrowed(timeout_s)
        if borrowed is None:
            return None
        with borrowed as block:
            header = header_for(block, DEFAULT_CHECKSUM, 0)
            dest = place(header)
            try:
                check_destination(header, dest)
            except KVWireError as error:
                self.counters.accepted -= 1  # counted as it arrived, rejected after all
                self.counters.reject(error)
                raise
            dest.copy_(block.tensor)
        return KVBlock(block.layer, block.token_start, block.token_end, block.block_hash, dest)

    def _counted(self, decode: Callable[[], Decoded]) -> Decoded:
        try:
            block = decode()
        except KVWireError as error:
            self.counters.reject(error)
            raise
        self.counters.accepted += 1
        return block

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def new_tensor(header: FrameHeader) -> torch.Tensor:
    return torch.empty(header.shape, dtype=header.dtype)


class ZeroCopyReceiver(KVReceiver):
    """A receiver whose blocks view its own buffer: `recv` copies each one once into a tensor it owns."""

    @abstractmethod
    def recv_borrowed(self, timeout_s: float) -> BorrowedBlock | None: ...

    def recv(self, timeout_s: float) -> KVBlock | None:
        return self.recv_into(new_tensor, timeout_s)


class Transport(ABC):
    name: str

    def __init__(self, settings: TransportSettings) -> None:
        self.settings = settings

    @abstractmethod
    def listen(self, expected: ExpectedShape | None = None) -> tuple[str, KVReceiver]:
        """A receiver and the address a sender connects to; `expected` narrows the shapes it accepts."""

    @abstractmethod
    def connect(self, address: str) -> KVSender: ...

    def shared_tensors(self, specs: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> list[torch.Tensor] | None:
        """Zeroed tensors of these shapes and dtypes in memory registered with this transport, whose views its
        senders send by reference (one copy, by the receiver); None where the transport cannot."""
        return None

    def close(self) -> None:  # noqa: B027 (most transports register nothing)
        """Give back what the transport registered (its receivers and senders close on their own)."""


def split_address(address: str, scheme: str) -> str:
    prefix = f"{scheme}://"
    if not address.startswith(prefix):
        raise TransportError(f"{address!r} is not a {scheme} address ({prefix}...)")
    return address[len(prefix):]


def poll_until(ready: Callable[[], bool], deadline: float, max_sleep_s: float) -> bool:
    """Poll `ready` until it holds (True) or time.monotonic() passes `deadline` (False); the sleep between
    polls starts at a bare yield and doubles up to max_sleep_s."""
    sleep_s = 0.0
    while not ready():
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(sleep_s, deadline - now))
        sleep_s = min(max(2 * sleep_s, 1e-5), max_sleep_s)
    return True
