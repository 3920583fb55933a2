"""Errors by turn index, errors per training file, and file names that travel with a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentserve.cli import main
from predictor.evaluate import TURN_INDEX_CAP, evaluate, evaluate_traces, split_sessions
from predictor.model import load_model, predict
from predictor.recording import SessionRecorder
from predictor.records import TurnRecord
from predictor.traces import REPO_ROOT, load_sessions, portable_path, resolve_path


def turn(new_tokens: int, output_tokens: int = 10, gap_s: float = 1.0) -> TurnRecord:
    return TurnRecord(new_tokens, new_tokens, 0, output_tokens, gap_s, "act")


def write_recording(path: Path, sessions: int) -> Path:
    with SessionRecorder(path) as recorder:
        for index in range(sessions):
            for number in range(2 + index % 4):
                recorder.record(f"s{index}", turn(40 * number + index, 5 + number, 0.5 * number), t=float(number))
    return path


def test_errors_by_turn_index_on_a_hand_built_case(small_model: Path) -> None:
    model, _ = load_model(small_model)
    sessions = [[turn(100), turn(300), turn(200)], [turn(50), turn(70)]]
    report = evaluate(model, sessions, fallback_gap_s=1.0)
    second, third = report.by_turn_index
    assert (second.turn, second.n_turns, third.turn, third.n_turns) == ("2", 2, "3", 1)
    # second turns: both baselines repeat the first value, 100 and 50: errors 200 and 20
    assert second.prefill_tokens.last_value == second.prefill_tokens.ema == pytest.approx(220 / 2)
    # third turn: last value 300 (error 100), EMA 200 (error 0)
    assert (third.prefill_tokens.last_value, third.prefill_tokens.ema) == pytest.approx((100.0, 0.0))
    predicted = predict(model, [sessions[0][:1], sessions[1][:1]])
    expected = (abs(predicted[0].new_tokens - 300) + abs(predicted[1].new_tokens - 70)) / 2
    assert second.prefill_tokens.predictor == pytest.approx(expected)
    assert third.prefill_tokens == report.prefill_tokens_from_third_turn


def test_turns_from_the_cap_on_share_one_bucket(small_model: Path) -> None:
    model, _ = load_model(small_model)
    report = evaluate(model, [[turn(n) for n in range(1, TURN_INDEX_CAP + 3)]], fallback_gap_s=1.0)
    labels = [bucket.turn for bucket in report.by_turn_index]
    assert labels == [str(i) for i in range(2, TURN_INDEX_CAP)] + [f"{TURN_INDEX_CAP}+"]
    assert report.by_turn_index[-1].n_turns == 3
    assert sum(bucket.n_turns for bucket in report.by_turn_index) == report.n_turns
    # every target is one more than the turn before it: last value is always 1 off
    assert all(bucket.prefill_tokens.last_value == pytest.approx(1.0) for bucket in report.by_turn_index)


def test_each_file_is_evaluated_on_its_own(small_model: Path, small_trace: Path, tmp_path: Path) -> None:
    model, _ = load_model(small_model)
    recording = write_recording(tmp_path / "agents.jsonl", sessions=12)
    traces = [small_trace, recording]
    sessions = load_sessions(traces)
    reports = evaluate_traces(model, sessions, traces, fallback_gap_s=1.0)
    assert list(reports.per_trace) == [portable_path(small_trace), portable_path(recording)]
    alone = evaluate(model, list(load_sessions([recording]).values()), fallback_gap_s=1.0)
    assert reports.per_trace[portable_path(recording)] == alone
    assert sum(r.n_turns for r in reports.per_trace.values()) == reports.overall.n_turns


def test_a_file_without_next_turns_gets_no_report_of_its_own(small_model: Path, small_trace: Path,
                                                             tmp_path: Path) -> None:
    model, _ = load_model(small_model)
    single = tmp_path / "single.jsonl"
    with SessionRecorder(single) as recorder:
        recorder.record("lonely", turn(10), t=0.0)
    reports = evaluate_traces(model, load_sessions([small_trace, single]), [small_trace, single], 1.0)
    assert list(reports.per_trace) == [portable_path(small_trace)]


def test_file_names_are_relative_to_the_repository_inside_it(tmp_path: Path) -> None:
    inside = REPO_ROOT / "predictor" / "default_model.pt"
    assert portable_path(inside) == "predictor/default_model.pt"
    assert resolve_path(portable_path(inside)) == inside
    assert portable_path(tmp_path / "x.jsonl") == str((tmp_path / "x.jsonl").resolve())
    assert resolve_path(str(tmp_path / "x.jsonl")) == tmp_path / "x.jsonl"


def test_heldout_eval_reports_each_training_file(small_trace: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    recording = write_recording(tmp_path / "agents.jsonl", sessions=40)
    model_path = tmp_path / "m.pt"
    main(["predictor", "train", "--trace", str(small_trace), str(recording), "--out", str(model_path),
          "--epochs", "2", "--hidden", "8", "--quiet"])
    capsys.readouterr()
    main(["predictor", "eval", "--model", str(model_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    metadata = json.loads(model_path.with_suffix(".json").read_text())
    assert list(report["per_trace"]) == list(metadata["heldout"]["per_trace"])
    assert report["per_trace"][str(recording.resolve())]["mae"] == pytest.approx(
        metadata["heldout"]["per_trace"][str(recording.resolve())]["mae"])
    heldout = split_sessions(load_sessions([small_trace, recording]), 0.2, seed=0)[1]
    own = [turns for key, turns in heldout.items() if key.startswith("1/") and len(turns) > 1]
    per_recording = report["per_trace"][str(recording.resolve())]
    assert per_recording["n_turns"] == sum(len(turns) - 1 for turns in own) > 0
    buckets = per_recording["details"]["by_turn_index"]
    assert buckets[0]["turn"] == "2" and sum(b["n_turns"] for b in buckets) == per_recording["n_turns"]
    main(["predictor", "eval", "--model", str(model_path)])
    table = capsys.readouterr().out
    assert f"held-out sessions of {recording.resolve()}" in table and "by turn index" in table
