"""`agentserve predictor replay`: the forecast the capacity controller reads, against the load that came."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentserve.cli import EXIT_BAD_INPUT, main
from predictor.forecast import LoadForecaster
from predictor.recording import SessionRecorder, TimedTurn, read_timed_turns
from predictor.records import PredictorInputError, TurnRecord
from predictor.replay import ReplayErrors, replay
from predictor.traces import REPO_ROOT
from tests.predictor.test_forecast import model_with_errors


def three_turns(path: Path) -> Path:
    """One session arriving at 0, 2 and 4 s, 100 new and 10 output tokens each turn."""
    with SessionRecorder(path) as recorder:
        for t in (0.0, 2.0, 4.0):
            recorder.record("a", TurnRecord(100, 100, 0, 10, 0.0 if t == 0 else 2.0, "act"), t=t)
    return path


def test_a_hand_built_replay(tmp_path: Path, small_model: Path) -> None:
    forecaster = LoadForecaster(model_with_errors(tmp_path, small_model, predictor=9.0, last_value=5.0, ema=6.0))
    assert forecaster.uses == "last_value" and forecaster.fallback_gap_s == 4.0
    report = replay(forecaster, read_timed_turns(three_turns(tmp_path / "rec.jsonl")), horizon_s=1.0, step_s=1.0)
    # forecasts at 0..4 s: the first turn's next is expected at 4 (fallback gap), then the second's at 2 + 2 = 4:
    # only the forecast at 3 s holds it (100). Arrived within each next second: 0, 100 (at 2 s), 0, 100 (at 4 s), 0
    assert report.forecasts == 5
    assert report.prefill_tokens == ReplayErrors(forecast=20.0, arrived=40.0, mae=20.0)
    assert report.decode_tokens == ReplayErrors(forecast=2.0, arrived=4.0, mae=2.0)


def test_the_shipped_forecast_matches_the_agent_load_it_is_told_about() -> None:
    """With the default late window the forecast is near the load that came; with 30 s it was several times it."""
    for name in ("webarena", "swe"):
        turns = read_timed_turns(REPO_ROOT / "predictor" / "recordings" / f"{name}.jsonl")
        told = replay(LoadForecaster(None), turns, horizon_s=1.0, step_s=0.5).prefill_tokens
        assert 0.7 < told.forecast / told.arrived < 1.3, (name, told)
        late = replay(LoadForecaster(None, overdue_s=30.0), turns, horizon_s=1.0, step_s=0.5).prefill_tokens
        assert late.forecast > 2.5 * late.arrived, (name, late)


def test_replay_cli_json(tmp_path: Path, small_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = model_with_errors(tmp_path, small_model, predictor=9.0, last_value=5.0, ema=6.0)
    recording = three_turns(tmp_path / "rec.jsonl")
    capsys.readouterr()
    main(["predictor", "replay", "--recording", str(recording), "--model", str(model), "--step", "1", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["forecasts"] == 5 and report["prefill_tokens"] == {"forecast": 20.0, "arrived": 40.0, "mae": 20.0}
    main(["predictor", "replay", "--recording", str(recording), "--model", str(model), "--step", "1"])
    assert "5 forecasts of the next 1 s, every 1 s" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "message"), [
    (["--step", "0"], "the step must be a positive number of seconds, got 0.0"),
    (["--horizon", "soon"], "--horizon must be a number, got 'soon'"),
    (["--overdue", "-1"], "--horizon and --overdue must be at least 0 seconds"),
])
def test_replay_cli_bad_numbers(args: list[str], message: str, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    recording = three_turns(tmp_path / "rec.jsonl")
    with pytest.raises(SystemExit) as exit_info:
        main(["predictor", "replay", "--recording", str(recording), *args])
    assert exit_info.value.code == EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == f"agentserve: error: {message}"


def test_replay_of_nothing_is_refused() -> None:
    with pytest.raises(PredictorInputError, match="no turns"):
        replay(LoadForecaster(None), list[TimedTurn](), horizon_s=1.0, step_s=0.1)
