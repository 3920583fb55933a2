"""The upstream benchmark end to end on a small workload: real replicas, a front gateway per routing, every
turn measured; and its settings' checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents_eval.bench.upstream import UpstreamBenchSettings, run_benchmark
from agents_eval.bench.upstream.workload import ROUTINGS, session_turns


def test_sessions_are_seeded_and_never_share_a_prefix_and_every_routing_plays_the_same_texts() -> None:
    settings = UpstreamBenchSettings(sessions=2, turns=3)
    assert session_turns(settings, "affinity", 0) == session_turns(settings, "round_robin", 0)
    firsts = [session_turns(settings, run, i)[0] for run in ("affinity", "failover") for i in range(2)]
    assert len({text.split(".")[0] for text in firsts}) == 4
    with pytest.raises(ValueError, match="--replicas"):
        UpstreamBenchSettings(replicas=1).validate()


@pytest.mark.slow
def test_both_routings_serve_every_turn_and_the_report_compares_them(tmp_path: Path) -> None:
    settings = UpstreamBenchSettings(replicas=2, sessions=2, turns=3, observation_lines=20, max_tokens=4)
    report = run_benchmark(settings, tmp_path)
    for routing in ROUTINGS:
        per_turn = report["routings"][routing]["per_turn"]
        assert [t["n"] for t in per_turn] == [2, 2, 2]
        assert per_turn[0]["cached_tokens_mean"] == 0  # every session opens with its own prefix
        assert all(t["prefill_tokens_mean"] > 0 and t["ttft_p99_s"] > 0 for t in per_turn)
    affinity = report["routings"]["affinity"]["per_turn"]
    assert all(t["cached_tokens_mean"] > 0 for t in affinity[1:])  # a session's replica holds its prefix
    assert set(report["ratios"]) == {"prefill_tokens_mean", "ttft_p99_s"}
    failover = report["failover"]  # each session homed on the dead address fails over once, on its first turn
    assert (failover["sessions_moved"], failover["failovers"], failover["turns_answered"]) == (1, 1.0, 2 * 3)
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["settings"]["sessions"] == 2
    met = {g["name"]: g["met"] for g in written["goals"]}  # TTFT's is a speed figure: judged, not asserted
    assert met.keys() == {"affinity/round-robin prefill tokens, later turns", "affinity/round-robin TTFT p99, "
                          "later turns", "failover: turns answered"}
    assert met["affinity/round-robin prefill tokens, later turns"] and met["failover: turns answered"]
    assert "Affinity / round-robin" in (tmp_path / "report.md").read_text()
    assert "Failover" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "prefill_per_turn.png").stat().st_size > 0
