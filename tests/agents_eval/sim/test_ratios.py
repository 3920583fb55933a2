"""Ratio validation on stub reports whose ratios are known: the agent benchmark's (3 runs of one workload) and
`bench disagg`'s, against stub simulated figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents_eval.sim.validation.ratios import (
    DISAGG_TPOT,
    compare,
    goal,
    load_reports,
    measured_ratios,
    simulated_agent_ratios,
)


def _agent_report(slo_rate: float, p99: float) -> dict[str, object]:
    """A report of `agentserve bench --workload swe` with agent/baseline ratios `slo_rate` and `p99`."""
    return {"workload": {"name": "swe"},
            "ratios": {"agent/baseline": {"slo_rate": slo_rate, "p99_latency": p99, "cost": 0.5},
                       "disaggregated/baseline": {"slo_rate": float("nan")}}}


def _stub_reports(tmp_path: Path) -> list[Path]:
    paths = []
    for index, (rate, p99) in enumerate([(2.0, 0.5), (2.4, 0.4), (1.8, 0.6)]):
        (tmp_path / f"agent{index}").mkdir()
        (tmp_path / f"agent{index}" / "report.json").write_text(json.dumps(_agent_report(rate, p99)))
        paths.append(tmp_path / f"agent{index}")
    for index, tpot in enumerate([0.8, 0.9, 1.0]):
        (tmp_path / f"disagg{index}.json").write_text(json.dumps({"ratio_p99_tpot_disaggregated_over_colocated": tpot}))
        paths.append(tmp_path / f"disagg{index}.json")
    return paths


def test_the_measured_ratio_is_the_median_of_the_runs(tmp_path: Path) -> None:
    measured = measured_ratios(load_reports(_stub_reports(tmp_path)))
    # cost is not validated; NaN (not measured) is left out
    assert measured == {"swe slo_rate agent/baseline": [2.0, 2.4, 1.8],
                        "swe p99_latency agent/baseline": [0.5, 0.4, 0.6], DISAGG_TPOT: [0.8, 0.9, 1.0]}


def test_simulated_ratios_come_from_each_configurations_figures_at_its_slo_rate() -> None:
    configurations = {"baseline": {"slo_rate_sessions_per_s": 1.0, "at_slo": {"latency_p99_s": 2.0}},
                      "agent": {"slo_rate_sessions_per_s": 2.2, "at_slo": {"latency_p99_s": 1.0}}}
    assert simulated_agent_ratios("swe", configurations) == pytest.approx(
        {"swe slo_rate agent/baseline": 2.2, "swe p99_latency agent/baseline": 0.5})


def test_the_largest_relative_error_over_the_rows(tmp_path: Path) -> None:
    measured = measured_ratios(load_reports(_stub_reports(tmp_path)))
    simulated = {"swe slo_rate agent/baseline": 2.2, "swe p99_latency agent/baseline": 0.5, DISAGG_TPOT: 0.81,
                 "webarena slo_rate agent/baseline": 3.0}
    result = compare(simulated, measured)
    errors = {row["ratio"]: row["relative_error"] for row in result["rows"]}
    assert errors == pytest.approx({"swe slo_rate agent/baseline": 0.1, "swe p99_latency agent/baseline": 0.0,
                                    DISAGG_TPOT: 0.1})
    assert result["max_relative_error"] == pytest.approx(0.1)
    assert result["simulated_only"] == ["webarena slo_rate agent/baseline"] and result["measured_only"] == []
    assert set(goal(result)) == {"name", "target", "bound", "measured", "met"}


def test_a_ratio_the_simulator_does_not_give_fails_the_goal(tmp_path: Path) -> None:
    measured = measured_ratios(load_reports(_stub_reports(tmp_path)))
    result = compare({"swe slo_rate agent/baseline": 2.0, "swe p99_latency agent/baseline": 0.5}, measured)
    assert result["max_relative_error"] == 0.0 and result["measured_only"] == [DISAGG_TPOT]
    assert not goal(result)["met"]
