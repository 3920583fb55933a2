"""`agentserve bench kv-transfer`: KV transfer throughput and latency of each transport, against baselines.

One request's KV (default 16 layers x 2,048 tokens, 8 KV heads of 64, float16: 64 MiB) travels as Layer
Blocks of `block_size` tokens from a sender process to this process, which copies every block into its
own KV cache (the decode side's one copy) and checks the bytes at the end. Baselines on the same bytes:
each block pickled over a TCP socket (naive), one raw loopback `sendall` per layer into preallocated
buffers (the socket's ceiling here), and `torch.Tensor.copy_` of each layer on one thread (memcpy).
inproc runs its sender on a thread of this process. Results go to `report.json`, `report.md` and
`throughput.png` in the output folder.
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


@dataclass(frozen=True)
class KVBenchSettings:
    layers: int = 16
    tokens: int = 2048
    kv_heads: int = 8
    head_dim: int = 64
    block_size: int = 16
    dtype: str = "float16"
    repeats: int = 5
    seed: int = 0
    transports: tuple[str, ...] = TRANSPORTS
    transport: TransportSettings = field(default_factory=TransportSettings)

    def validate(self) -> None:
        if min(self.layers, self.tokens, self.kv_heads, self.head_dim, self.block_size, self.repeats) < 1:
            raise ValueError("layers, tokens, kv heads, head dim, block size and repeats must be at least 1")
        if self.tokens % self.block_size or self.dtype not in ("float16", "bfloat16", "float32"):
            raise ValueError("tokens must be a multiple of the block size; dtype float16, bfloat16 or float32")
        if unknown := set(self.transports) - set(TRANSPORTS):
            raise ValueError(f"unknown transports {sorted(unknown)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype: torch.dtype = getattr(torch, self.dtype)
        return dtype

    @property
    def frames(self) -> int:
        return self.layers * self.tokens // self.block_size

    @property
    def request_bytes(self) -> int:
        return 2 * self.layers * self.tokens * self.kv_heads * self.head_dim * self.torch_dtype.itemsize


@dataclass
class Measurement:
    seconds: list[float]
    verified: bool
    cross_process: bool

    def summary(self, nbytes: int) -> dict[str, Any]:
        median = statistics.median(self.seconds)
        return {"gb_per_s": nbytes / median / 1e9, "latency_ms_median": 1e3 * median,
                "latency_ms_min": 1e3 * min(self.seconds), "latency_ms_max": 1e3 * max(self.seconds),
                "verified": self.verified, "cross_process": self.cross_process}


@dataclass
class BenchResult:
    report: dict[str, Any]
    files: ReportFiles
    markdown: str


def make_cache(settings: KVBenchSettings) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(settings.seed)
    shape = (2, settings.tokens, settings.kv_heads, settings.head_dim)
    return [torch.randn(shape, generator=generator).to(settings.torch_dtype) for _ in range(settings.layers)]


def layer_blocks(layer: int, kv: torch.Tensor, block_size: int) -> list[KVBlock]:
    return [KVBlock(layer, start, start + block_size, layer * 1_000_003 + start, kv[:, start:start + block_size])
            for start in range(0, kv.shape[1], block_size)]


class BlockSender:
    def __init__(self, sender: KVSender, block_size: int) -> None:
        self.sender, self.block_size = sender, block_size

    def send(self, cache: list[torch.Tensor]) -> None:
        for layer, kv in enumerate(cache):
            self.sender.send_many(layer_blocks(layer, kv, self.block_size))

    def close(self) -> None:
        self.sender.close()


class SocketSender:
    def __init__(self, method: str, address: str, settings: KVBenchSettings) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.naive, self.block_size = method == NAIVE, settings.block_size

    def send(self, cache: list[torch.Tensor]) -> None:
        for layer, kv in enumerate(cache):
            if not self.naive:
                self.sock.sendall(tensor_bytes(kv))
                continue
            for block in layer_blocks(layer, kv, self.block_size):  # clone: pickling a view ships its storage
                data = pickle.dumps((block.layer, block.token_start, block.token_end, block.tensor.clone()))
                self.sock.sendall(LENGTH.pack(len(data)) + data)

    def close(self) -> None:
        self.sock.close()


def sender_process(settings: KVBenchSettings, control: Connection) -> None:
    """Runs in the child: ("connect", method, address), ("go",) to send the request, ("close",), ("stop",)."""
    torch.set_num_threads(1)
    cache = make_cache(settings)
    sender: BlockSender | SocketSender | None = None
    while (command := control.recv())[0] != "stop":
        if command[0] == "connect" and command[1] in (NAIVE, RAW):
            sender = SocketSender(command[1], command[2], settings)
        elif command[0] == "connect":
            sender = BlockSender(make_transport(command[1], settings.transport).connect(command[2]),
                                 settings.block_size)
        elif command[0] == "close" and sender is not None:
            sender.close()
        elif sender is not None:
            sender.send(cache)
        control.send("ok")


def receive_blocks(receiver: KVReceiver, dest: list[torch.Tensor], frames: int) -> None:
    for _ in range(frames):
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


def receive_pickles(sock: socket.socket, dest: list[torch.Tensor], frames: int) -> None:
    for _ in range(frames):
        length = bytearray(LENGTH.size)
        recv_exact(sock, memoryview(length))
        data = bytearray(LENGTH.unpack(length)[0])
        recv_exact(sock, memoryview(data))
        layer, start, end, tensor = pickle.loads(data)
        dest[layer][:, start:end].copy_(tensor)


def receive_raw(sock: socket.socket, dest: list[torch.Tensor]) -> None:
    for kv in dest:
        recv_exact(sock, tensor_bytes(kv))


class Bench:
    def __init__(self, settings: KVBenchSettings) -> None:
        self.settings = settings
        self.source = make_cache(settings)
        self.frames = settings.frames

    def fresh_dest(self) -> list[torch.Tensor]:
        return [torch.zeros_like(kv) for kv in self.source]

    def verified(self, dest: list[torch.Tensor]) -> bool:
        return all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(dest, self.source,
                                                                                          strict=True))

    def timed(self, go: Callable[[], None], receive: Callable[[list[torch.Tensor]], None],
              cross_process: bool) -> Measurement:
        dest, seconds = self.fresh_dest(), []
        for _ in range(self.settings.repeats + 1):  # the first run warms pages and connections up
            start = time.perf_counter()
            go()
            receive(dest)
            seconds.append(time.perf_counter() - start)
        return Measurement(seconds[1:], self.verified(dest), cross_process)

    def memcpy(self) -> Measurement:
        def copy_all(dest: list[torch.Tensor]) -> None:
            for target, kv in zip(dest, self.source, strict=True):
                target.copy_(kv)

        return self.timed(lambda: None, copy_all, cross_process=False)

    def inproc(self) -> Measurement:
        transport = make_transport("inproc", self.settings.transport)
        address, receiver = transport.listen()
        sender = BlockSender(transport.connect(address), self.settings.block_size)
        with receiver:
            def go() -> None:
                threading.Thread(target=sender.send, args=(self.source,), daemon=True).start()

            return self.timed(go, lambda dest: receive_blocks(receiver, dest, self.frames), cross_process=False)

    def remote(self, control: Connection, method: str) -> Measurement:
        """The child sends, this process receives; each run ends when the bytes are here and the child
        has acknowledged."""
        if method in (NAIVE, RAW):
            with socket.create_server(("127.0.0.1", 0)) as listener:
                control.send(("connect", method, f"127.0.0.1:{listener.getsockname()[1]}"))
                sock, _ = listener.accept()
            control.recv()
            with sock:
                if method == NAIVE:
                    return self._remote_runs(control, lambda dest: receive_pickles(sock, dest, self.frames))
                return self._remote_runs(control, lambda dest: receive_raw(sock, dest))
        address, receiver = make_transport(method, self.settings.transport).listen()
        with receiver:
            control.send(("connect", method, address))
            control.recv()
            return self._remote_runs(control, lambda dest: receive_blocks(receiver, dest, self.frames))

    def _remote_runs(self, control: Connection, receive: Callable[[list[torch.Tensor]], None]) -> Measurement:
        def receive_and_ack(dest: list[torch.Tensor]) -> None:
            receive(dest)
            control.recv()

        measurement = self.timed(lambda: control.send(("go",)), receive_and_ack, cross_process=True)
        control.send(("close",))
        control.recv()
        return measurement


def measure_all(settings: KVBenchSettings) -> tuple[dict[str, Measurement], dict[str, str], float]:
    bench, skipped = Bench(settings), {}
    results = {MEMCPY: bench.memcpy()}
    if "inproc" in settings.transports:
        results["inproc"] = bench.inproc()
    context = multiprocessing.get_context("spawn")
    control, child_end = context.Pipe()
    child = context.Process(target=sender_process, args=(settings, child_end))
    child.start()
    try:
        for method in (*[t for t in settings.transports if t != "inproc"], NAIVE, RAW):
            reason = unavailable_reason(method) if method in TRANSPORTS else None
            if reason is not None:
                skipped[method] = reason
                continue
            results[method] = bench.remote(control, method)
    finally:
        control.send(("stop",))
        child.join(30)
    return results, skipped, checksum_gb_per_s(bench.source[0])


def checksum_gb_per_s(kv: torch.Tensor) -> float:
    data = tensor_bytes(kv)
    start = time.perf_counter()
    zlib.crc32(data)
    return data.nbytes / (time.perf_counter() - start) / 1e9


def build_report(settings: KVBenchSettings, results: dict[str, Measurement], skipped: dict[str, str],
                 machine: dict[str, Any], checksum_speed: float) -> dict[str, Any]:
    nbytes = settings.request_bytes
    summaries = {name: m.summary(nbytes) for name, m in results.items()}
    ratios = {key: summaries[a]["gb_per_s"] / summaries[b]["gb_per_s"]
              for key, (a, b, _) in RATIO_GOALS.items() if a in summaries and b in summaries}
    return {"settings": asdict(settings) | {"transport": settings.transport.model_dump(mode="json")},
            "machine": machine, "request": {"bytes": nbytes, "frames": settings.frames,
                                            "frame_payload_bytes": nbytes // settings.frames},
            "results": summaries, "skipped": skipped, "ratios": ratios,
            "goals": {key: goal for key, (_, _, goal) in RATIO_GOALS.items()},
            "checksum": {"kind": DEFAULT_CHECKSUM.name, "gb_per_s": checksum_speed}}


def tables(report: dict[str, Any]) -> list[Table]:
    rows = [[name, "yes" if r["cross_process"] else "no", f"{r['gb_per_s']:.3g}", f"{r['latency_ms_median']:.3g}",
             f"{r['latency_ms_min']:.3g}", f"{r['latency_ms_max']:.3g}", "yes" if r["verified"] else "NO"]
            for name, r in report["results"].items()]
    rows += [[name, "-", "-", "-", "-", "-", f"skipped: {reason}"] for name, reason in report["skipped"].items()]
    ratio_rows = [[key, f"{value:.2f}", f">= {report['goals'][key]}", "yes" if value >= report["goals"][key]
                   else "no"] for key, value in report["ratios"].items()]
    headers = ["method", "cross-process", "GB/s", "latency ms (median)", "min", "max", "bytes verified"]
    return [Table("Transfer of one request", headers, rows),
            Table("Ratios of throughput", ["ratio", "value", "goal", "met"], ratio_rows)]


def run_benchmark(settings: KVBenchSettings, out_dir: Path) -> BenchResult:
    settings.validate()
    torch.set_num_threads(1)
    machine = machine_info()
    results, skipped, checksum_speed = measure_all(settings)
    report = build_report(settings, results, skipped, machine, checksum_speed)
    request = (f"{settings.layers} layers x {settings.tokens} tokens, {settings.kv_heads} KV heads x "
               f"{settings.head_dim}, {settings.dtype}: {report['request']['bytes'] / 2**20:.0f} MiB in "
               f"{report['request']['frames']} blocks of {settings.block_size} tokens")
    notes = [request, f"payload checksum {report['checksum']['kind']}: "
             f"{report['checksum']['gb_per_s']:.2f} GB/s on one core, paid by sender and receiver"]
    chart = BarChart("throughput.png", f"KV transfer, {request}", "GB/s", list(report["results"]),
                     [r["gb_per_s"] for r in report["results"].values()])
    files = write_report(out_dir, report, "agentserve KV transfer benchmark", tables(report), chart, notes)
    return BenchResult(report, files, files.markdown.read_text())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = KVBenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    for name in ("layers", "tokens", "kv_heads", "head_dim", "block_size", "repeats", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--dtype", default=defaults.dtype, choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated subset")


def run(args: argparse.Namespace) -> None:
    options = {name: getattr(args, name) for name in ("layers", "tokens", "kv_heads", "head_dim", "block_size",
                                                      "repeats", "seed", "dtype")}
    settings = KVBenchSettings(transports=tuple(args.transports.split(",")), **options)
    result = run_benchmark(settings, args.out)
    print(result.markdown)
    print(f"report: {result.files.json}, chart: {result.files.chart}")
