"""Ratio validation on stub reports whose ratios are known: the agent benchmark's (3 runs of one workload) and
`bench disagg`'s, against stub simulated figures; and `bench disagg`'s ratio simulated on a stub calibration whose
step times make it known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents_eval.bench.disagg.workload import MAX_NUM_BATCHED_TOKENS, InterferenceWorkload
from agents_eval.sim.calibration.fit import KINDS, Calibration
from agents_eval.sim.model.config import EngineKnobs
from agents_eval.sim.validation import interference
from agents_eval.sim.validation.absolute import engine_knobs
from agents_eval.sim.validation.ratios import (
    DISAGG_TPOT,
    TOLERANCE,
    compare,
    goal,
    load_reports,
    measured_brackets,
    measured_ratios,
    simulated_agent_ratios,
    validate_ratios,
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


def _searched(low: float, high: float | None) -> dict[str, object]:
    return {"slo_rate_sessions_per_s": low, "slo_search": {"bracket": [low, high]}}


def test_a_slo_rate_ratio_has_the_bracket_its_searches_left() -> None:
    """A configuration's SLO rate is its bracket's low end: agent in [12.8, 15.2), baseline in [6.4, 7.6) gives
    agent/baseline in [12.8 / 7.6, 15.2 / 6.4); a search without a failing rate gives no bracket."""
    reports = [{"workload": {"name": "swe"},
                "configurations": {"agent": _searched(12.8, 15.2), "baseline": _searched(6.4, 7.6),
                                   "disaggregated": _searched(9.0, None)}}] * 3
    brackets = measured_brackets(reports)
    assert list(brackets) == ["swe slo_rate agent/baseline"]
    assert brackets["swe slo_rate agent/baseline"][0] == pytest.approx((12.8 / 7.6, 15.2 / 6.4))
    measured = {"swe slo_rate agent/baseline": [2.0] * 3, "swe slo_rate agent/disaggregated": [1.4] * 3}
    rows = compare({"swe slo_rate agent/baseline": 2.3, "swe slo_rate agent/disaggregated": 1.4}, measured,
                   brackets)["rows"]
    assert [(r["within"], r["within_bracket"]) for r in rows] == [(False, True), (True, None)]  # 15% off, inside


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


def _stub_calibration(path: Path, prompt_step_s: float, decode_step_s: float = 0.002) -> Path:
    """Steps of a fixed time per kind: a decode step `decode_step_s`, any step with a prompt chunk `prompt_step_s`."""
    def line(step_s: float) -> dict[str, float]:
        return {"step": step_s, "seq": 0.0, "linear_flop": 0.0, "attention_flop": 0.0, "byte": 0.0}

    Calibration("tiny", "float32", {KINDS[0]: line(decode_step_s), KINDS[1]: line(prompt_step_s)}).save(path)
    return path


def _knobs() -> EngineKnobs:
    return engine_knobs("tiny").model_copy(update={"max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS})


def test_the_simulated_disagg_ratio_is_the_token_gaps_p99_on_each_deployment(tmp_path: Path) -> None:
    """Prompt-chunk steps of 50 ms, decode steps of 2 ms: colocated, a stream's token waits out a prompt chunk
    (its p99 gap is the 50 ms step); disaggregated, the decode worker runs decode steps only (2 ms, a stream's
    first gaps on the decode worker aside), so the ratio is about 0.002 / 0.05."""
    figures = interference.p99_tpot_ratio(_stub_calibration(tmp_path / "cal.json", 0.05), InterferenceWorkload(),
                                          _knobs())
    assert figures["colocated_tpot_p99_s"] == pytest.approx(0.05)
    assert figures["disaggregated_tpot_p99_s"] == pytest.approx(0.002, rel=0.1)
    assert figures["ratio"] == pytest.approx(0.04, rel=0.1)
    # with a prompt chunk as cheap as a decode step, neither deployment stalls the streams: about 1
    same = interference.p99_tpot_ratio(_stub_calibration(tmp_path / "same.json", 0.002), InterferenceWorkload(),
                                       _knobs())
    assert same["ratio"] == pytest.approx(1.0, rel=0.1)


def test_a_bench_disagg_report_gets_its_simulated_ratio_on_the_workload_it_ran(tmp_path: Path) -> None:
    """Three stub `bench disagg` reports measuring 0.04 (median): the simulated ratio on the stub calibration is
    0.04 within 10%, and the goal reads it; the report's workload is the one simulated."""
    paths = []
    for index, ratio in enumerate([0.03, 0.04, 0.05]):
        path = tmp_path / f"disagg{index}.json"
        path.write_text(json.dumps({"ratio_p99_tpot_disaggregated_over_colocated": ratio,
                                    "workload": {"decodes": 4, "prefills": 6, "prefill_every_s": 0.5, "seed": 3}}))
        paths.append(path)
    assert InterferenceWorkload.of(load_reports(paths)[0]) == InterferenceWorkload(decodes=4, prefills=6, seed=3)
    result = validate_ratios(_stub_calibration(tmp_path / "cal.json", 0.05), paths)
    assert [row["ratio"] for row in result["rows"]] == [DISAGG_TPOT]
    assert result["rows"][0]["measured"] == 0.04 and result["rows"][0]["relative_error"] <= TOLERANCE
    assert result["measured_only"] == [] and result["goal"]["met"]
