"""The capacity benchmark: reallocation latencies and the fixed-split ranking computed right from a
hand-built run, the swing workload's shape, and a short real run writing a complete report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents_eval.bench.capacity.bench import _rank, goals, moves_per_window, p99, reallocations
from agents_eval.bench.capacity.swing import RunResult, SwingWorkload, _Live, _record
from agentserve.cli import main
from engine.capacity.signals import AdmittedWork
from engine.core.output import RequestOutput
from gateway.admission import AdmissionController


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


def test_moves_per_window_count_decisions_into_each_role() -> None:
    moves = [("decode", 0.5), ("decode", 0.5), ("prefill", 5.2), ("decode", 6.0), ("prefill", 7.0)]
    events = [{"kind": "move", "role": role, "at": at} for role, at in moves]
    run = RunResult(window_starts=[(0.1, "act"), (5.0, "think")],
                    events=[*events, {"kind": "role_applied", "role": "prefill", "at": 7.1}])
    assert moves_per_window(run) == [{"window": "act", "at_s": 0.1, "prefill": 0, "decode": 1},
                                     {"window": "think", "at_s": 5.0, "prefill": 2, "decode": 1}]


def test_the_goal_needs_every_criterion() -> None:
    shifts = [{"serving_s": 0.05}, {"serving_s": 0.3}, {"serving_s": 0.08}]
    moves = [{"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 0}]
    summaries: dict[str, dict[str, Any]] = {"controller": {"p99_ttft_s": 0.9}, "fixed 1P/1D": {"p99_ttft_s": 1.0},
                                            "fixed 2P/0D": {"p99_ttft_s": None}}
    met = goals(shifts, moves, summaries)
    assert all(g["met"] for g in met) and [g["measured"] for g in met[:3]] == [0.3, 0.08, 1]

    def missed(*args: Any) -> list[int]:
        return [index for index, g in enumerate(goals(*args)) if not g["met"]]

    assert missed([*shifts, {"serving_s": None}], moves, summaries) == [0]
    assert missed([{"serving_s": 0.2}], moves, summaries) == [1]
    assert missed(shifts, [{"prefill": 2, "decode": 0}], summaries) == [2]
    slower = {**summaries, "fixed 1P/1D": {"p99_ttft_s": 0.8}}
    assert missed(shifts, moves, slower) == [3]


def test_fixed_splits_rank_by_both_p99s_and_p99_picks_the_tail() -> None:
    summaries = {"controller": {"p99_ttft_s": 0.1, "p99_tpot_s": 0.01},
                 "fixed 1P/3D": {"p99_ttft_s": 0.9, "p99_tpot_s": 0.01},
                 "fixed 2P/2D": {"p99_ttft_s": 0.2, "p99_tpot_s": 0.012},
                 "fixed 3P/1D": {"p99_ttft_s": 0.1, "p99_tpot_s": 0.5}}
    assert _rank(summaries) == ["fixed 2P/2D", "fixed 1P/3D", "fixed 3P/1D"]
    assert p99([float(i) for i in range(101)]) == 99.0 and p99([]) is None


def test_ttft_counts_from_the_planned_arrival_and_the_ledger_retires_the_turn() -> None:
    ledger, result = AdmissionController(ttft_slo_s=60.0, initial_prefill_tokens_per_s=1.0), RunResult()
    ledger.on_admit("r1", 1536, 3)
    live = {"r1": _Live(arrival=10.0)}  # planned at 10.0 s, whenever the driver got to submitting it

    def output(tokens: int, finished: bool) -> RequestOutput:
        return RequestOutput("r1", [7] * tokens, "", finished, "length" if finished else None, 1536, 0)

    _record(ledger, live, result, output(1, False), 10.4, lambda n: None)
    assert result.ttft_s == [pytest.approx(0.4)] and ledger.admitted == AdmittedWork(0, 3, 1)
    _record(ledger, live, result, output(2, True), 10.6, lambda n: None)
    assert result.tpot_s == [pytest.approx(0.1)] and ledger.admitted == AdmittedWork() and result.finished == 1


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
    assert report["shift_summary"]["shifts"] == 1 and report["timeline"]
    assert len(report["goals"]) == 4 and report["goals"][0]["name"] == "slowest shift served in the new role (s)"
    assert [w["window"] for w in report["moves_per_window"]] == ["act", "think"]
    assert (tmp_path / "role_timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert "Reallocation latency" in (tmp_path / "report.md").read_text()
