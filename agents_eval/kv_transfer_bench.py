"""`agentserve bench kv-transfer`: KV transfer throughput and latency of each transport, against baselines.

One request's KV (default 16 layers x 2,048 tokens, 8 KV heads of 64, float16: 64 MiB) travels as frames
of `frame_tokens` tokens (16: one engine block per frame; 256: a run of 16 blocks) from a sender process
to this process, which copies every frame into its own KV cache (the decode side's one copy), zeroed before
each run, and checks the bytes after every run. Baselines on the same bytes: each frame pickled over a TCP
socket (naive), one raw loopback `sendall` per layer into preallocated buffers (the socket's ceiling here), and
`torch.Tensor.copy_` of each layer on one thread (memcpy). inproc's sender is a thread of this process.
Writes `report.json`, `report.md` and `throughput.png` to the output folder.
"""

from __future__ import annotations

import argparse
import multiprocessing
import pickle
import socket
import statistics
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from agents_eval.report import BarChart, ReportFiles, Table, machine_info, write_report
from engine.kv_wire import DEFAULT_CHECKSUM, KVBlock, tensor_bytes
from engine.transport import make_transport, unavailable_reason
from engine.transport.base import KVReceiver, KVSender, TransportSettings

TRANSPORTS = ("inproc", "shm", "tcp", "rdma")
NAIVE, RAW, MEMCPY = "naive pickle over TCP", "raw loopback socket", "memcpy (copy_, 1 thread)"
LENGTH = struct.Struct("!Q")
RATIO_GOALS = {"shm_vs_naive": ("shm", NAIVE, 8.0), "shm_vs_memcpy": ("shm", MEMCPY, 0.5),
               "tcp_vs_raw_socket": ("tcp", RAW, 0.6)}
RECV_TIMEOUT_S = 60.0
BASELINE_REPEATS = 4  # memcpy and raw socket runs are short: more of them steady the median on a busy machine
Cache = list[torch.Tensor]


@dataclass(frozen=True)
class KVBenchSettings:
    layers: int = 16
    tokens: int = 2048
    kv_heads: int = 8
    head_dim: int = 64
    frame_tokens: tuple[int, ...] = (16, 256)
    dtype: str = "float16"
    repeats: int = 5
    seed: int = 0
    transports: tuple[str, ...] = TRANSPORTS
    transport: TransportSettings = field(default_factory=TransportSettings)

    def validate(self) -> None:
        if min(self.layers, self.tokens, self.kv_heads, self.head_dim, self.repeats, *self.frame_tokens) < 1:
            raise ValueError("layers, tokens, kv heads, head dim, frame tokens and repeats must be at least 1")
        if any(self.tokens % n for n in self.frame_tokens) or self.dtype not in ("float16", "bfloat16", "float32"):
            raise ValueError("tokens must be a multiple of each frame size; dtype float16, bfloat16 or float32")
        if unknown := set(self.transports) - set(TRANSPORTS):
            raise ValueError(f"unknown transports {sorted(unknown)}")

    @property
    def request_bytes(self) -> int:
        return 2 * self.layers * self.tokens * self.kv_heads * self.head_dim * getattr(torch, self.dtype).itemsize


@dataclass
class BenchResult:
    report: dict[str, Any]
    files: ReportFiles
    markdown: str


def make_cache(settings: KVBenchSettings) -> Cache:
    generator = torch.Generator().manual_seed(settings.seed)
    shape = (2, settings.tokens, settings.kv_heads, settings.head_dim)
    return [torch.randn(shape, generator=generator).to(getattr(torch, settings.dtype)) for _ in range(settings.layers)]


def same_bytes(received: Cache, sent: Cache) -> bool:
    return all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(received, sent, strict=True))


def frames_of(layer: int, kv: torch.Tensor, frame_tokens: int) -> list[KVBlock]:
    return [KVBlock(layer, start, start + frame_tokens, layer * 1_000_003 + start, kv[:, start:start + frame_tokens])
            for start in range(0, kv.shape[1], frame_tokens)]


class FrameSender:
    def __init__(self, sender: KVSender, frame_tokens: int) -> None:
        self.sender, self.frame_tokens = sender, frame_tokens

    def send(self, cache: Cache) -> None:
        for layer, kv in enumerate(cache):
            self.sender.send_many(frames_of(layer, kv, self.frame_tokens))

    def close(self) -> None:
        self.sender.close()


class SocketSender:
    def __init__(self, method: str, port: int, frame_tokens: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.naive, self.frame_tokens = method == NAIVE, frame_tokens

    def send(self, cache: Cache) -> None:
        for layer, kv in enumerate(cache):
            if not self.naive:
                self.sock.sendall(tensor_bytes(kv))
                continue
            for block in frames_of(layer, kv, self.frame_tokens):  # clone: pickling a view ships its whole storage
                data = pickle.dumps((block.layer, block.token_start, block.token_end, block.tensor.clone()))
                self.sock.sendall(LENGTH.pack(len(data)) + data)

    def close(self) -> None:
        self.sock.close()


def sender_process(settings: KVBenchSettings, control: Connection) -> None:
    """The child: ("connect", method, address, frame_tokens), ("go",) sends the request, ("close",), ("stop",)."""
    torch.set_num_threads(1)
    cache = make_cache(settings)
    sender: FrameSender | SocketSender | None = None
    while (command := control.recv())[0] != "stop":
        if command[0] == "connect" and command[1] in (NAIVE, RAW):
            sender = SocketSender(command[1], command[2], command[3])
        elif command[0] == "connect":
            sender = FrameSender(make_transport(command[1], settings.transport).connect(command[2]), command[3])
        elif command[0] == "close" and sender is not None:
            sender.close()
        elif sender is not None:
            sender.send(cache)
        control.send("ok")


def receive_frames(receiver: KVReceiver, dest: Cache, count: int) -> None:
    for _ in range(count):
        borrowed = receiver.recv_borrowed(RECV_TIMEOUT_S)
        if borrowed is None:
            raise RuntimeError("the sender stopped sending")
        with borrowed as block:
            dest[block.layer][:, block.token_start:block.token_end].copy_(block.tensor)


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        got = sock.recv_into(view)
        if not got:
            raise RuntimeError("the sender closed early")
        view = view[got:]


def receive_raw(sock: socket.socket, dest: Cache) -> None:
    for kv in dest:
        recv_exact(sock, tensor_bytes(kv))


def receive_pickles(sock: socket.socket, dest: Cache, count: int) -> None:
    for _ in range(count):
        length = bytearray(LENGTH.size)
        recv_exact(sock, memoryview(length))
        data = bytearray(LENGTH.unpack(length)[0])
        recv_exact(sock, memoryview(data))
        layer, start, end, tensor = pickle.loads(data)
        dest[layer][:, start:end].copy_(tensor)


class Bench:
    def __init__(self, settings: KVBenchSettings, control: Connection) -> None:
        self.settings, self.control = settings, control
        self.source = make_cache(settings)

    def timed(self, go: Callable[[], None], receive: Callable[[Cache], None], repeats: int = 0) -> dict[str, Any]:
        """Every run lands in a zeroed destination and is checked byte for byte, so no run passes on the bytes
        an earlier one left; the first run warms pages and connections up and is not timed."""
        dest, seconds, verified = [torch.zeros_like(kv) for kv in self.source], [], []
        for _ in range((repeats or self.settings.repeats) + 1):
            for kv in dest:
                kv.zero_()
            start = time.perf_counter()
            go()
            receive(dest)
            seconds.append(time.perf_counter() - start)
            verified.append(same_bytes(dest, self.source))
        median = statistics.median(seconds[1:])
        return {"gb_per_s": self.settings.request_bytes / median / 1e9, "latency_ms_median": 1e3 * median,
                "latency_ms_min": 1e3 * min(seconds[1:]), "latency_ms_max": 1e3 * max(seconds[1:]),
                "runs": len(verified), "runs_verified": sum(verified), "verified": all(verified)}

    def memcpy(self) -> dict[str, Any]:
        def copy_all(dest: Cache) -> None:
            for target, kv in zip(dest, self.source, strict=True):
                target.copy_(kv)

        return self.timed(lambda: None, copy_all, BASELINE_REPEATS * self.settings.repeats)

    def inproc(self, frame_tokens: int) -> dict[str, Any]:
        transport = make_transport("inproc", self.settings.transport)
        address, receiver = transport.listen()
        sender = FrameSender(transport.connect(address), frame_tokens)
        count = self.settings.layers * self.settings.tokens // frame_tokens
        with receiver:
            return self.timed(lambda: threading.Thread(target=sender.send, args=(self.source,)).start(),
                              lambda dest: receive_frames(receiver, dest, count))

    def remote(self, method: str, frame_tokens: int) -> dict[str, Any]:
        """The child sends; a run ends when the bytes are here and the child has acknowledged."""
        count = self.settings.layers * self.settings.tokens // frame_tokens if frame_tokens else 0
        if method in (NAIVE, RAW):
            with socket.create_server(("127.0.0.1", 0)) as listener:
                self.control.send(("connect", method, listener.getsockname()[1], frame_tokens))
                sock, _ = listener.accept()
            with sock:
                if method == RAW:
                    return self._runs(lambda dest: receive_raw(sock, dest), BASELINE_REPEATS * self.settings.repeats)
                return self._runs(lambda dest: receive_pickles(sock, dest, count))
        address, receiver = make_transport(method, self.settings.transport).listen()
        with receiver:
            self.control.send(("connect", method, address, frame_tokens))
            return self._runs(lambda dest: receive_frames(receiver, dest, count))

    def _runs(self, receive: Callable[[Cache], None], repeats: int = 0) -> dict[str, Any]:
        def receive_and_ack(dest: Cache) -> None:
            receive(dest)
            self.control.recv()

        self.control.recv()
        summary = self.timed(lambda: self.control.send(("go",)), receive_and_ack, repeats)
        self.control.send(("close",))
        self.control.recv()
        return summary

    def run_all(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        results: dict[str, dict[str, Any]] = {MEMCPY: {"all": self.memcpy()}, RAW: {"all": self.remote(RAW, 0)}}
        skipped = {name: reason for name in self.settings.transports if (reason := unavailable_reason(name))}
        for method in (*[name for name in self.settings.transports if name not in skipped], NAIVE):
            for n in self.settings.frame_tokens:
                run = self.inproc(n) if method == "inproc" else self.remote(method, n)
                results.setdefault(method, {})[str(n)] = run
        return results, skipped


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


def ratios(results: dict[str, dict[str, Any]], frame_tokens: tuple[int, ...]) -> dict[str, dict[str, float]]:
    def speed(method: str, frames: str) -> float | None:
        runs = results.get(method, {})
        run = runs.get(frames) or runs.get("all")
        return None if run is None else float(run["gb_per_s"])

    table: dict[str, dict[str, float]] = {}
    for frames in map(str, frame_tokens):
        for key, (a, b, _) in RATIO_GOALS.items():
            if (top := speed(a, frames)) is not None and (bottom := speed(b, frames)) is not None:
                table.setdefault(frames, {})[key] = top / bottom
    return table


def checksum_gb_per_s(data: memoryview) -> float:
    start = time.perf_counter()
    zlib.crc32(data)
    return data.nbytes / (time.perf_counter() - start) / 1e9


def tables(report: dict[str, Any]) -> list[Table]:
    rows = [[name, frames if frames != "all" else "whole layers",
             *(f"{r[key]:.3g}" for key in ("gb_per_s", "latency_ms_median", "latency_ms_min", "latency_ms_max")),
             "yes" if r["verified"] else f"NO ({r['runs_verified']} of {r['runs']} runs)"]
            for name, runs in report["results"].items() for frames, r in runs.items()]
    rows += [[name, "-", "-", "-", "-", "-", f"skipped: {reason}"] for name, reason in report["skipped"].items()]
    goals = report["goals"]
    ratio_rows = [[key, frames, f"{value:.2f}", f">= {goals[key]}", "yes" if value >= goals[key] else "no"]
                  for frames, by_key in report["ratios"].items() for key, value in by_key.items()]
    headers = ["method", "tokens per frame", "GB/s", "latency ms (median)", "min", "max", "bytes verified"]
    return [Table("Transfer of one request", headers, rows),
            Table("Ratios of throughput", ["ratio", "tokens per frame", "value", "goal", "met"], ratio_rows)]


def run_benchmark(settings: KVBenchSettings, out_dir: Path) -> BenchResult:
    settings.validate()
    torch.set_num_threads(1)
    machine = machine_info()  # before the run: its load average shows other work on the machine
    results, skipped, checksum_speed = measure(settings)
    report: dict[str, Any] = {"settings": asdict(settings) | {"transport": settings.transport.model_dump(mode="json")},
              "machine": machine, "request_bytes": settings.request_bytes, "results": results, "skipped": skipped,
              "ratios": ratios(results, settings.frame_tokens), "goals": {k: g for k, (_, _, g) in RATIO_GOALS.items()},
              "checksum": {"kind": DEFAULT_CHECKSUM.name, "gb_per_s": checksum_speed}}
    request = (f"{settings.layers} layers x {settings.tokens} tokens, {settings.kv_heads} KV heads x "
               f"{settings.head_dim}, {settings.dtype}: {settings.request_bytes / 2**20:.0f} MiB")
    notes = [request, f"payload checksum {report['checksum']['kind']}: {report['checksum']['gb_per_s']:.2f} GB/s "
             f"on one core, paid by sender and receiver; load average {machine['load_average'][0]:.1f} on "
             f"{machine['cpu_count']} cores at the start"]
    bars = {f"{name} ({frames})": r["gb_per_s"] for name, runs in results.items() for frames, r in runs.items()}
    chart = BarChart("throughput.png", f"KV transfer, {request}", "GB/s", list(bars), list(bars.values()))
    files = write_report(out_dir, report, "agentserve KV transfer benchmark", tables(report), chart, notes)
    return BenchResult(report, files, files.markdown.read_text())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = KVBenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    for name in ("layers", "tokens", "kv_heads", "head_dim", "repeats", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--frame-tokens", default=",".join(map(str, defaults.frame_tokens)),
                        help="comma-separated tokens per frame")
    parser.add_argument("--dtype", default=defaults.dtype, choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated subset")


def run(args: argparse.Namespace) -> None:
    options = {name: getattr(args, name) for name in ("layers", "tokens", "kv_heads", "head_dim", "repeats", "seed",
                                                      "dtype")}
    settings = KVBenchSettings(frame_tokens=tuple(int(n) for n in args.frame_tokens.split(",")),
                               transports=tuple(args.transports.split(",")), **options)
    result = run_benchmark(settings, args.out)
    print(result.markdown)
    print(f"report: {result.files.json}, chart: {result.files.chart}")
