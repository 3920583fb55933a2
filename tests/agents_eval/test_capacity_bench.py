"""The capacity benchmark: reallocation latencies and the fixed-split ranking computed right from a
hand-built run, the swing workload's shape, and a short real run writing a complete report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents_eval.capacity_bench import _rank, p99, reallocations
from agents_eval.capacity_bench_swing import RunResult, SwingWorkload
from gateway.cli import main


def test_reallocations_measure_from_the_first_turn_of_each_shift() -> None:
    run = RunResult(window_starts=[(0.1, "act"), (5.0, "think"), (10.2, "act")],
                    shifts=[(5.3, "think"), (10.5, "act")],
                    events=[{"kind": "move", "role": "prefill", "at": 5.35},
                            {"kind": "move", "role": "prefill", "at": 6.0},
                            {"kind": "role_applied", "role": "prefill", "at": 5.36},
                            {"kind": "move", "role": "decode", "at": 9.0}])  # before its shift: not counted
    rows = reallocations(run)
    assert [r["shift_to"] for r in rows] == ["think", "act"]
    assert rows[0]["shift_event_s"] == pytest.approx(0.3)
    assert rows[0]["decision_s"] == pytest.approx(0.35)
    assert rows[0]["serving_s"] == pytest.approx(0.36)
    assert rows[1]["shift_event_s"] == pytest.approx(0.3) and rows[1]["decision_s"] is None


def test_fixed_splits_rank_by_both_p99s_and_p99_picks_the_tail() -> None:
    summaries = {"controller": {"p99_ttft_s": 0.1, "p99_tpot_s": 0.01},
                 "fixed 1P/3D": {"p99_ttft_s": 0.9, "p99_tpot_s": 0.01},
                 "fixed 2P/2D": {"p99_ttft_s": 0.2, "p99_tpot_s": 0.012},
                 "fixed 3P/1D": {"p99_ttft_s": 0.1, "p99_tpot_s": 0.5}}
    assert _rank(summaries) == ["fixed 2P/2D", "fixed 1P/3D", "fixed 3P/1D"]
    assert p99([float(i) for i in range(101)]) == 99.0 and p99([]) is None


def test_the_swing_workload_has_its_majority_in_each_window() -> None:
    workload = SwingWorkload(duration_s=200, period_s=20, rate=10, seed=3)
    arrivals = workload.arrivals()
    assert arrivals == SwingWorkload(duration_s=200, period_s=20, rate=10, seed=3).arrivals()
    for phase in ("think", "act"):
        inside = [p for t, p in arrivals if workload.window_phase(t) == phase]
        assert 0.75 < inside.count(phase) / len(inside) < 0.85
    assert 9 < len(arrivals) / 200 < 11


@pytest.mark.slow
def test_a_short_run_writes_a_complete_report(tmp_path: Path) -> None:
    main(["bench", "capacity", "--out", str(tmp_path), "--workers", "2", "--duration", "4", "--period", "2",
          "--rate", "4"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["configs"]) == {"controller", "fixed 1P/1D"}
    for summary in report["configs"].values():
        assert summary["finished"] == summary["requests"] > 0
        assert summary["p99_ttft_s"] >= summary["p50_ttft_s"] > 0
    assert report["best_fixed"] == report["worst_fixed"] == "fixed 1P/1D"
    assert [r["shift_to"] for r in report["reallocations"]] == ["think"]
    assert report["goal"]["shifts"] == 1 and report["timeline"]
    assert (tmp_path / "role_timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert "Reallocation latency" in (tmp_path / "report.md").read_text()
