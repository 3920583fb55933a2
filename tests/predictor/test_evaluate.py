"""Baseline and predictor errors, computed by hand on small cases, and the seeded split by session."""

from __future__ import annotations

from pathlib import Path

import pytest

from predictor.evaluate import Errors, better_predictor, evaluate, split_sessions
from predictor.features import Baselines, examples
from predictor.model import load_model, predict
from predictor.records import TurnRecord


def turn(new_tokens: int, output_tokens: int = 10, gap_s: float = 1.0) -> TurnRecord:
    return TurnRecord(new_tokens, new_tokens, 0, output_tokens, gap_s, "think")


def test_baseline_errors_on_a_hand_built_case(small_model: Path) -> None:
    model, _ = load_model(small_model)
    sessions = [[turn(100), turn(300), turn(200), turn(400)], [turn(50), turn(50)]]
    report = evaluate(model, sessions, fallback_gap_s=1.0)
    # last value predicts 100, 300, 200 and 50: errors 200, 100, 200, 0
    # EMA (alpha 0.5) predicts 100, 200, 200 and 50: errors 200, 0, 200, 0
    assert report.n_turns == 4
    assert report.prefill_tokens.last_value == pytest.approx(500 / 4)
    assert report.prefill_tokens.ema == pytest.approx(400 / 4)
    histories = [sessions[0][:1], sessions[0][:2], sessions[0][:3], sessions[1][:1]]
    predicted = [p.new_tokens for p in predict(model, histories)]
    actual = [300, 200, 400, 50]
    errors = [abs(p - a) for p, a in zip(predicted, actual, strict=True)]
    assert report.prefill_tokens.predictor == pytest.approx(sum(errors) / 4)
    assert report.n_turns_from_third_turn == 2
    assert report.prefill_tokens_from_third_turn.last_value == pytest.approx(300 / 2)


def test_gap_baselines_wait_the_fallback_until_a_second_turn() -> None:
    baselines = Baselines(fallback_gap_s=7.0)
    baselines.observe(turn(10, gap_s=0.0))
    assert baselines.predict("last_value").gap_s == baselines.predict("ema").gap_s == 7.0
    for gap in (2.0, 4.0):
        baselines.observe(turn(10, gap_s=gap))
    assert baselines.predict("last_value").gap_s == 4.0
    assert baselines.predict("ema").gap_s == 3.0


def test_examples_keep_the_last_window_turns() -> None:
    session = [turn(n) for n in range(1, 12)]
    found = examples([session], window=4, fallback_gap_s=0.0)
    assert len(found) == 10
    assert [t.new_tokens for t in found[-1].history] == [7, 8, 9, 10]
    assert found[-1].target.new_tokens == 11


def test_split_is_seeded_and_by_session() -> None:
    sessions = {f"0/{i}": [turn(i)] for i in range(10)}
    training, heldout = split_sessions(sessions, 0.3, seed=4)
    assert len(heldout) == 3 and not set(training) & set(heldout)
    assert split_sessions(sessions, 0.3, seed=4) == (training, heldout)


@pytest.mark.parametrize(("errors", "choice"), [
    (Errors(predictor=1.0, last_value=2.0, ema=3.0), "lstm"),
    (Errors(predictor=2.5, last_value=2.0, ema=3.0), "last_value"),
    (Errors(predictor=3.0, last_value=3.0, ema=2.0), "ema"),
])
def test_the_lstm_is_used_only_when_it_beats_both_baselines(errors: Errors, choice: str) -> None:
    assert better_predictor(errors) == choice


def test_every_file_gets_its_share_of_heldout_sessions() -> None:
    sessions = {f"0/{i}": [turn(i)] for i in range(100)} | {f"1/{i}": [turn(i)] for i in range(10)}
    for seed in range(5):
        heldout = split_sessions(sessions, 0.2, seed=seed)[1]
        assert sum(key.startswith("0/") for key in heldout) == 20
        assert sum(key.startswith("1/") for key in heldout) == 2
