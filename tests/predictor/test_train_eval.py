"""Training on a small trace, and `agentserve predictor eval` against a direct computation."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from agentserve.cli import main
from predictor.evaluate import split_sessions
from predictor.features import examples
from predictor.model import load_model, predict
from predictor.records import TurnRecord
from predictor.traces import load_sessions


def eval_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    main(["predictor", "eval", *args, "--json"])
    return json.loads(capsys.readouterr().out)


def direct_mae(model_path: Path, sessions: dict[str, list[TurnRecord]]) -> tuple[dict[str, float], int]:
    """Prefill-token errors recomputed from the sessions' raw turns, not through `evaluate`."""
    model, metadata = load_model(model_path)
    found = examples(sessions.values(), model.config.window, metadata["fallback_gap_s"])
    predicted = predict(model, [e.history for e in found])
    errors = {"predictor": 0.0, "last_value": 0.0, "ema": 0.0}
    for turns in sessions.values():
        ema = float(turns[0].new_tokens)
        for previous, current in itertools.pairwise(turns):
            errors["last_value"] += abs(previous.new_tokens - current.new_tokens)
            errors["ema"] += abs(ema - current.new_tokens)
            ema = 0.5 * current.new_tokens + 0.5 * ema
    errors["predictor"] = sum(abs(p.new_tokens - e.target.new_tokens) for p, e in zip(predicted, found, strict=True))
    return {key: value / len(found) for key, value in errors.items()}, len(found)


def test_training_writes_a_small_model_with_heldout_errors(small_model: Path) -> None:
    metadata = json.loads(small_model.with_suffix(".json").read_text())
    assert small_model.stat().st_size < 100_000
    assert set(metadata["heldout"]["mae"]) == {"predictor", "last_value", "ema"}
    assert metadata["forecaster_uses"] in ("lstm", "last_value", "ema")
    assert metadata["training"]["settings"]["seed"] == 1


def test_eval_json_on_the_heldout_split(small_model: Path, small_trace: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    report = eval_json(capsys, "--model", str(small_model))
    assert list(report)[:2] == ["mae", "n_turns"] and set(report["mae"]) == {"predictor", "last_value", "ema"}
    heldout = split_sessions(load_sessions([small_trace]), 0.2, seed=1)[1]
    expected, n_turns = direct_mae(small_model, heldout)
    assert report["n_turns"] == n_turns > 0
    assert report["mae"] == pytest.approx(expected)
    assert report["mae"] == pytest.approx(json.loads(small_model.with_suffix(".json").read_text())["heldout"]["mae"])


def test_eval_json_on_a_whole_trace(small_model: Path, small_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = eval_json(capsys, "--model", str(small_model), "--trace", str(small_trace))
    expected, n_turns = direct_mae(small_model, load_sessions([small_trace]))
    assert report["n_turns"] == n_turns
    assert report["mae"] == pytest.approx(expected)


def test_training_is_seeded(small_trace: Path, small_model: Path, tmp_path: Path) -> None:
    main(["predictor", "train", "--trace", str(small_trace), "--out", str(tmp_path / "again.pt"), "--epochs", "3",
          "--hidden", "16", "--seed", "1", "--quiet"])
    again = json.loads((tmp_path / "again.json").read_text())["heldout"]
    assert again == json.loads(small_model.with_suffix(".json").read_text())["heldout"]

