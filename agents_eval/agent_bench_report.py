"""The report of `agentserve bench --workload`: per configuration its figures at the offered rate (`--rate`),
their ratios to the baseline, the goal check, the rate sweep; `report.json`, `report.md` and five plots:
`throughput_vs_rate.png`, `goodput_vs_rate.png`, `latency_cdf.png` (end to end), `ttft_cdf.png`,
`role_timeline.png`; and every request's record in `requests/<config>-x<fraction>.jsonl`."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agents_eval.agent_bench_gateway import LABELS
from agents_eval.agent_bench_metrics import RequestRecord, Slo, ratio, summarize
from agents_eval.agent_bench_run import PointResult
from agents_eval.report import (
    JSON_NAME,
    MARKDOWN_NAME,
    CdfChart,
    LineChart,
    ReportFiles,
    Table,
    save_cdf_chart,
    save_line_chart,
)

BASELINE = "baseline"
GOALS = {  # the project's claim, against the baseline: (figure, "min" or "max", target ratio)
    "agent": (("throughput", "min", 4.2), ("p99_latency", "max", 0.22)),
    "disaggregated": (("throughput", "min", 3.1),),
}
TIMELINE_STEP_S = 0.25


@dataclass(frozen=True)
class Point:
    config: str
    fraction: float  # of --rate
    offered_rate: float
    result: PointResult


def config_figures(point: Point, slo: Slo, price_per_worker_hour: float) -> dict[str, Any]:
    result = point.result
    figures = summarize(result.records, slo, result.workers, price_per_worker_hour, result.deltas)
    return {"label": LABELS[point.config], "offered_rate": point.offered_rate, **figures,
            "session_errors": result.session_errors, "split": result.capacity["split"],
            "split_source": result.capacity["source"], "capacity_enabled": result.capacity["enabled"],
            "capacity_events": result.capacity["events"], "role_timeline": result.timeline,
            "role_changes": max(0, len(result.timeline) - 1),
            "error_messages": dict(Counter(r.error for r in result.records if r.error).most_common(5)),
            "model_name": result.model_name}


def config_ratios(configs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    if BASELINE not in configs:
        return {}
    base = configs[BASELINE]
    keys = {"throughput": "throughput_rps", "goodput": "goodput_rps", "p99_latency": "p99_latency_s",
            "cost": "cost_per_1k_tokens"}
    return {f"{name}/{BASELINE}": {short: ratio(figures[key], base[key]) for short, key in keys.items()}
            for name, figures in configs.items() if name != BASELINE}


def goal_check(ratios: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    checks = []
    for config, goals in GOALS.items():
        measured_ratios = ratios.get(f"{config}/{BASELINE}")
        if measured_ratios is None:
            continue
        for figure, bound, target in goals:
            measured = measured_ratios[figure]
            met = measured >= target if bound == "min" else measured <= target
            checks.append({"config": config, "figure": figure, "bound": bound, "target": target,
                           "measured": measured, "met": bool(met), "shortfall": _shortfall(measured, target, bound)})
    return checks


def _shortfall(measured: float, target: float, bound: str) -> float:
    """How far from the target, as a factor (1.0: met): target/measured for a floor, measured/target for a cap."""
    if math.isnan(measured) or measured <= 0:
        return math.inf
    return max(1.0, target / measured if bound == "min" else measured / target)


def goal_lines(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for check in checks:
        word = "at least" if check["bound"] == "min" else "at most"
        figure = check["figure"].replace("_", " ")
        head = (f"{check['config']} {figure} is {check['measured']:.2f}x the baseline's (goal: {word} "
                f"{check['target']}x)")
        lines.append(f"- {head}: met." if check["met"] else
                     f"- {head}: **not met**, short by a factor of {check['shortfall']:.2f}.")
    return lines


def sweep_rows(points: Sequence[Point], slo: Slo, price: float) -> dict[str, list[dict[str, Any]]]:
    sweep: dict[str, list[dict[str, Any]]] = {}
    for point in sorted(points, key=lambda p: p.offered_rate):
        figures = config_figures(point, slo, price)
        keep = ("offered_rate", "throughput_rps", "goodput_rps", "slo_attainment", "p99_latency_s",
                "cost_per_1k_tokens", "requests_sent", "errors")
        sweep.setdefault(point.config, []).append({"fraction": point.fraction, **{k: figures[k] for k in keep}})
    return sweep


def _num(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}g}"


def main_table(configs: Mapping[str, Mapping[str, Any]]) -> Table:
    rows = [[c["label"], _num(c["throughput_rps"]), f"{_num(c['p99_latency_s'])} s", _num(c["cost_per_1k_tokens"])]
            for c in configs.values()]
    return Table("Agent benchmark", ["configuration", "throughput (req/s)", "p99 latency", "cost ($/1k tokens)"],
                 rows)


def detail_table(configs: Mapping[str, Mapping[str, Any]]) -> Table:
    headers = ["configuration", "sent", "errors", "goodput (req/s)", "SLO attained", "output tok/s", "TTFT p50/p99 s",
               "TPOT p50/p99 s", "e2e p50 s", "KV hit", "prefix hit", "prefilled tokens", "pruned", "masked",
               "workers"]
    rows = []
    for c in configs.values():
        ttft, tpot = c["latency"]["ttft"], c["latency"]["tpot"]
        split = ", ".join(f"{role} {n}" for role, n in c["split"].items())
        rows.append([c["label"], str(c["requests_sent"]), str(c["errors"] + len(c["session_errors"])),
                     _num(c["goodput_rps"]), _num(c["slo_attainment"]), _num(c["output_tokens_per_s"]),
                     f"{_num(ttft['p50'])} / {_num(ttft['p99'])}", f"{_num(tpot['p50'])} / {_num(tpot['p99'])}",
                     _num(c["p50_latency_s"]), _num(c["kv_hit_ratio"]), _num(c["prefix_hit_ratio"]),
                     f"{c['prefill_tokens']:.0f}", f"{c['pruned_tokens']:.0f}", f"{c['masked_tokens']:.0f}", split])
    return Table("Details", headers, rows)


def ratio_table(ratios: Mapping[str, Mapping[str, float]]) -> Table:
    rows = [[name, *(f"{_num(values[k])}x" for k in ("throughput", "goodput", "p99_latency", "cost"))]
            for name, values in ratios.items()]
    return Table("Ratios to the baseline", ["ratio", "throughput", "goodput", "p99 latency", "cost"], rows)


def sweep_table(sweep: Mapping[str, Sequence[Mapping[str, Any]]]) -> Table:
    rows = [[LABELS[config], _num(row["offered_rate"]), _num(row["throughput_rps"]), _num(row["goodput_rps"]),
             _num(row["slo_attainment"]), f"{_num(row['p99_latency_s'])} s"]
            for config, config_rows in sweep.items() for row in config_rows]
    return Table("Throughput against offered rate", ["configuration", "offered rate (sessions/s)",
                                                     "throughput (req/s)", "goodput (req/s)", "SLO attained",
                                                     "p99 latency"], rows)


def rate_chart(sweep: Mapping[str, Sequence[Mapping[str, Any]]], figure: str) -> LineChart:
    """`throughput` or `goodput` (requests/s) of every configuration against the offered rate."""
    rates = sorted({row["offered_rate"] for rows in sweep.values() for row in rows})
    series: dict[str, list[float]] = {}
    for config, rows in sweep.items():
        by_rate = {row["offered_rate"]: row[f"{figure}_rps"] for row in rows}
        series[config] = [by_rate.get(rate, math.nan) for rate in rates]
    return LineChart(f"{figure}_vs_rate.png", f"{figure.capitalize()} against offered rate",
                     "offered rate (sessions/s)", "requests/s", rates, series)


def latency_charts(records: Mapping[str, Sequence[RequestRecord]]) -> list[CdfChart]:
    def samples(field: str) -> dict[str, list[float]]:
        return {c: [v for r in rs if r.ok and (v := getattr(r, field)) is not None] for c, rs in records.items()}

    return [CdfChart("latency_cdf.png", "End-to-end latency per request", "seconds", samples("e2e_s"), log_x=True),
            CdfChart("ttft_cdf.png", "Time to first token per request", "seconds", samples("ttft_s"), log_x=True)]


def timeline_chart(configs: Mapping[str, Mapping[str, Any]]) -> LineChart:
    """Workers per role over the run, every config on one time grid (the last split holds until the end)."""
    end = max((c["window_s"] for c in configs.values()), default=0.0)
    grid = [i * TIMELINE_STEP_S for i in range(int(end / TIMELINE_STEP_S) + 2)]
    series: dict[str, list[float]] = {}
    for config, figures in configs.items():
        timeline = figures["role_timeline"] or [(0.0, figures["split"])]
        roles = sorted({role for _, split in timeline for role in split})
        for role in roles:
            series[f"{config}: {role}"] = [_split_at(timeline, t).get(role, 0) for t in grid]
    return LineChart("role_timeline.png", "Workers per role during the run", "seconds from the run's start",
                     "workers", grid, series)


def _split_at(timeline: Sequence[tuple[float, Mapping[str, int]]], t: float) -> Mapping[str, int]:
    current = timeline[0][1]
    for at, split in timeline:
        if at > t:
            break
        current = split
    return current


def markdown(report: Mapping[str, Any], notes: Sequence[str]) -> str:
    """The headline table, the ratios and the goal check first; then details, the sweep, the notes."""
    configs, sweep = report["configs"], report["sweep"]
    sections = [f"# Agent benchmark: {report['workload']['name']}\n", main_table(configs).to_markdown(),
                ratio_table(report["ratios"]).to_markdown(),
                "## Goal check\n\nSame workload and SLO for every configuration.\n\n"
                + "\n".join(goal_lines(report["goal"]) or ["- no baseline in this run: nothing to compare"]) + "\n",
                detail_table(configs).to_markdown()]
    if any(len(rows) > 1 for rows in sweep.values()):
        sections.append(sweep_table(sweep).to_markdown())
    sections.append("## Notes\n\n" + "\n".join(f"- {note}" for note in notes) + "\n")
    return "\n".join(sections)


def finite(value: Any) -> Any:
    """JSON without NaN or infinity (not JSON): None instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def write(out_dir: Path, report: dict[str, Any], points: Sequence[Point], notes: Sequence[str]) -> ReportFiles:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out_dir / JSON_NAME, out_dir / MARKDOWN_NAME, out_dir / "throughput_vs_rate.png")
    files.json.write_text(json.dumps(finite(report), indent=2) + "\n")
    files.markdown.write_text(markdown(report, notes))
    save_line_chart(rate_chart(report["sweep"], "throughput"), files.chart)
    save_line_chart(rate_chart(report["sweep"], "goodput"), out_dir / "goodput_vs_rate.png")
    headline = {p.config: p.result.records for p in points if p.fraction == 1.0}
    for chart in latency_charts(headline):
        save_cdf_chart(chart, out_dir / chart.filename)
    save_line_chart(timeline_chart(report["configs"]), out_dir / "role_timeline.png")
    write_records(out_dir / "requests", points)
    return files


def write_records(folder: Path, points: Sequence[Point]) -> None:
    """Every request of every point, one JSON object a line: `requests/<config>-x<fraction>.jsonl`."""
    folder.mkdir(parents=True, exist_ok=True)
    for point in points:
        lines = [json.dumps(finite(asdict(r))) for r in point.result.records]
        (folder / f"{point.config}-x{point.fraction:g}.jsonl").write_text("".join(f"{line}\n" for line in lines))
