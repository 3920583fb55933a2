"""The KV transfer benchmark end to end at a tiny size: report files, keys, and bytes verified everywhere."""

from __future__ import annotations

import argparse
import json
import multiprocessing
from pathlib import Path

import pytest

from agents_eval.bench.kv_transfer import (
    MEMCPY,
    NAIVE,
    RATIO_GOALS,
    RAW,
    Bench,
    BenchResult,
    Cache,
    KVBenchSettings,
    add_arguments,
    run_benchmark,
)
from engine.transport import unavailable_reason

SETTINGS = KVBenchSettings(layers=2, tokens=32, kv_heads=2, head_dim=8, block_tokens=(16, 32), repeats=1)
REPORT_KEYS = {"settings", "machine", "request_bytes", "results", "skipped", "ratios", "goals", "checksum"}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> BenchResult:
    return run_benchmark(SETTINGS, tmp_path_factory.mktemp("kv-bench"))


@pytest.mark.slow
def test_report_holds_every_method_and_ratio(result: BenchResult) -> None:
    report = json.loads(result.files.json.read_text())
    assert report.keys() >= REPORT_KEYS
    assert report["request_bytes"] == 2 * 2 * 32 * 2 * 8 * 2
    runs = report["results"]
    assert set(runs[MEMCPY]) == set(runs[RAW]) == {"all"}
    for method in ("inproc", "shm", "tcp", NAIVE):
        assert set(runs[method]) == {"16", "32"}
        for summary in runs[method].values():
            assert summary["verified"] and summary["gb_per_s"] > 0
            assert summary["runs_verified"] == summary["runs"] == SETTINGS.repeats + 1
            assert summary["latency_ms_min"] <= summary["latency_ms_median"] <= summary["latency_ms_max"]
    for method in ("inproc", "shm", "tcp"):  # each layer's blocks travel as one frame
        assert runs[method]["16"]["frames"] == runs[method]["32"]["frames"] == SETTINGS.layers
    assert (runs[NAIVE]["16"]["frames"], runs[NAIVE]["32"]["frames"]) == (4, 2)  # one pickle per block
    assert ("rdma" in report["skipped"]) == (unavailable_reason("rdma") is not None)
    assert set(report["ratios"]) == {"16", "32"} and set(report["ratios"]["16"]) == set(RATIO_GOALS)
    assert report["checksum"]["gb_per_s"] > 0


@pytest.mark.slow
def test_markdown_and_chart(result: BenchResult) -> None:
    assert ("| method | tokens per block | frames | GB/s | latency ms (median) | min | max | bytes verified |"
            in result.markdown)
    assert "| shm_vs_naive | 16 |" in result.markdown
    assert result.files.chart.read_bytes().startswith(b"\x89PNG")


def test_arguments_and_validation() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--out", "x", "--block-tokens", "16,64", "--transports", "shm,tcp"])
    assert (args.block_tokens, args.transports, args.layers, args.dtype) == ("16,64", "shm,tcp", 16, "float16")
    with pytest.raises(ValueError, match="multiple"):
        KVBenchSettings(tokens=100, block_tokens=(16,)).validate()
    with pytest.raises(ValueError, match="unknown transports"):
        KVBenchSettings(transports=("pigeon",)).validate()
    with pytest.raises(ValueError):
        run_benchmark(KVBenchSettings(repeats=0), Path("unused"))


def test_every_run_is_verified_on_a_zeroed_destination() -> None:
    """A receiver that delivers the bytes only on its first run: later runs must not pass on what it left."""
    settings = KVBenchSettings(layers=2, tokens=32, kv_heads=2, head_dim=8, block_tokens=(16,), repeats=3)
    control, _ = multiprocessing.Pipe()
    bench = Bench(settings, control)
    runs: list[int] = []

    def deliver(dest: Cache, every_run: bool) -> int:
        if every_run or not runs:
            for target, kv in zip(dest, bench.source, strict=True):
                target.copy_(kv)
        runs.append(1)
        return len(dest)

    first_only = bench.timed(lambda: None, lambda dest: deliver(dest, every_run=False))
    assert (first_only["runs"], first_only["runs_verified"], first_only["verified"]) == (4, 1, False)
    every = bench.timed(lambda: None, lambda dest: deliver(dest, every_run=True))
    assert (every["runs"], every["runs_verified"], every["verified"]) == (4, 4, True)
