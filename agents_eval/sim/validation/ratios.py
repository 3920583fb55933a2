"""Ratio validation (`agentserve simulate --validate --measured REPORT...`): ratios between configurations run side
by side in one session do not drift with this host's speed, where absolute figures do (docs/simulator.md). For the
agent benchmark's configurations (`agentserve bench --workload swe|webarena`: baseline, disaggregated, agent) the
simulated SLO-rate and p99-latency ratios against the measured ones, and for `agentserve bench disagg` its p99
TPOT ratio; each measured figure is the median over the reports given (3 runs each, as the issue asks)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

TOLERANCE = 0.10  # the goal: every simulated ratio within 10% of the measured one
PAIRS = ("agent/baseline", "disaggregated/baseline", "agent/disaggregated")
FIGURES = {"slo_rate": "slo_rate_sessions_per_s", "p99_latency": "latency_p99_s"}  # bench ratio key -> simulated
DISAGG_TPOT = "disagg p99_tpot disaggregated/colocated"
DISAGG_KEY = "ratio_p99_tpot_disaggregated_over_colocated"


def load_reports(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """report.json files, or directories holding one."""
    return [json.loads((p / "report.json" if p.is_dir() else p).read_text()) for p in paths]


def measured_ratios(reports: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Each ratio as every report measured it: `<workload> <figure> <pair>` from an agent benchmark's report,
    DISAGG_TPOT from a `bench disagg` report."""
    found: dict[str, list[float]] = {}
    for report in reports:
        if DISAGG_KEY in report:
            found.setdefault(DISAGG_TPOT, []).append(float(report[DISAGG_KEY]))
            continue
        workload = report["workload"]["name"]
        for pair in PAIRS:
            for figure, value in report.get("ratios", {}).get(pair, {}).items():
                if figure in FIGURES and value is not None and value == value:  # NaN: a figure missing
                    found.setdefault(f"{workload} {figure} {pair}", []).append(float(value))
    return found


def measured_brackets(reports: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Each SLO-rate ratio's bracket as every agent benchmark report's searches left it: a configuration's SLO
    rate is the low end of its search's bracket [passed, failed), so a/b lies in [low_a / high_b, high_a / low_b]
    (the real search's grid, about 1.19x a step at its default precision, makes that interval ~1.4x wide)."""
    found: dict[str, list[tuple[float, float]]] = {}
    for report in reports:
        if DISAGG_KEY in report:
            continue
        configurations = report.get("configurations", {})
        for pair in PAIRS:
            top, bottom = (_bracket(configurations.get(name, {})) for name in pair.split("/"))
            if top and bottom:
                found.setdefault(f"{report['workload']['name']} slo_rate {pair}", []).append(
                    (top[0] / bottom[1], top[1] / bottom[0]))
    return found


def _bracket(row: Mapping[str, Any]) -> tuple[float, float] | None:
    low, high = ((row.get("slo_search") or {}).get("bracket") or [None, None])[:2]
    return (float(low), float(high)) if low and high else None


def simulated_agent_ratios(workload: str, configurations: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The same ratios from `agent_table`'s configurations: each at its own SLO rate."""
    ratios = {}
    for pair in PAIRS:
        top, bottom = (configurations.get(name) for name in pair.split("/"))
        if top is None or bottom is None:
            continue
        for figure, key in FIGURES.items():
            a, b = _figure(top, key), _figure(bottom, key)
            if a is not None and b:
                ratios[f"{workload} {figure} {pair}"] = a / b
    return ratios


def _figure(row: Mapping[str, Any], key: str) -> float | None:
    if key in row:
        return float(row[key])
    at_slo = row.get("at_slo") or {}
    return float(at_slo[key]) if key in at_slo else None


def compare(simulated: Mapping[str, float], measured: Mapping[str, list[float]],
            brackets: Mapping[str, list[tuple[float, float]]] | None = None) -> dict[str, Any]:
    """One row per ratio measured: simulated, measured (median of its runs), relative error, and where the runs'
    searches give one the measured bracket (the median of their low ends to the median of their high ends) and
    whether the simulated ratio lies in it; the largest error over the ratios both sides have, and the ratios
    only one side has."""
    rows = []
    for name, runs in sorted(measured.items()):
        value = statistics.median(runs)
        sim = simulated.get(name)
        error = abs(sim - value) / abs(value) if sim is not None and value else None
        found = (brackets or {}).get(name)
        bracket = (statistics.median(b[0] for b in found), statistics.median(b[1] for b in found)) if found else None
        rows.append({"ratio": name, "simulated": sim, "measured": value, "measured_runs": runs,
                     "relative_error": error, "within": error is not None and error <= TOLERANCE,
                     "measured_bracket": bracket,
                     "within_bracket": None if bracket is None or sim is None else bracket[0] <= sim <= bracket[1]})
    errors = [r["relative_error"] for r in rows if r["relative_error"] is not None]
    return {"max_relative_error": max(errors) if errors else None, "tolerance": TOLERANCE, "rows": rows,
            "simulated_only": sorted(set(simulated) - set(measured)),
            "measured_only": [r["ratio"] for r in rows if r["simulated"] is None]}


def goal(result: Mapping[str, Any]) -> dict[str, Any]:
    value = result["max_relative_error"]
    return {"name": "every simulated ratio within 10% of the measured one (largest relative error)",
            "target": TOLERANCE, "bound": "max", "measured": value,
            "met": value is not None and value <= TOLERANCE and not result["measured_only"]}


def validate_ratios(calibration: Path, reports: Iterable[Path], workers: int = 2, start_rate: float = 1.0,
                    steps: int = 3, seed: int = 0) -> dict[str, Any]:
    """The measured ratios of `reports` against the simulator's, the agent benchmark's configurations simulated on
    `workers` workers stepping at the calibration's times (`agent_table`), for each workload the reports ran."""
    from agents_eval.sim import agent_table as agents

    loaded = load_reports(reports)
    measured = measured_ratios(loaded)
    simulated = simulated_disagg_ratio(calibration, loaded)
    for workload in sorted({name.split()[0] for name in measured if name != DISAGG_TPOT}):
        clusters = agents.agent_clusters(calibration, workers)
        load = agents.bench_load(workload, clusters[0].model, seed=seed)
        data = agents.agent_table(clusters, load, start_rate, steps)
        simulated.update(simulated_agent_ratios(workload, data["configurations"]))
    result = compare(simulated, measured, measured_brackets(loaded))
    return {**result, "goal": goal(result)}


def simulated_disagg_ratio(calibration: Path, reports: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """DISAGG_TPOT simulated (`interference`), on the workload of the first `bench disagg` report given and the real
    engine's scheduler settings at the benchmark's 512 batched tokens; empty when no such report is given."""
    from agents_eval.bench.disagg.workload import MAX_NUM_BATCHED_TOKENS, InterferenceWorkload
    from agents_eval.sim.calibration.fit import Calibration
    from agents_eval.sim.validation.absolute import engine_knobs
    from agents_eval.sim.validation.interference import p99_tpot_ratio

    report = next((r for r in reports if DISAGG_KEY in r), None)
    if report is None:
        return {}
    knobs = engine_knobs(Calibration.load(calibration).model)
    knobs = knobs.model_copy(update={"max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS})
    return {DISAGG_TPOT: p99_tpot_ratio(calibration, InterferenceWorkload.of(report), knobs)["ratio"]}
