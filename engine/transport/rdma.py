"""RDMA transport through pyverbs (optional extra `agentserve[rdma]`, imported only when used).

Reliable-connected queue pairs. Each side registers a region of `num_slots` slots of `slot_bytes` (a
multiple of 64) in a 64-byte aligned buffer. A sender encodes a frame into a slot of its own region and
RDMA WRITEs it, with the slot index as immediate data, into the same slot of the receiver's region
(registered IBV_ACCESS_REMOTE_WRITE). The receiver polls its completion queue; a receive completion with
immediate names the slot, whose frame it checks in place (zero copy), then it reposts a receive request
and hands the slot back to the sender as a credit (4 bytes on the bootstrap socket).

Setup: the receiver listens on a TCP bootstrap socket (`rdma://host:port`); each side sends its
ConnectionParams, moves its queue pair RESET -> INIT -> RTR -> RTS towards the other, and the receiver
posts one receive request per slot before it answers. The service level comes from the traffic class
(configs/qos.yaml), so KV rides its own virtual lane.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from engine.kv_cache.wire import (
    ALIGNMENT,
    ExpectedShape,
    KVBlock,
    KVWireError,
    decode,
    encode_into,
    frame_nbytes,
    padded,
)
from engine.transport.base import (
    BorrowedBlock,
    Buffer,
    KVReceiver,
    KVSender,
    Transport,
    TransportError,
    TransportSettings,
    ZeroCopyReceiver,
)
from engine.transport.qos import load_qos_config
from engine.transport.tcp.transport import format_address, parse_address

SCHEME = "rdma"
CREDIT = struct.Struct("!I")


def rdma_unavailable_reason() -> str | None:
    try:
        from pyverbs.device import get_device_list
    except ImportError:
        return "pyverbs not installed"
    return None if get_device_list() else "no RDMA device"


def aligned_buffer(nbytes: int, alignment: int = ALIGNMENT) -> npt.NDArray[np.uint8]:
    """Zeroed bytes whose first one sits at a multiple of `alignment` (a power of two)."""
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment {alignment} is not a power of two")
    raw = np.zeros(nbytes + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes]


@dataclass(frozen=True)
class RegionLayout:
    slot_bytes: int  # a multiple of 64, room for the largest frame
    num_slots: int

    @classmethod
    def plan(cls, max_frame_bytes: int, region_bytes: int) -> RegionLayout:
        slot_bytes = padded(max_frame_bytes)
        if region_bytes < slot_bytes:
            raise ValueError(f"a {region_bytes}-byte region holds no {slot_bytes}-byte slot")
        return cls(slot_bytes, region_bytes // slot_bytes)

    @classmethod
    def for_blocks(cls, block_tokens: int, kv_heads: int, head_dim: int, itemsize: int,
                   region_bytes: int) -> RegionLayout:
        return cls.plan(frame_nbytes(2 * block_tokens * kv_heads * head_dim * itemsize), region_bytes)

    @property
    def nbytes(self) -> int:
        return self.slot_bytes * self.num_slots

    def slot(self, region: npt.NDArray[np.uint8], index: int) -> memoryview:
        if not 0 <= index < self.num_slots:
            raise IndexError(f"slot {index} outside 0..{self.num_slots - 1}")
        return region.data[index * self.slot_bytes:(index + 1) * self.slot_bytes]


def slot_to_imm(slot: int) -> int:
    """Immediate data is big-endian on the wire; verbs hand it over as the raw 32 bits."""
    return socket.htonl(slot)


def imm_to_slot(imm: int) -> int:
    return socket.ntohl(imm)


@dataclass(frozen=True)
class ConnectionParams:
    """What each side tells the other before its queue pair can reach RTS."""

    qp_num: int  # 24 bits
    lid: int  # 16 bits, 0 on RoCE
    gid: bytes  # 16 bytes
    psn: int  # 24 bits, first packet sequence number
    rkey: int
    addr: int  # the region's virtual address, 64-byte aligned
    slot_bytes: int
    num_slots: int

    MAGIC: ClassVar[bytes] = b"AKVR"
    FORMAT: ClassVar[struct.Struct] = struct.Struct("!4sIH16sIIQII")

    def __post_init__(self) -> None:
        if not (self.qp_num < 1 << 24 and self.psn < 1 << 24 and self.lid < 1 << 16 and len(self.gid) == 16):
            raise ValueError("qp_num and psn take 24 bits, lid 16, gid 16 bytes")
        if self.addr % ALIGNMENT or self.slot_bytes % ALIGNMENT:
            raise ValueError(f"region address and slot size must be multiples of {ALIGNMENT}")

    def to_bytes(self) -> bytes:
        return self.FORMAT.pack(self.MAGIC, self.qp_num, self.lid, self.gid, self.psn, self.rkey, self.addr,
                                self.slot_bytes, self.num_slots)

    @classmethod
    def from_bytes(cls, data: bytes) -> ConnectionParams:
        if len(data) != cls.FORMAT.size or data[:4] != cls.MAGIC:
            raise ValueError(f"not {cls.FORMAT.size} bytes of connection parameters")
        _, *values = cls.FORMAT.unpack(data)
        return cls(*values)


def _gid_text(gid: bytes) -> str:
    return ":".join(gid[i:i + 2].hex() for i in range(0, 16, 2))


def _exchange(sock: socket.socket, mine: ConnectionParams) -> ConnectionParams:
    sock.sendall(mine.to_bytes())
    data = bytearray()
    while len(data) < ConnectionParams.FORMAT.size:
        chunk = sock.recv(ConnectionParams.FORMAT.size - len(data))
        if not chunk:
            raise TransportError("the peer closed during the RDMA parameter exchange")
        data += chunk
    return ConnectionParams.from_bytes(bytes(data))


class Endpoint:
    """Device context, protection domain, completion queue, RC queue pair and one registered region."""

    def __init__(self, settings: TransportSettings, layout: RegionLayout, remote_write: bool) -> None:
        from pyverbs import enums as e
        from pyverbs.cq import CQ
        from pyverbs.device import Context, get_device_list
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPCap, QPInitAttr

        self.settings, self.layout = settings, layout
        name = settings.rdma_device or get_device_list()[0].name.decode()
        self.ctx = Context(name=name)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 2 * layout.num_slots + 2)
        cap = QPCap(max_send_wr=layout.num_slots + 1, max_recv_wr=layout.num_slots + 1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        self.region = aligned_buffer(layout.nbytes)
        access = e.IBV_ACCESS_LOCAL_WRITE | (e.IBV_ACCESS_REMOTE_WRITE if remote_write else 0)
        self.mr = MR(self.pd, layout.nbytes, access, address=self.region.ctypes.data)
        self.sl = load_qos_config(settings.qos_config).traffic_class(settings.traffic_class).sl

    def params(self) -> ConnectionParams:
        gid = self.ctx.query_gid(self.settings.rdma_port, self.settings.rdma_gid_index)
        lid = self.ctx.query_port(self.settings.rdma_port).lid
        self.psn = random.getrandbits(24)
        return ConnectionParams(self.qp.qp_num, lid, bytes.fromhex(gid.gid.replace(":", "")), self.psn,
                                self.mr.rkey, self.mr.buf, self.layout.slot_bytes, self.layout.num_slots)

    def connect(self, remote: ConnectionParams) -> None:
        from pyverbs import enums as e
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        route = GlobalRoute(dgid=GID(_gid_text(remote.gid)), sgid_index=self.settings.rdma_gid_index)
        attr = QPAttr(port_num=self.settings.rdma_port, path_mtu=e.IBV_MTU_1024)
        attr.ah_attr = AHAttr(gr=route, is_global=1, port_num=self.settings.rdma_port, dlid=remote.lid, sl=self.sl)
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        attr.dest_qp_num, attr.rq_psn, attr.sq_psn = remote.qp_num, remote.psn, self.psn
        attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        self.qp.to_rts(attr)

    def post_recv(self, slot: int) -> None:
        from pyverbs.wr import SGE, RecvWR

        self.qp.post_recv(RecvWR(wr_id=slot, num_sge=1, sg=[SGE(self.mr.buf, 0, self.mr.lkey)]))

    def write_slot(self, slot: int, nbytes: int, remote: ConnectionParams) -> None:
        from pyverbs import enums as e
        from pyverbs.wr import SGE, SendWR

        sge = SGE(self.mr.buf + slot * self.layout.slot_bytes, nbytes, self.mr.lkey)
        wr = SendWR(wr_id=slot, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[sge],
                    imm_data=slot_to_imm(slot))
        wr.set_wr_rdma(remote.rkey, remote.addr + slot * remote.slot_bytes)
        self.qp.post_send(wr)
        if self.poll(time.monotonic() + self.settings.send_timeout_s) is None:
            raise TransportError(f"RDMA WRITE of slot {slot} not completed in {self.settings.send_timeout_s} s")

    def poll(self, deadline: float) -> Any | None:
        """The next successful work completion, None past the deadline."""
        from pyverbs import enums as e

        while time.monotonic() < deadline:
            count, completions = self.cq.poll()
            if count and completions[0].status != e.IBV_WC_SUCCESS:
                raise TransportError(f"RDMA work completion failed with status {completions[0].status}")
            if count:
                return completions[0]
        return None

    def close(self) -> None:
        for resource in (self.qp, self.mr, self.cq, self.pd, self.ctx):
            resource.close()


class RdmaSender(KVSender):
    def __init__(self, address: str, settings: TransportSettings) -> None:
        self._settings = settings
        self._bootstrap = socket.create_connection(parse_address(address, SCHEME), settings.connect_timeout_s)
        self._bootstrap.settimeout(settings.send_timeout_s)
        layout = RegionLayout.plan(settings.rdma_max_frame_bytes, settings.rdma_region_bytes)
        self._endpoint = Endpoint(settings, layout, remote_write=False)
        self._remote = _exchange(self._bootstrap, self._endpoint.params())
        if (self._remote.slot_bytes, self._remote.num_slots) != (layout.slot_bytes, layout.num_slots):
            raise TransportError(f"the receiver's region {self._remote.num_slots} x {self._remote.slot_bytes} B "
                                 f"differs from ours, {layout.num_slots} x {layout.slot_bytes} B")
        self._endpoint.connect(self._remote)
        self._free = list(range(layout.num_slots))
        self.coalesce_bytes = min(settings.coalesce_bytes, layout.slot_bytes - frame_nbytes(ALIGNMENT))  # fits a slot

    def send(self, block: KVBlock) -> None:
        slot = self._take_slot()
        nbytes = encode_into(block, self._endpoint.layout.slot(self._endpoint.region, slot), self._settings.checksum)
        self._endpoint.write_slot(slot, nbytes, self._remote)

    def send_frame(self, frame: Buffer) -> None:
        view, slot = memoryview(frame).cast("B"), self._take_slot()
        self._endpoint.layout.slot(self._endpoint.region, slot)[:view.nbytes] = view
        self._endpoint.write_slot(slot, view.nbytes, self._remote)

    def close(self) -> None:
        self._bootstrap.close()
        self._endpoint.close()

    def _take_slot(self) -> int:
        while not self._free:
            data = self._bootstrap.recv(CREDIT.size * 64)
            if not data:
                raise TransportError("the RDMA receiver closed")
            self._free += [slot for (slot,) in CREDIT.iter_unpack(data)]
        return self._free.pop()


class RdmaReceiver(ZeroCopyReceiver):
    def __init__(self, settings: TransportSettings, expected: ExpectedShape | None) -> None:
        super().__init__(expected)
        self._settings = settings
        self._listener = socket.create_server((settings.host, settings.port))
        self.address = format_address(settings.host, self._listener.getsockname()[1], SCHEME)
        layout = RegionLayout.plan(settings.rdma_max_frame_bytes, settings.rdma_region_bytes)
        self._endpoint = Endpoint(settings, layout, remote_write=True)
        self._peer: socket.socket | None = None

    def recv_borrowed(self, timeout_s: float) -> BorrowedBlock | None:
        deadline = time.monotonic() + timeout_s
        if self._peer is None and not self._accept(deadline):
            return None
        completion = self._endpoint.poll(deadline)
        if completion is None:
            return None
        slot = imm_to_slot(completion.imm_data)
        view = self._endpoint.layout.slot(self._endpoint.region, slot)
        try:
            block = self._counted(lambda: decode(view, self.expected))
        except KVWireError:
            self._give_back(slot)
            raise
        return BorrowedBlock(block, lambda: self._give_back(slot))

    def close(self) -> None:
        if self._peer is not None:
            self._peer.close()
        self._listener.close()
        self._endpoint.close()

    def _accept(self, deadline: float) -> bool:
        self._listener.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            peer, _ = self._listener.accept()
        except TimeoutError:
            return False
        peer.settimeout(self._settings.connect_timeout_s)
        remote = ConnectionParams.from_bytes(peer.recv(ConnectionParams.FORMAT.size, socket.MSG_WAITALL))
        mine = self._endpoint.params()
        self._endpoint.connect(remote)
        for slot in range(self._endpoint.layout.num_slots):
            self._endpoint.post_recv(slot)
        peer.sendall(mine.to_bytes())
        self._peer = peer
        return True

    def _give_back(self, slot: int) -> None:
        self._endpoint.post_recv(slot)
        if self._peer is not None:
            self._peer.sendall(CREDIT.pack(slot))


class RdmaTransport(Transport):
    name = SCHEME

    def listen(self, expected: ExpectedShape | None = None) -> tuple[str, KVReceiver]:
        receiver = RdmaReceiver(self.settings, expected)
        return receiver.address, receiver

    def connect(self, address: str) -> KVSender:
        return RdmaSender(address, self.settings)
