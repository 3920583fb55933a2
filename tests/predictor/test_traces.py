"""Mooncake traces become sessions of turns with the right new tokens, gaps and phases."""

from __future__ import annotations

from pathlib import Path

from predictor.records import TurnRecord
from predictor.traces import TraceRequest, load_sessions, sessions_and_reuse, trace_kind
from tests.predictor.conftest import write_jsonl

ROWS = [
    {"timestamp": 0, "input_length": 1200, "output_length": 100, "hash_ids": [0, 1, 2]},  # a, first turn
    {"timestamp": 500, "input_length": 700, "output_length": 900, "hash_ids": [0, 5]},  # b, first turn
    {"timestamp": 2000, "input_length": 1700, "output_length": 50, "hash_ids": [0, 1, 7, 8]},  # a: shares 0, 1
    {"timestamp": 2500, "input_length": 1100, "output_length": 20, "hash_ids": [0, 5, 6]},  # b: shares all of b's
    {"timestamp": 3000, "input_length": 1800, "output_length": 300, "hash_ids": [0, 1, 7, 8]},  # a: a retry-like
    {"timestamp": 4000, "input_length": 300, "output_length": 10, "hash_ids": [0]},  # c: the system prompt only
]


def test_mooncake_turns_have_new_tokens_gaps_and_phases(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "trace.jsonl", ROWS)
    assert trace_kind(trace) == "mooncake"
    sessions = load_sessions([trace])
    assert sessions == {
        "0/0": [TurnRecord(1200, 1200, 0, 100, 0.0, "think"),
                TurnRecord(1700 - 1024, 1700, 1024, 50, 2.0, "think"),  # two shared blocks
                TurnRecord(100, 1800, 1700, 300, 1.0, "act")],  # all four shared, capped at a's last prompt
        "0/1": [TurnRecord(700, 700, 0, 900, 0.0, "act"),
                TurnRecord(400, 1100, 700, 20, 2.0, "think")],  # two shared blocks, but b's prompt was 700
        "0/2": [TurnRecord(300, 300, 0, 10, 0.0, "think")],
    }


def test_sessions_match_the_trajectory_benchmarks_rule() -> None:
    hash_ids = [(0, 1, 2), (0, 5), (0, 1, 7, 8, 9), (0, 5, 6), (0, 9)]
    sessions, reused = sessions_and_reuse([TraceRequest(0, 512 * len(ids), 10, ids) for ids in hash_ids])
    assert sessions == [0, 1, 0, 1, 2]
    assert reused == [0, 1, 2, 2, 1]


def test_files_never_merge_sessions(tmp_path: Path) -> None:
    first = write_jsonl(tmp_path / "one.jsonl", ROWS[:1])
    second = write_jsonl(tmp_path / "two.jsonl", ROWS[:1])
    assert sorted(load_sessions([first, second])) == ["0/0", "1/0"]
