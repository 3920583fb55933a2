"""Sends to a worker never block the serving process: what its pipe cannot take waits, in order, and the
worker's plain `Connection.recv` reads every command whole."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest

from engine.core.sampling.sampler import SamplingParams
from engine.workers import messages as m
from engine.workers.coordinator.handles import WorkerHandle, stop_workers
from engine.workers.coordinator.outbox import Outbox

BIG = 300_000  # prompt tokens: about 1.5 MB pickled, several times a socket buffer


def submit(request_id: str, tokens: int) -> m.Submit:
    return m.Submit(request_id, list(range(tokens)), SamplingParams(max_tokens=4), ())


def test_a_command_larger_than_the_pipe_waits_without_blocking_and_arrives_whole_and_in_order() -> None:
    ours, theirs = mp.Pipe()
    outbox = Outbox(ours)

    def send_both() -> None:
        outbox.send(submit("big", BIG))
        outbox.send(m.Abort("big"))

    sender = threading.Thread(target=send_both)
    sender.start()  # nobody reads yet: a blocking send would never return
    sender.join(30)
    assert not sender.is_alive() and outbox.pending
    received: list[object] = []
    reader = threading.Thread(target=lambda: received.extend(theirs.recv() for _ in range(2)))
    reader.start()
    for _ in range(10_000):
        if outbox.flush():
            break
        time.sleep(0.001)
    reader.join(10)
    assert not outbox.pending
    assert isinstance(received[0], m.Submit) and received[0].token_ids == list(range(BIG))
    assert received[1] == m.Abort("big")
    outbox.close()
    assert not ours.closed  # the outbox wrote through a descriptor of its own


def test_a_small_command_is_written_at_once() -> None:
    ours, theirs = mp.Pipe()
    outbox = Outbox(ours)
    outbox.send(m.Ping(1.0))
    assert not outbox.pending and theirs.poll(1.0) and theirs.recv() == m.Ping(1.0)
    outbox.close()


def test_sending_to_a_closed_worker_raises_and_the_handle_drops_its_queue() -> None:
    ours, theirs = mp.Pipe()
    theirs.close()
    handle = WorkerHandle(0, m.DECODE, mp.get_context("spawn").Process(), ours)
    with pytest.raises(OSError):
        handle.send(submit("lost", 16))
    handle.drop_outbox()
    assert handle.outbox is None and not handle.sending


class _AliveOnce:
    """A worker process alive when asked to stop, gone when waited for."""

    pid = 1

    def __init__(self) -> None:
        self.asked = 0

    def is_alive(self) -> bool:
        self.asked += 1
        return self.asked == 1

    def join(self, timeout: float | None = None) -> None:
        pass

    def kill(self) -> None:
        pass


def test_stopping_writes_the_held_back_commands_before_the_shutdown() -> None:
    ours, theirs = mp.Pipe()
    handle = WorkerHandle(0, m.DECODE, _AliveOnce(), ours)
    handle.send(submit("big", BIG))
    assert handle.sending
    received: list[object] = []

    def worker() -> None:  # reads its commands up to the Shutdown, then says it stopped
        while not received or not isinstance(received[-1], m.Shutdown):
            received.append(theirs.recv())
        theirs.send(m.Stopped(m.KVCounters(received=1)))

    reader = threading.Thread(target=worker)
    reader.start()
    assert stop_workers([handle], deadline_s=10.0) == [m.KVCounters(received=1)]
    reader.join(10)
    assert isinstance(received[0], m.Submit) and len(received[0].token_ids) == BIG
    assert isinstance(received[1], m.Shutdown) and handle.outbox is None

