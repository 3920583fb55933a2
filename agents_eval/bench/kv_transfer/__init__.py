"""`agentserve bench kv-transfer`: KV transfer throughput and latency of each transport, against baselines.

One request's KV (default 16 layers x 2,048 tokens, 8 KV heads of 64, float16: 64 MiB) travels from a
sender process to this process as blocks of `block_tokens` tokens (16: the engine's block; 256), which
the transport joins into frames, and lands through `recv_into` in this process's own KV cache (the decode
side's one copy), zeroed before each run and checked after every run. Like the engine's prefill side, the
sender keeps its KV in the transport's registered memory where it has one (shm: frames travel as
descriptors and `recv_into` copies straight from the sender's memory, the run's only copy). Baselines on
the same bytes: each block pickled over a TCP socket (naive), one raw loopback `sendall` per layer into
preallocated buffers (the socket's ceiling here), and `torch.Tensor.copy_` of each layer on one thread
(memcpy). inproc's sender is a thread of this process. Writes `report.json`, `report.md` and `throughput.png`.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agents_eval.bench.kv_transfer import report as kv_report
from agents_eval.bench.kv_transfer.measure import Bench, measure
from agents_eval.bench.kv_transfer.settings import MEMCPY, NAIVE, RATIO_GOALS, RAW, TRANSPORTS, Cache, KVBenchSettings
from agents_eval.report import ReportFiles, machine_info
from engine.kv_cache.wire import DEFAULT_CHECKSUM

__all__ = ["MEMCPY", "NAIVE", "RATIO_GOALS", "RAW", "Bench", "BenchResult", "Cache", "KVBenchSettings",
           "add_arguments", "run", "run_benchmark"]


@dataclass
class BenchResult:
    report: dict[str, Any]
    files: ReportFiles
    markdown: str


def run_benchmark(settings: KVBenchSettings, out_dir: Path) -> BenchResult:
    settings.validate()
    torch.set_num_threads(1)
    machine = machine_info()  # before the run: its load average shows other work on the machine
    results, skipped, checksum_speed = measure(settings)
    report: dict[str, Any] = {
        "settings": asdict(settings) | {"transport": settings.transport.model_dump(mode="json")},
        "machine": machine, "request_bytes": settings.request_bytes, "results": results, "skipped": skipped,
        "ratios": kv_report.ratios(results, settings.block_tokens),
        "goals": {key: goal for key, (_, _, goal) in RATIO_GOALS.items()},
        "checksum": {"kind": DEFAULT_CHECKSUM.name, "gb_per_s": checksum_speed}}
    files = kv_report.write(out_dir, settings, report)
    return BenchResult(report, files, files.markdown.read_text())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = KVBenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    for name in ("layers", "tokens", "kv_heads", "head_dim", "repeats", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--block-tokens", default=",".join(map(str, defaults.block_tokens)),
                        help="comma-separated tokens per block (a layer's blocks are joined into frames)")
    parser.add_argument("--dtype", default=defaults.dtype, choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated subset")


def run(args: argparse.Namespace) -> None:
    options = {name: getattr(args, name) for name in ("layers", "tokens", "kv_heads", "head_dim", "repeats", "seed",
                                                      "dtype")}
    settings = KVBenchSettings(block_tokens=tuple(int(n) for n in args.block_tokens.split(",")),
                               transports=tuple(args.transports.split(",")), **options)
    result = run_benchmark(settings, args.out)
    print(result.markdown)
    print(f"report: {result.files.json}, chart: {result.files.chart}")
