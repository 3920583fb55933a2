"""The plots of `agentserve bench --workload`: throughput, goodput and SLO attainment against the offered rate
(every point measured: the `--rate-sweep`, or the SLO-rate search's probes, with the attainment target drawn),
end-to-end latency and TTFT CDFs at each configuration's headline point, and the workers per role over the run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agents_eval.harness.report import CdfChart, LineChart, save_cdf_chart, save_line_chart
from agents_eval.harness.stats import RequestRecord

THROUGHPUT = "throughput_vs_rate.png"
TIMELINE_STEP_S = 0.25
RATE_LABEL = "offered rate (sessions/s)"


@dataclass(frozen=True)
class RateChart:
    """One line per configuration over its own rates (the search probes each configuration at its own)."""

    filename: str
    title: str
    ylabel: str
    series: Mapping[str, Sequence[tuple[float, float]]]
    target: float | None = None  # a horizontal line (the SLO attainment target)


def rate_chart(sweep: Mapping[str, Sequence[Mapping[str, Any]]], key: str, filename: str, title: str, ylabel: str,
               target: float | None = None) -> RateChart:
    series = {config: [(row["offered_rate"], row[key]) for row in rows] for config, rows in sweep.items()}
    return RateChart(filename, title, ylabel, series, target)


def save_rate_chart(chart: RateChart, path: Path) -> None:
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for label, points in chart.series.items():
        ordered = sorted((x, y) for x, y in points if y is not None)
        axes.plot([x for x, _ in ordered], [y for _, y in ordered], marker="o", markersize=4, label=label)
    if chart.target is not None:
        axes.axhline(chart.target, color="grey", linestyle="--", label=f"target {chart.target:.0%}")
    axes.set_title(chart.title)
    axes.set_xlabel(RATE_LABEL)
    axes.set_ylabel(chart.ylabel)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)


def rate_charts(sweep: Mapping[str, Sequence[Mapping[str, Any]]], target: float) -> list[RateChart]:
    return [rate_chart(sweep, "throughput_rps", THROUGHPUT, "Throughput against offered rate", "requests/s"),
            rate_chart(sweep, "goodput_rps", "goodput_vs_rate.png", "Goodput against offered rate", "requests/s"),
            rate_chart(sweep, "slo_attainment", "attainment_vs_rate.png", "SLO attainment against offered rate",
                       "share of requests meeting the SLO", target)]


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


def save_all(out_dir: Path, report: Mapping[str, Any], headline: Mapping[str, Sequence[RequestRecord]]) -> None:
    for chart in rate_charts(report["sweep"], report["settings"]["slo_target"]):
        save_rate_chart(chart, out_dir / chart.filename)
    for cdf in latency_charts(headline):
        save_cdf_chart(cdf, out_dir / cdf.filename)
    save_line_chart(timeline_chart(report["configurations"]), out_dir / "role_timeline.png")
