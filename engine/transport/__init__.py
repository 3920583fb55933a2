"""KV transports behind one interface (`engine.transport.base`): inproc, shm, tcp, rdma.

`make_transport(name, settings)` builds one; each module is imported only when its transport is asked
for, so rdma's optional pyverbs is never loaded by the others.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType

from engine.transport.base import (
    BorrowedBlock,
    KVReceiver,
    KVSender,
    Transport,
    TransportError,
    TransportSettings,
)

TRANSPORT_CLASSES = MappingProxyType({
    "inproc": ("engine.transport.inproc", "InprocTransport"),
    "shm": ("engine.transport.shm.transport", "ShmTransport"),
    "tcp": ("engine.transport.tcp.transport", "TcpTransport"),
    "rdma": ("engine.transport.rdma", "RdmaTransport"),
})
TRANSPORT_NAMES = tuple(TRANSPORT_CLASSES)

__all__ = ["TRANSPORT_NAMES", "BorrowedBlock", "KVReceiver", "KVSender", "Transport", "TransportError",
           "TransportSettings", "make_transport", "unavailable_reason"]


def make_transport(name: str, settings: TransportSettings | None = None) -> Transport:
    if name not in TRANSPORT_CLASSES:
        raise ValueError(f"unknown transport {name!r}; choose one of {', '.join(TRANSPORT_NAMES)}")
    module, cls = TRANSPORT_CLASSES[name]
    transport: Transport = getattr(importlib.import_module(module), cls)(settings or TransportSettings())
    return transport


def unavailable_reason(name: str) -> str | None:
    """Why transport `name` cannot run on this machine, or None when it can."""
    if name == "rdma":
        from engine.transport.rdma import rdma_unavailable_reason

        return rdma_unavailable_reason()
    return None
