"""scripts/record_agent_sessions.py against a real agent gateway (tiny model): whole sessions, as the gateway
records them, ready for `predictor train`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from predictor.recording import read_recording
from predictor.traces import REPO_ROOT, load_sessions

SCRIPT = REPO_ROOT / "scripts" / "record_agent_sessions.py"


def record(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(SCRIPT), "--workload", "webarena", "--out", str(out), "--rate", "1",
               "--arrivals", "3", "--tail", "15", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_recording_a_workload_through_the_gateway(tmp_path: Path) -> None:
    out = tmp_path / "webarena.jsonl"
    out.write_text("not a recording\n")  # replaced, not appended to
    done = record(out)
    assert done.returncode == 0, done.stderr
    sessions = read_recording(out)
    assert sessions and all("webarena-0-" in key for key in sessions)  # the gateway may prefix its tenant
    later = [turn for turns in sessions.values() for turn in turns[1:]]
    assert later, "no session recorded a second turn"
    assert all(turn.tool_gap_s > 0 and turn.cached_tokens > 0 for turn in later)  # the shared system prompt
    assert f"{sum(map(len, sessions.values()))} turns of {len(sessions)} webarena sessions" in done.stdout
    assert load_sessions([out]).keys() == {f"0/{key}" for key in sessions}


def test_bad_options_are_refused(tmp_path: Path) -> None:
    done = record(tmp_path / "x.jsonl", "--rate", "0")
    assert done.returncode == 2 and "--rate and --arrivals must be positive" in done.stderr
    assert not (tmp_path / "x.jsonl").exists()
