"""The one chart of `agentserve bench peer`: a panel per metric, a bar per configuration (llama.cpp in
grey), drawn on a bare matplotlib `Figure` as `agents_eval.harness.report` does."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agents_eval.bench.peer.report import METRICS
from agents_eval.bench.peer.settings import PEERS

CHART_NAME = "peer.png"
COLUMNS = 3


def _label(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def save_chart(table: Mapping[str, Mapping[str, float]], title: str, path: Path) -> None:
    rows = -(-len(METRICS) // COLUMNS)
    figure = Figure(figsize=(4.2 * COLUMNS, 3.4 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    configs = list(table)
    colors = ["tab:gray" if c in PEERS else f"C{i}" for i, c in enumerate(configs)]
    for axes, metric in zip(figure.subplots(rows, COLUMNS).flat, METRICS, strict=False):
        values = [table[c][metric.key] * metric.scale for c in configs]
        bars = axes.bar(range(len(configs)), values, color=colors)
        axes.bar_label(bars, labels=[_label(v) for v in values], fontsize=8)
        axes.set_xticks(range(len(configs)), [c.removeprefix("agentserve-") for c in configs], fontsize=8)
        better = "higher" if metric.higher_is_better else "lower"
        axes.set_title(f"{metric.label} ({better} is better)", fontsize=10)
        axes.set_ylabel(metric.unit)
        axes.margins(y=0.18)
    figure.suptitle(title)
    figure.savefig(path, dpi=110)
