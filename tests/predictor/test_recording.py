"""Gateway recordings: written line by line, read back whole, accepted by training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from predictor.recording import SessionRecorder, read_recording
from predictor.records import TurnRecord
from predictor.traces import load_sessions, trace_kind
from predictor.train import TrainSettings, train


def record_sessions(path: Path, sessions: int, turns: int) -> dict[str, list[TurnRecord]]:
    written: dict[str, list[TurnRecord]] = {}
    with SessionRecorder(path) as recorder:
        for step in range(turns):
            for index in range(sessions):
                turn = TurnRecord(new_tokens=100 * (index + 1) + step, prompt_tokens=1000 + step,
                                  cached_tokens=900 - 10 * index, output_tokens=20 + step,
                                  tool_gap_s=0.0 if step == 0 else 1.5, phase="think" if step % 2 else "act")
                recorder.record(f"s{index}", turn, t=10.0 * step + index)
                written.setdefault(f"s{index}", []).append(turn)
    return written


def test_recording_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "rec" / "sessions.jsonl"
    written = record_sessions(path, sessions=2, turns=3)
    first = json.loads(path.read_text().splitlines()[0])
    assert first == {"session_id": "s0", "t": 0.0, "new_tokens": 100, "prompt_tokens": 1000, "cached_tokens": 900,
                     "output_tokens": 20, "tool_gap_s": 0.0, "phase": "act"}
    assert trace_kind(path) == "recording"
    assert read_recording(path) == written


def test_recorder_flushes_each_line(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    recorder = SessionRecorder(path)
    recorder.record("a", TurnRecord(1, 1, 0, 1, 0.0, "act"), t=1.0)
    assert len(path.read_text().splitlines()) == 1
    recorder.close()


def test_turns_are_ordered_by_arrival(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    late, early = TurnRecord(2, 2, 0, 1, 3.0, "act"), TurnRecord(1, 1, 0, 1, 0.0, "act")
    with SessionRecorder(path) as recorder:
        recorder.record("a", late, t=5.0)
        recorder.record("a", early, t=2.0)
    assert load_sessions([path]) == {"0/a": [early, late]}


def test_training_accepts_a_recording(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    record_sessions(path, sessions=12, turns=4)
    metadata = train([path], tmp_path / "model.pt", TrainSettings(epochs=2, hidden=8), show_progress=False)
    assert metadata["heldout"]["n_turns"] == round(12 * 0.2) * 3


def test_a_bad_line_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    record_sessions(path, sessions=1, turns=1)
    with path.open("a") as file:
        file.write(json.dumps({"session_id": "b", "t": 1.0, "new_tokens": -5, "prompt_tokens": 1,
                               "cached_tokens": 0, "output_tokens": 1, "tool_gap_s": 0.0, "phase": "act"}) + "\n")
    with pytest.raises(ValueError, match=r"sessions.jsonl:2: new_tokens must be a non-negative integer, got -5"):
        read_recording(path)
