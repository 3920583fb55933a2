"""The capacity benchmark in the cluster simulator: the swing's turns become one-turn sessions, the project's
controller moves simulated workers, and the run is recorded as the real one is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents_eval.bench.capacity.bench import moves_per_window, reallocations
from agents_eval.bench.capacity.simulated import simulate_swing, swing_sessions
from agents_eval.bench.capacity.swing import SwingWorkload
from agents_eval.sim.calibration.fit import FEATURES, Calibration, features
from agents_eval.sim.model.cost import StepWork
from agents_eval.sim.model.specs import ModelShape
from agentserve.cli import main
from engine.capacity.settings import CapacitySettings

WORKLOAD = SwingWorkload(duration_s=30.0, period_s=10.0, rate=4.0)


@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model at made-up speeds: a 1,536-token think prompt prefills in 0.4 s (three a second keep more
    than one worker busy), a decode step takes 5 ms and 1 ms a sequence."""
    think = features(ModelShape.load("tiny", "float32"), StepWork.of([(1536, 0, True)]))
    linear = 0.4 / think[FEATURES.index("linear_flop")]
    coefficients = {"prefill": {name: linear if name == "linear_flop" else 0.0 for name in FEATURES},
                    "decode": {name: {"step": 5e-3, "seq": 1e-3}.get(name, 0.0) for name in FEATURES}}
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    Calibration("tiny", "float32", coefficients).save(path)
    return path


def test_each_turn_is_a_one_turn_session_of_its_phases_sizes() -> None:
    sessions = swing_sessions(WORKLOAD)
    assert [s.start_s for s in sessions] == [at for at, _ in WORKLOAD.arrivals()]
    for session, (_, phase) in zip(sessions, WORKLOAD.arrivals(), strict=True):
        (turn,) = session.turns
        assert turn.phase == phase and session.system_tokens == 0
        expected = (1536, 32) if phase == "think" else (16, 64)
        assert (turn.new_tokens, turn.output_tokens) == expected


def test_the_controller_moves_simulated_workers_into_the_think_windows(calibration: Path) -> None:
    run = simulate_swing("tiny", WORKLOAD, (1, 3), CapacitySettings(enabled=True), calibration)
    assert run.finished == run.requests == len(WORKLOAD.arrivals()) == len(run.ttft_s)
    assert min(run.ttft_s) > 0 and run.tpot_s
    think = [row for row in moves_per_window(run) if row["window"] == "think"]
    assert think and all(row["prefill"] >= 1 for row in think)
    served = [row["serving_s"] for row in reallocations(run) if row["shift_to"] == "think"]
    assert served and all(s is not None and s < 10.0 for s in served)
    assert run.timeline[0][1] == 1 and max(n for _, n, _ in run.timeline) >= 2
    fixed = simulate_swing("tiny", WORKLOAD, (1, 3), CapacitySettings(enabled=False), calibration)
    assert fixed.events == [] and fixed.requests == run.requests


def test_a_planned_split_follows_the_schedule_not_the_load(calibration: Path) -> None:
    run = simulate_swing("tiny", WORKLOAD, (2, 2), CapacitySettings(enabled=False), calibration,
                         plan=((3, 1), (1, 3)))
    split_at = {at: prefill for at, prefill, _ in run.timeline}  # a step line: a time's last point is the new
    expected = {"act": 1, "think": 3}
    assert all(prefill == expected[WORKLOAD.window_phase(at)] for at, prefill in split_at.items() if at < 30.0)
    moves = sorted({e["at"] for e in run.events if e["kind"] == "move" and e["at"] < WORKLOAD.duration_s})
    assert len(moves) == 3  # into the first act window, then at each window's first decision (every 0.1 s)
    assert all(at % WORKLOAD.period_s <= 0.1 + 1e-6 for at in moves)


def test_the_cli_writes_a_simulated_report(tmp_path: Path, calibration: Path) -> None:
    main(["bench", "capacity", "--out", str(tmp_path), "--workers", "3", "--duration", "20", "--period", "5",
          "--model", "tiny", "--simulated", str(calibration)])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["settings"]["simulated"] == str(calibration)
    planned = "planned 2P/1D think, 1P/2D act"
    assert set(report["configs"]) == {"controller", "fixed 1P/2D", "fixed 2P/1D", planned}
    assert report["configs"][planned]["finished"] == report["configs"]["controller"]["requests"]
    assert [r["shift_to"] for r in report["reallocations"]] == ["think", "act", "think"]
    assert "(simulated)" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(("flag", "value", "message"), [("--simulated", "missing.json", "no calibration file"),
                                                         ("--think-prompt", "0", "at least 1"),
                                                         ("--act-output", "-3", "at least 1")])
def test_bad_flags_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str,
                               message: str) -> None:
    argument = str(tmp_path / value) if flag == "--simulated" else value
    with pytest.raises(SystemExit) as exited:
        main(["bench", "capacity", "--out", str(tmp_path), flag, argument])
    assert exited.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "report.json").exists()
