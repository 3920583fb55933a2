"""shm's one-copy path: blocks in the sender's registered memory travel as descriptors, the receiver copies
them straight out of it, and the sender's memory stays held until the receiver releases (acknowledges) it."""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest
import torch

from engine.kv_cache.wire import BadShape, FrameHeader, KVBlock
from engine.transport import make_transport
from engine.transport.base import KVReceiver, KVSender, Transport, TransportError, TransportSettings
from engine.transport.shm import pull as shm_pull

SETTINGS = TransportSettings(shm_ring_bytes=1 << 20, send_timeout_s=5.0)
SHAPE = (2, 64, 2, 8)  # one layer's K and V of 64 tokens
Link = tuple[Transport, KVSender, KVReceiver, list[torch.Tensor]]


def segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("agentserve")}


@pytest.fixture
def link() -> Iterator[Link]:
    """A shm transport with two registered layers of seeded KV, a receiver, and a sender connected to it."""
    before = segments()
    transport = make_transport("shm", SETTINGS)
    layers = transport.shared_tensors([(SHAPE, torch.float16)] * 2)
    assert layers is not None
    generator = torch.Generator().manual_seed(3)
    for kv in layers:
        kv.copy_(torch.randn(SHAPE, generator=generator))
    address, receiver = transport.listen()
    sender = transport.connect(address)
    yield transport, sender, receiver, layers
    sender.close()
    receiver.close()
    transport.close()
    assert segments() == before  # the ring and the registered segment are unlinked


def runs(layers: list[torch.Tensor], tokens: int = 16) -> list[KVBlock]:
    """Each layer in blocks of `tokens`, views of the registered memory (the sender joins adjacent ones)."""
    return [KVBlock(layer, start, start + tokens, layer * 100 + start, kv[:, start:start + tokens])
            for layer, kv in enumerate(layers) for start in range(0, kv.shape[1], tokens)]


def test_held_blocks_view_the_senders_memory_until_released(link: Link) -> None:
    _, sender, receiver, layers = link
    released = threading.Event()
    sender.send_many(runs(layers), on_released=released.set)
    held = [receiver.recv_held(5.0) for _ in layers]
    assert all(h is not None for h in held)
    for h, kv in zip(held, layers, strict=True):
        assert h is not None and (h.block.token_start, h.block.token_end) == (0, kv.shape[1])  # one frame a layer
        assert torch.equal(h.block.tensor, kv)
    layers[0][0, 0, 0, 0] += 1  # a view, not a copy: the sender's memory itself
    assert held[0] is not None and torch.equal(held[0].block.tensor, layers[0])
    assert sender.poll() == 2 and not released.is_set()
    held[0].release()
    assert sender.poll() == 1 and not released.is_set()  # memory of the other layer is still read
    assert held[1] is not None
    held[1].release()
    assert sender.poll() == 0 and released.is_set()


def test_recv_into_copies_exact_bytes_into_the_receivers_blocks_and_acknowledges(link: Link) -> None:
    _, sender, receiver, layers = link
    dest = torch.zeros(2, 2, 128, 2, 8, dtype=torch.float16)  # strided destinations: every other token slot
    released = threading.Event()
    sender.send_many(runs(layers), on_released=released.set)

    def place(header: FrameHeader) -> torch.Tensor:
        return dest[header.layer][:, 2 * header.token_start:2 * header.token_end:2]

    for _ in layers:
        assert receiver.recv_into(place, 5.0) is not None
    for layer, kv in enumerate(layers):
        assert torch.equal(dest[layer][:, ::2].view(torch.uint8), kv.view(torch.uint8))
        assert not dest[layer][:, 1::2].any()
    assert sender.flush(5.0) and released.is_set()


def test_blocks_outside_registered_memory_take_the_ring(link: Link) -> None:
    _, sender, receiver, layers = link
    own = layers[0].clone()  # not registered
    released = threading.Event()
    sender.send_many([KVBlock(0, 0, 64, 1, own)], on_released=released.set)
    assert released.is_set() and sender.poll() == 0  # copied into the ring: the sender may reuse it at once
    held = receiver.recv_held(5.0)
    assert held is not None and torch.equal(held.block.tensor, own)
    own.zero_()
    assert torch.equal(held.block.tensor, layers[0])  # the receiver's own copy


def test_a_rejected_pull_is_acknowledged(link: Link) -> None:
    _, sender, receiver, layers = link
    released = threading.Event()
    sender.send_many(runs(layers[:1]), on_released=released.set)
    with pytest.raises(BadShape):
        receiver.recv_into(lambda header: torch.zeros(3, dtype=torch.float16), 5.0)  # a misfit destination
    assert receiver.counters.bad_shape == 1
    assert sender.poll() == 0 and released.is_set()


def test_pulls_past_the_ack_window_take_the_ring(link: Link, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm_pull, "ACK_SLOTS", 1)
    _, sender, receiver, layers = link
    sender.send_many(runs(layers))  # two layers, two frames: one pull, then no room for another
    assert sender.poll() == 1
    first, second = receiver.recv_held(5.0), receiver.recv_held(5.0)
    assert first is not None and second is not None
    layers[1].zero_()
    assert not second.block.tensor.eq(0).all()  # the ring's copy, taken before the sender changed its memory
    first.release()
    assert sender.poll() == 0


def test_a_receiver_closing_mid_transfer_frees_the_senders_memory(link: Link) -> None:
    _, sender, receiver, layers = link
    released = threading.Event()
    sender.send_many(runs(layers), on_released=released.set)
    assert receiver.recv_held(5.0) is not None  # one layer taken and never released, the other never taken
    assert sender.poll() == 2
    receiver.close()
    assert sender.poll() == 0 and released.is_set()  # nothing reads the sender's memory any more
    with pytest.raises(TransportError):
        sender.send_many(runs(layers))


def test_a_sender_closing_keeps_its_unread_memory_held_for_the_receiver(link: Link) -> None:
    _, sender, receiver, layers = link
    released = threading.Event()
    sender.send_many(runs(layers[:1]), on_released=released.set)
    sender.close()
    assert not released.is_set()  # the receiver may still pull it
    held = receiver.recv_held(5.0)
    assert held is not None and torch.equal(held.block.tensor, layers[0])
    held.release()
    assert receiver.recv_held(0.05) is None


def _send_from_child(address: str, seed: int, done: Connection) -> None:
    transport = make_transport("shm", SETTINGS)
    layers = transport.shared_tensors([(SHAPE, torch.bfloat16)] * 3)
    assert layers is not None
    generator = torch.Generator().manual_seed(seed)
    for kv in layers:
        kv.copy_(torch.randn(SHAPE, generator=generator))
    with transport.connect(address) as sender:
        sender.send_many(runs(layers))
        done.send(sender.flush(30.0))  # the receiver copied every block and acknowledged it
    transport.close()


def test_cross_process_pull_is_byte_exact_and_leaves_nothing_in_dev_shm() -> None:
    before = segments()
    address, receiver = make_transport("shm", SETTINGS).listen()
    context = multiprocessing.get_context("spawn")
    parent_end, child_end = context.Pipe()
    child = context.Process(target=_send_from_child, args=(address, 5, child_end))
    child.start()
    dest = torch.zeros(3, *SHAPE, dtype=torch.bfloat16)
    with receiver:
        for _ in range(3):
            assert receiver.recv_into(lambda h: dest[h.layer][:, h.token_start:h.token_end], 30.0) is not None
        assert parent_end.poll(30.0) and parent_end.recv() is True
    child.join(30)
    generator = torch.Generator().manual_seed(5)
    for kv in dest:
        assert torch.equal(kv.view(torch.uint8), torch.randn(SHAPE, generator=generator).to(torch.bfloat16)
                           .view(torch.uint8))
    assert child.exitcode == 0 and segments() == before
