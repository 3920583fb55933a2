"""`agentserve predictor` bad input: exit status 2 and one line on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentserve.cli import EXIT_BAD_INPUT, main
from tests.predictor.conftest import write_jsonl


def bad_input(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["predictor", *args])
    assert exit_info.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err.strip()


def test_missing_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.jsonl"
    err = bad_input(capsys, "train", "--trace", str(missing), "--out", str(tmp_path / "m.pt"))
    assert err == f"agentserve: error: trace not found: {missing}"


def test_a_file_of_neither_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = write_jsonl(tmp_path / "other.jsonl", [{"prompt": "hi"}])
    err = bad_input(capsys, "train", "--trace", str(other), "--out", str(tmp_path / "m.pt"))
    assert "neither a Mooncake trace nor a gateway recording" in err


def test_a_bad_mooncake_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_jsonl(tmp_path / "trace.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1,
                                                    "hash_ids": [0]}])
    with trace.open("a") as file:
        file.write('{"timestamp": 1, "input_length": "many", "output_length": 1, "hash_ids": [0]}\n')
    err = bad_input(capsys, "train", "--trace", str(trace), "--out", str(tmp_path / "m.pt"))
    assert f"{trace}:2: timestamp, input_length and output_length must be non-negative integers" in err


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--epochs", "many", "--epochs must be an integer, got 'many'"),
    ("--epochs", "0", "--epochs must be at least 1, got 0"),
    ("--learning-rate", "nan", "--learning-rate must be a number, got 'nan'"),
    ("--heldout-share", "1.5", "--heldout-share must be between 0 and 1, got 1.5"),
])
def test_bad_numbers(option: str, value: str, message: str, small_trace: Path, tmp_path: Path,
                     capsys: pytest.CaptureFixture[str]) -> None:
    err = bad_input(capsys, "train", "--trace", str(small_trace), "--out", str(tmp_path / "m.pt"), option, value)
    assert err == f"agentserve: error: {message}"


def test_missing_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = bad_input(capsys, "eval", "--model", str(tmp_path / "none.pt"))
    assert err == f"agentserve: error: model not found: {tmp_path / 'none.pt'}"


def test_a_file_that_is_not_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a model")
    assert "not a predictor model" in bad_input(capsys, "eval", "--model", str(junk))


def test_a_trace_without_two_turn_sessions(tmp_path: Path, small_model: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    single = write_jsonl(tmp_path / "single.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1,
                                                      "hash_ids": [0]}])
    err = bad_input(capsys, "eval", "--model", str(small_model), "--trace", str(single))
    assert "no session has two turns" in err


def test_heldout_eval_refuses_a_trace_changed_since_training(small_trace: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(small_trace.read_bytes())
    main(["predictor", "train", "--trace", str(trace), "--out", str(tmp_path / "m.pt"), "--epochs", "1", "--quiet"])
    with trace.open("a") as file:
        file.write('{"timestamp": 99999999, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n')
    err = bad_input(capsys, "eval", "--model", str(tmp_path / "m.pt"))
    assert err == f"agentserve: error: the model's training trace changed since training: {trace}"
