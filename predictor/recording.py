"""Gateway session recordings: one JSON object a line, one line per finished turn (see docs/predictor.md).

    {"session_id": "a1", "t": 1732870000.25, "new_tokens": 812, "prompt_tokens": 4096, "cached_tokens": 3284,
     "output_tokens": 57, "tool_gap_s": 1.5, "phase": "think"}

`t` is the turn's arrival time in seconds on any clock the recording keeps to; it only orders a session's
turns. `agentserve predictor train --trace` accepts these files as well as Mooncake traces.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from predictor.records import PredictorInputError, TurnRecord

FIELDS = ("session_id", "t", "new_tokens", "prompt_tokens", "cached_tokens", "output_tokens", "tool_gap_s",
          "phase")


class RecordingFormatError(PredictorInputError):
    """A recording line that is not JSON or misses a field or has a bad value."""


class SessionRecorder:
    """Appends one line per turn to a JSONL file and flushes it, so a crash loses at most the line being written.

    The gateway calls `record` from its event loop (one thread); the file is opened once, in append mode.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def record(self, session_id: str, turn: TurnRecord, t: float) -> None:
        if not session_id:
            raise RecordingFormatError("session_id is empty")
        line = {"session_id": session_id, "t": t, **asdict(turn)}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SessionRecorder:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def _timed_turn(row: Any) -> tuple[str, float, TurnRecord]:
    if not isinstance(row, dict) or any(field not in row for field in FIELDS):
        raise RecordingFormatError(f"a recording line needs {', '.join(FIELDS)}")
    session_id, t = row["session_id"], row["t"]
    if not isinstance(session_id, str) or not session_id:
        raise RecordingFormatError(f"session_id must be a non-empty string, got {session_id!r}")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
        raise RecordingFormatError(f"t must be a finite number of seconds, got {t!r}")
    turn = TurnRecord(**{field: row[field] for field in FIELDS[2:]})
    return session_id, float(t), turn


class TimedTurn(NamedTuple):
    t: float  # the turn's arrival, on the recording's clock
    session_id: str
    turn: TurnRecord


def read_timed_turns(path: Path) -> list[TimedTurn]:
    """Every recorded turn with its session and arrival time, in file order."""
    turns = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                session_id, t, turn = _timed_turn(json.loads(line))
            except ValueError as error:  # json.JSONDecodeError and PredictorInputError are ValueErrors
                reason = "not JSON" if isinstance(error, json.JSONDecodeError) else str(error)
                raise RecordingFormatError(f"{path}:{number}: {reason}") from None
            turns.append(TimedTurn(t, session_id, turn))
    return turns


def read_recording(path: Path) -> dict[str, list[TurnRecord]]:
    """The recorded sessions, each its turns ordered by arrival time `t`."""
    timed: dict[str, list[tuple[float, TurnRecord]]] = {}
    for t, session_id, turn in read_timed_turns(path):
        timed.setdefault(session_id, []).append((t, turn))
    return {key: [turn for _, turn in sorted(turns, key=lambda pair: pair[0])] for key, turns in timed.items()}
