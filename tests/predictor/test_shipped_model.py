"""The shipped model (predictor/default_model.pt): trained on agent recordings and the Mooncake trace, it beats
both baselines on every training file's held-out sessions, and it expects agents back within seconds."""

from __future__ import annotations

import json

import pytest

from predictor.evaluate import evaluate_traces, heldout_sessions
from predictor.forecast import LoadForecaster
from predictor.model import DEFAULT_MODEL, load_model
from predictor.recording import read_recording
from predictor.records import TurnRecord
from predictor.traces import DEFAULT_TRACE, REPO_ROOT

RECORDINGS = ("predictor/recordings/webarena.jsonl", "predictor/recordings/swe.jsonl")
QUANTITIES = ("mae", "decode_tokens_mae", "arrival_gap_s_mae")


def shipped_metadata() -> dict[str, object]:
    return json.loads(DEFAULT_MODEL.with_suffix(".json").read_text())


def errors_of(report: dict[str, dict[str, object]], quantity: str) -> dict[str, float]:
    return report[quantity] if quantity == "mae" else report["details"][quantity]  # type: ignore[return-value]


def test_trained_on_both_agent_recordings_and_a_mooncake_trace() -> None:
    metadata = shipped_metadata()
    traces = metadata["training"]["traces"]  # type: ignore[index]
    assert set(RECORDINGS) <= set(traces) and any(name.endswith(DEFAULT_TRACE.name) for name in traces)
    assert metadata["forecaster_uses"] == "lstm"


@pytest.fixture(scope="module")
def reproduced() -> dict[str, dict[str, object]]:
    """The shipped model evaluated again on its held-out sessions: each training file's report."""
    model, metadata = load_model(DEFAULT_MODEL)
    traces, heldout = heldout_sessions(metadata)
    reports = evaluate_traces(model, heldout, traces, metadata["fallback_gap_s"])
    return {name: report.as_json() for name, report in reports.per_trace.items()}


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_beats_both_baselines_on_every_training_file(reproduced: dict[str, dict[str, object]],
                                                     quantity: str) -> None:
    assert len(reproduced) == 3
    for name, report in reproduced.items():
        errors = errors_of(report, quantity)
        assert errors["predictor"] < min(errors["last_value"], errors["ema"]), (name, quantity, errors)


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_its_heldout_errors_are_reproduced_from_the_shipped_files(reproduced: dict[str, dict[str, object]],
                                                                 quantity: str) -> None:
    shipped = shipped_metadata()["heldout"]["per_trace"]  # type: ignore[index]
    assert set(reproduced) == set(shipped)
    for name, report in reproduced.items():
        assert errors_of(report, quantity) == pytest.approx(errors_of(shipped[name], quantity)), (name, quantity)


def test_expects_an_agent_back_within_seconds_and_a_chat_user_not() -> None:
    forecaster = LoadForecaster(None)
    for name in RECORDINGS:
        first_turns = [turns[0] for turns in read_recording(REPO_ROOT / name).values()][:5]
        for index, turn in enumerate(first_turns):
            forecaster.observe(f"{name}-{index}", turn, t=0.0)
    forecaster.observe("chat", TurnRecord(7000, 7000, 0, 400, 0.0, "think"), t=0.0)
    assert forecaster.forecast(horizon_s=30.0, now=0.0).sessions == 10
