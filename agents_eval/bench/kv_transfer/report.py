"""The report: throughput per method, the ratios against the goals, and the chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents_eval.bench.kv_transfer.settings import RATIO_GOALS, KVBenchSettings
from agents_eval.harness.report import BarChart, ReportFiles, Table, goal, write_report

TITLE = "agentserve KV transfer benchmark"
HEADERS = ["method", "tokens per block", "frames", "GB/s", "latency ms (median)", "min", "max", "bytes verified"]


def ratios(results: dict[str, dict[str, Any]], block_tokens: tuple[int, ...]) -> dict[str, dict[str, float]]:
    def speed(method: str, blocks: str) -> float | None:
        runs = results.get(method, {})
        run = runs.get(blocks) or runs.get("all")
        return None if run is None else float(run["gb_per_s"])

    table: dict[str, dict[str, float]] = {}
    for blocks in map(str, block_tokens):
        for key, (a, b, _) in RATIO_GOALS.items():
            if (top := speed(a, blocks)) is not None and (bottom := speed(b, blocks)) is not None:
                table.setdefault(blocks, {})[key] = top / bottom
    return table


def goals(ratios: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """One goal per ratio and block size measured: the method's throughput over its baseline's, at least the
    target in RATIO_GOALS."""
    return [goal(f"{key} at {blocks} tokens per block", RATIO_GOALS[key][2], "min", value, ratio=key, blocks=blocks)
            for blocks, by_key in ratios.items() for key, value in by_key.items()]


def tables(report: dict[str, Any]) -> list[Table]:
    rows = [[name, blocks if blocks != "all" else "whole layers", str(r["frames"]),
             *(f"{r[key]:.3g}" for key in ("gb_per_s", "latency_ms_median", "latency_ms_min", "latency_ms_max")),
             "yes" if r["verified"] else f"NO ({r['runs_verified']} of {r['runs']} runs)"]
            for name, runs in report["results"].items() for blocks, r in runs.items()]
    rows += [[name, "-", "-", "-", "-", "-", "-", f"skipped: {reason}"] for name, reason in report["skipped"].items()]
    ratio_rows = [[g["ratio"], g["blocks"], f"{g['measured']:.2f}", f">= {g['target']}", "yes" if g["met"] else "no"]
                  for g in report["goals"]]
    return [Table("Transfer of one request", HEADERS, rows),
            Table("Ratios of throughput", ["ratio", "tokens per block", "value", "goal", "met"], ratio_rows)]


def notes(settings: KVBenchSettings, report: dict[str, Any]) -> list[str]:
    machine = report["machine"]
    return [request_line(settings),
            "the sender hands each layer's blocks to the transport's send_many, which joins consecutive ones "
            "into frames (`frames` per request); the naive path pickles every block",
            "shm sends blocks in the sender's registered memory by reference: the receiver copies them once, "
            "straight from it, with no payload checksum (the bytes never leave this machine's memory)",
            f"payload checksum {report['checksum']['kind']}: {report['checksum']['gb_per_s']:.2f} GB/s on one "
            f"core, paid by sender and receiver; load average {machine['load_average'][0]:.1f} on "
            f"{machine['cpu_count']} cores at the start: compare ratios measured in one run, not runs"]


def request_line(settings: KVBenchSettings) -> str:
    return (f"{settings.layers} layers x {settings.tokens} tokens, {settings.kv_heads} KV heads x "
            f"{settings.head_dim}, {settings.dtype}: {settings.request_bytes / 2**20:.0f} MiB")


def write(out_dir: Path, settings: KVBenchSettings, report: dict[str, Any]) -> ReportFiles:
    bars = {f"{name} ({blocks})": r["gb_per_s"] for name, runs in report["results"].items()
            for blocks, r in runs.items()}
    chart = BarChart("throughput.png", f"KV transfer, {request_line(settings)}", "GB/s", list(bars),
                     list(bars.values()))
    return write_report(out_dir, report, TITLE, tables(report), chart, notes(settings, report))
