"""The receiving side, this process: every method moves one request into a zeroed copy of the KV cache,
timed run by run and checked byte for byte after each run."""

from __future__ import annotations

import multiprocessing
import pickle
import socket
import statistics
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

from agents_eval.bench.kv_transfer.senders import LENGTH, BlockSender, sender_process
from agents_eval.bench.kv_transfer.settings import MEMCPY, NAIVE, RAW, Cache, KVBenchSettings, make_cache, same_bytes
from engine.kv_cache.wire import CHECKSUMS, DEFAULT_CHECKSUM, FrameHeader, tensor_bytes
from engine.transport import make_transport, unavailable_reason
from engine.transport.base import KVReceiver

RECV_TIMEOUT_S = 60.0
BASELINE_REPEATS = 4  # memcpy and raw socket runs are short: more of them steady the median on a busy machine
Receive = Callable[[Cache], int]  # fills the destination, returns the frames (or messages) it took


def receive_frames(receiver: KVReceiver, dest: Cache) -> int:
    """Frames until every token of every layer is in, each copied by the transport straight into `dest`."""
    def place(header: FrameHeader) -> torch.Tensor:
        return dest[header.layer][:, header.token_start:header.token_end]

    missing, frames = sum(kv.shape[1] for kv in dest), 0
    while missing:
        block = receiver.recv_into(place, RECV_TIMEOUT_S)
        if block is None:
            raise RuntimeError("the sender stopped sending")
        missing -= block.token_end - block.token_start
        frames += 1
    return frames


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        got = sock.recv_into(view)
        if not got:
            raise RuntimeError("the sender closed early")
        view = view[got:]


def receive_raw(sock: socket.socket, dest: Cache) -> int:
    for kv in dest:
        recv_exact(sock, tensor_bytes(kv))
    return len(dest)


def receive_pickles(sock: socket.socket, dest: Cache, count: int) -> int:
    for _ in range(count):
        length = bytearray(LENGTH.size)
        recv_exact(sock, memoryview(length))
        data = bytearray(LENGTH.unpack(length)[0])
        recv_exact(sock, memoryview(data))
        layer, start, end, tensor = pickle.loads(data)
        dest[layer][:, start:end].copy_(tensor)
    return count


class Bench:
    def __init__(self, settings: KVBenchSettings, control: Connection) -> None:
        self.settings, self.control = settings, control
        self.source = make_cache(settings)

    def timed(self, go: Callable[[], None], receive: Receive, repeats: int = 0) -> dict[str, Any]:
        """Every run lands in a zeroed destination and is checked byte for byte, so no run passes on the bytes
        an earlier one left; the first run warms pages and connections up and is not timed."""
        dest, seconds, verified, frames = [torch.zeros_like(kv) for kv in self.source], [], [], 0
        for _ in range((repeats or self.settings.repeats) + 1):
            for kv in dest:
                kv.zero_()
            start = time.perf_counter()
            go()
            frames = receive(dest)
            seconds.append(time.perf_counter() - start)
            verified.append(same_bytes(dest, self.source))
        median = statistics.median(seconds[1:])
        return {"gb_per_s": self.settings.request_bytes / median / 1e9, "latency_ms_median": 1e3 * median,
                "latency_ms_min": 1e3 * min(seconds[1:]), "latency_ms_max": 1e3 * max(seconds[1:]),
                "frames": frames, "runs": len(verified), "runs_verified": sum(verified), "verified": all(verified)}

    def memcpy(self) -> dict[str, Any]:
        def copy_all(dest: Cache) -> int:
            for target, kv in zip(dest, self.source, strict=True):
                target.copy_(kv)
            return len(dest)

        return self.timed(lambda: None, copy_all, BASELINE_REPEATS * self.settings.repeats)

    def inproc(self, block_tokens: int) -> dict[str, Any]:
        transport = make_transport("inproc", self.settings.transport)
        address, receiver = transport.listen()
        sender = BlockSender(transport.connect(address), block_tokens)
        with receiver:
            return self.timed(lambda: threading.Thread(target=sender.send, args=(self.source,)).start(),
                              lambda dest: receive_frames(receiver, dest))

    def remote(self, method: str, block_tokens: int) -> dict[str, Any]:
        """The child sends; a run ends when the bytes are here and the child has acknowledged."""
        if method in (NAIVE, RAW):
            with socket.create_server(("127.0.0.1", 0)) as listener:
                self.control.send(("connect", method, listener.getsockname()[1], block_tokens))
                sock, _ = listener.accept()
            with sock:
                if method == RAW:
                    return self._runs(lambda dest: receive_raw(sock, dest), BASELINE_REPEATS * self.settings.repeats)
                count = self.settings.layers * self.settings.tokens // block_tokens
                return self._runs(lambda dest: receive_pickles(sock, dest, count))
        address, receiver = make_transport(method, self.settings.transport).listen()
        with receiver:
            self.control.send(("connect", method, address, block_tokens))
            return self._runs(lambda dest: receive_frames(receiver, dest))

    def _runs(self, receive: Receive, repeats: int = 0) -> dict[str, Any]:
        def receive_and_ack(dest: Cache) -> int:
            frames = receive(dest)
            self.control.recv()
            return frames

        self.control.recv()
        summary = self.timed(lambda: self.control.send(("go",)), receive_and_ack, repeats)
        self.control.send(("close",))
        self.control.recv()
        return summary

    def run_all(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        results: dict[str, dict[str, Any]] = {MEMCPY: {"all": self.memcpy()}, RAW: {"all": self.remote(RAW, 0)}}
        skipped = {name: reason for name in self.settings.transports if (reason := unavailable_reason(name))}
        for method in (*[name for name in self.settings.transports if name not in skipped], NAIVE):
            for n in self.settings.block_tokens:
                run = self.inproc(n) if method == "inproc" else self.remote(method, n)
                results.setdefault(method, {})[str(n)] = run
        return results, skipped


def checksum_gb_per_s(data: memoryview, repeats: int = 20) -> float:
    """The default payload checksum's speed on one core, warm (the first pass is not timed)."""
    checksum = CHECKSUMS[DEFAULT_CHECKSUM]
    checksum(data, 0)
    start = time.perf_counter()
    for _ in range(repeats):
        checksum(data, 0)
    return repeats * data.nbytes / (time.perf_counter() - start) / 1e9


def measure(settings: KVBenchSettings) -> tuple[dict[str, dict[str, Any]], dict[str, str], float]:
    """Every method's summary, the transports skipped (why), and the checksum's GB/s on one layer."""
    context = multiprocessing.get_context("spawn")
    control, child_end = context.Pipe()
    child = context.Process(target=sender_process, args=(settings, child_end))
    child.start()
    try:
        bench = Bench(settings, control)
        return *bench.run_all(), checksum_gb_per_s(tensor_bytes(bench.source[0]))
    finally:
        control.send(("stop",))
        child.join(30)
