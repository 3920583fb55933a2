"""A listening KV transport and its address, for the transport contract tests (skipped where the transport
cannot run here, e.g. RDMA without pyverbs)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from engine.transport import make_transport, unavailable_reason
from engine.transport.base import KVReceiver, Transport, TransportSettings

Link = tuple[Transport, str, KVReceiver]


@contextmanager
def open_link(name: str, settings: TransportSettings) -> Iterator[Link]:
    reason = unavailable_reason(name)
    if reason is not None:
        pytest.skip(f"{name}: {reason}")
    transport = make_transport(name, settings)
    address, receiver = transport.listen()
    try:
        yield transport, address, receiver
    finally:
        receiver.close()
