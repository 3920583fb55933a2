"""The disaggregation benchmark, small: prefills released on the planned schedule for both engines, role
switches measured on idle and on busy workers, and the report that shows both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents_eval.bench.disagg.bench import (
    ROLE_SWAPS,
    InterferenceWorkload,
    _Streams,
    goals,
    prefills_due,
    run_benchmark,
)
from agents_eval.harness.report import JSON_NAME, MARKDOWN_NAME
from engine.config import EngineSettings
from engine.core.output import RequestOutput

WORKLOAD = InterferenceWorkload(decodes=2, decode_prompt=16, decode_tokens=24, prefills=4, prefill_prompt=384,
                    prefill_every_s=0.25)
SETTINGS = EngineSettings(num_kv_blocks=512, block_size=16, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("disagg-bench")
    run_benchmark("tiny", WORKLOAD, out, "shm", SETTINGS)
    return out


@pytest.fixture(scope="module")
def report(out_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out_dir / JSON_NAME).read_text())
    return data


def test_prefills_are_due_by_the_clock_alone() -> None:
    assert [prefills_due(t, 0.5, 4) for t in (0.0, 0.49, 0.5, 1.2, 1.5, 60.0)] == [1, 1, 2, 3, 4, 4]


def _out(request_id: str, tokens: int) -> RequestOutput:
    return RequestOutput(request_id, [7] * tokens, "", False, None, 4, 0)


def test_a_requests_outputs_within_one_step_are_one_arrival() -> None:
    streams = _Streams({"d"})
    streams.planned["p"] = 0.5
    streams.record([_out("d", 1), _out("p", 1)], 1.0)
    streams.record([_out("d", 1), _out("d", 1), _out("d", 2)], 1.4)  # a backlog of 4 tokens read in one step
    assert streams.gaps == pytest.approx([0.1] * 4) and streams.ttfts == [0.5]


def test_a_workload_that_cannot_run_is_refused() -> None:
    with pytest.raises(ValueError, match="--prefill-every must be above 0"):
        InterferenceWorkload(prefill_every_s=0).validate()
    with pytest.raises(ValueError, match="at least 1"):
        InterferenceWorkload(prefills=0).validate()


@pytest.mark.slow
def test_both_engines_get_the_whole_planned_schedule(report: dict[str, Any]) -> None:
    span = (WORKLOAD.prefills - 1) * WORKLOAD.prefill_every_s  # the last prefill's planned release
    for name in ("colocated", "disaggregated"):
        result = report[name]
        assert result["wall_s"] >= span  # tiny prefills answer at once: releasing on answers ends far sooner
        assert result["release_lag_max_ms"] >= 0 and result["tpot_p99_ms"] >= result["tpot_p50_ms"] > 0


@pytest.mark.slow
def test_role_switches_are_measured_idle_and_busy(report: dict[str, Any]) -> None:
    switches = report["role_switch_ms"]
    assert len(switches["idle"]) == len(switches["busy"]) == 2 * ROLE_SWAPS
    assert all(latency >= 0 for latency in switches["idle"] + switches["busy"])
    in_flight = report["role_switch_busy_in_flight"]
    assert len(in_flight) == ROLE_SWAPS and all(len(counts) == 2 and min(counts) >= 1 for counts in in_flight)


@pytest.mark.slow
def test_markdown_reports_both_switch_latencies(out_dir: Path) -> None:
    markdown = (out_dir / MARKDOWN_NAME).read_text()
    assert "| role switch latency ms, idle workers (median / max; goal <= 50) |" in markdown
    assert "| role switch latency ms, busy workers (decode streams, prefills in flight) (median / max; goal <= 50) |" \
        in markdown
    assert (out_dir / "tpot_p99.png").read_bytes().startswith(b"\x89PNG")


def test_the_report_carries_the_goals(report: dict[str, Any]) -> None:
    assert [g["name"] for g in report["goals"]] == ["p99 TPOT disaggregated / colocated",
                                                    "slowest role switch, idle workers (ms)",
                                                    "slowest role switch, busy workers (ms)"]
    assert report["goals"][0]["measured"] == report["ratio_p99_tpot_disaggregated_over_colocated"]


def test_the_goals_judge_the_tpot_ratio_and_the_slowest_switches() -> None:
    data = {"ratio_p99_tpot_disaggregated_over_colocated": 0.4,
            "role_switch_ms": {"idle": [3.0, 12.0], "busy": [20.0, 61.0]}}
    found = goals(data)
    assert [(g["measured"], g["met"]) for g in found] == [(0.4, True), (12.0, True), (61.0, False)]
    assert not goals({**data, "role_switch_ms": {"idle": [], "busy": [1.0]}})[1]["met"]  # none measured
