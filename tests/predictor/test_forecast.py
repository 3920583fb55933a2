"""The online forecaster: sums the live sessions' next turns, and uses the LSTM only when it won."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from predictor.forecast import LoadForecaster
from predictor.model import load_model, predict
from predictor.records import Forecast, PredictorInputError, TurnRecord


def model_with_errors(tmp_path: Path, trained: Path, predictor: float, last_value: float, ema: float) -> Path:
    path = tmp_path / "model.pt"
    shutil.copy(trained, path)
    metadata = json.loads(trained.with_suffix(".json").read_text())
    metadata["heldout"]["mae"] = {"predictor": predictor, "last_value": last_value, "ema": ema}
    metadata["fallback_gap_s"] = 4.0
    path.with_suffix(".json").write_text(json.dumps(metadata))
    return path


def turn(new_tokens: int, output_tokens: int, gap_s: float) -> TurnRecord:
    return TurnRecord(new_tokens, new_tokens, 0, output_tokens, gap_s, "think")


def observe_two_sessions(forecaster: LoadForecaster) -> None:
    forecaster.observe("a", turn(100, 10, 0.0), t=0.0)
    forecaster.observe("a", turn(300, 30, 5.0), t=5.0)  # next: last value 300/30 at 10.0, EMA 200/20 at 10.0
    forecaster.observe("b", turn(50, 5, 0.0), t=8.0)  # next: 50/5 at 8.0 + the fallback gap 4.0 = 12.0


def test_falls_back_to_last_value_when_the_lstm_lost(tmp_path: Path, small_model: Path) -> None:
    forecaster = LoadForecaster(model_with_errors(tmp_path, small_model, predictor=9.0, last_value=5.0, ema=6.0))
    assert forecaster.uses == "last_value"
    observe_two_sessions(forecaster)
    assert forecaster.forecast(horizon_s=3.0, now=9.0) == Forecast(prefill_tokens=350, decode_tokens=35, sessions=2)
    assert forecaster.forecast(horizon_s=1.5, now=9.0) == Forecast(prefill_tokens=300, decode_tokens=30, sessions=1)
    forecaster.end_session("a")
    assert forecaster.forecast(horizon_s=3.0, now=9.0) == Forecast(prefill_tokens=50, decode_tokens=5, sessions=1)


def test_falls_back_to_ema_when_it_is_the_better_baseline(tmp_path: Path, small_model: Path) -> None:
    forecaster = LoadForecaster(model_with_errors(tmp_path, small_model, predictor=9.0, last_value=6.0, ema=5.0))
    assert forecaster.uses == "ema"
    observe_two_sessions(forecaster)
    assert forecaster.forecast(horizon_s=3.0, now=9.0) == Forecast(prefill_tokens=250, decode_tokens=25, sessions=2)


def test_late_and_stale_sessions(tmp_path: Path, small_model: Path) -> None:
    path = model_with_errors(tmp_path, small_model, predictor=9.0, last_value=5.0, ema=6.0)
    forecaster = LoadForecaster(path, overdue_s=30.0, expire_s=100.0)
    observe_two_sessions(forecaster)
    assert forecaster.forecast(horizon_s=0.0, now=41.0).sessions == 1  # a is 31 s late, b 29 s: only b counts
    assert forecaster.forecast(horizon_s=0.0, now=43.0).sessions == 0
    forecaster.forecast(horizon_s=0.0, now=106.0)
    assert forecaster.live_sessions == 1  # a expired 100 s after its last turn; b has 2 s left


def test_uses_the_lstm_when_it_won_and_sums_its_batched_predictions(tmp_path: Path, small_model: Path) -> None:
    forecaster = LoadForecaster(model_with_errors(tmp_path, small_model, predictor=1.0, last_value=5.0, ema=6.0))
    assert forecaster.uses == "lstm"
    observe_two_sessions(forecaster)
    model, _ = load_model(small_model)
    histories = [[turn(100, 10, 0.0), turn(300, 30, 5.0)], [turn(50, 5, 0.0)]]
    expected = predict(model, histories)
    forecast = forecaster.forecast(horizon_s=1e9, now=9.0)
    assert forecast.sessions == 2
    assert forecast.prefill_tokens == pytest.approx(sum(p.new_tokens for p in expected))
    assert forecast.decode_tokens == pytest.approx(sum(p.output_tokens for p in expected))


def test_the_shipped_model_beat_both_baselines_and_is_used() -> None:
    forecaster = LoadForecaster(None)
    assert forecaster.uses == "lstm"
    forecaster.observe("a", turn(7000, 400, 0.0), t=0.0)
    assert forecaster.forecast(horizon_s=1e9, now=0.0).sessions == 1


def test_a_negative_horizon_is_rejected() -> None:
    with pytest.raises(PredictorInputError, match="horizon_s"):
        LoadForecaster(None).forecast(horizon_s=-1.0, now=0.0)
