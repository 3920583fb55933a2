"""Benchmark reports: `report.json` with every figure, `report.md` with markdown tables, a PNG bar or line chart.

Every benchmark writes through `write_report`. A report's `goals` is one list, one object per goal:
`{"name", "target", "bound": "min" | "max", "measured", "met"}` (a benchmark may keep its own keys beside
those); `goal` builds one, and `write_report` refuses a `goals` of any other shape. The chart is drawn on a
bare matplotlib `Figure` (Agg canvas), so no pyplot state or global backend is touched.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

JSON_NAME = "report.json"
MARKDOWN_NAME = "report.md"


def finite(value: Any) -> Any:
    """JSON without NaN or infinity (not JSON): None instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


@dataclass(frozen=True)
class Table:
    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]

    def to_markdown(self) -> str:
        lines = [_row(self.headers), _row(["---"] * len(self.headers))]
        lines += [_row(row) for row in self.rows]
        return f"## {self.title}\n\n" + "\n".join(lines) + "\n"


@dataclass(frozen=True)
class BarChart:
    filename: str
    title: str
    ylabel: str
    labels: Sequence[str]
    values: Sequence[float]


@dataclass(frozen=True)
class LineChart:
    """One line per series over the same x values (e.g. per-turn latency of two modes)."""

    filename: str
    title: str
    xlabel: str
    ylabel: str
    x: Sequence[float]
    series: Mapping[str, Sequence[float]]
    integer_x: bool = False  # ticks on whole numbers only (turns, steps)


@dataclass(frozen=True)
class ReportFiles:
    json: Path
    markdown: Path
    chart: Path


def check_settings(checks: Sequence[tuple[bool, str]]) -> None:
    """A benchmark's settings: ValueError with the message of the first check that fails."""
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def machine_info() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "load_average": list(os.getloadavg()),  # 1, 5, 15 minutes: other work on the machine skews timings
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def markdown_document(title: str, tables: Sequence[Table], notes: Sequence[str] = ()) -> str:
    body = "\n".join(table.to_markdown() for table in tables)
    return f"# {title}\n\n" + "".join(f"> {note}\n\n" for note in notes) + body


def save_bar_chart(chart: BarChart, path: Path) -> None:
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    bars = axes.bar(list(chart.labels), list(chart.values), color="tab:blue")
    axes.bar_label(bars, fmt="%.0f")
    axes.set_title(chart.title)
    axes.set_ylabel(chart.ylabel)
    axes.margins(y=0.15)
    figure.savefig(path, dpi=120)


def save_line_chart(chart: LineChart, path: Path) -> None:
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for label, values in chart.series.items():
        axes.plot(list(chart.x), list(values), marker="o", markersize=3, label=label)
    axes.set_title(chart.title)
    axes.set_xlabel(chart.xlabel)
    axes.set_ylabel(chart.ylabel)
    axes.set_ylim(bottom=0)
    if chart.integer_x:
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)


GOAL_KEYS = ("name", "target", "bound", "measured", "met")
BOUNDS = ("min", "max")


def goal(name: str, target: float, bound: str, measured: float | None, **extra: Any) -> dict[str, Any]:
    """One goal: met when `measured` is at least (`bound="min"`) or at most (`"max"`) `target`; a goal with
    nothing measured (None, nan) is not met. `extra` keys go beside the five."""
    if bound not in BOUNDS:
        raise ValueError(f"a goal's bound is 'min' or 'max', not {bound!r}")
    known = measured is not None and not (isinstance(measured, float) and math.isnan(measured))
    met = known and (measured >= target if bound == "min" else measured <= target)  # type: ignore[operator]
    return {"name": name, "target": target, "bound": bound, "measured": measured, "met": bool(met), **extra}


def check_goals(goals: Any) -> None:
    """ValueError unless `goals` is a list of goal objects, each with the five keys and a known bound."""
    if not isinstance(goals, list):
        raise ValueError(f"a report's goals is a list of goal objects, not {type(goals).__name__}")
    for item in goals:
        missing = [key for key in GOAL_KEYS if not isinstance(item, Mapping) or key not in item]
        if missing or item["bound"] not in BOUNDS:
            raise ValueError(f"a goal needs {GOAL_KEYS} with bound in {BOUNDS}; {item!r} misses {missing}")


def write_report(out_dir: Path, data: dict[str, Any], title: str, tables: Sequence[Table],
                 chart: BarChart | LineChart | None, notes: Sequence[str] = (),
                 markdown: str | None = None) -> ReportFiles:
    """`report.json` (non-finite numbers as null), `report.md` (`markdown`, or the tables and notes under
    `title`) and the chart, if any, in `out_dir`."""
    if isinstance(data.get("goals"), list):
        check_goals(data["goals"])
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out_dir / JSON_NAME, out_dir / MARKDOWN_NAME, out_dir / (chart.filename if chart else ""))
    files.json.write_text(json.dumps(finite(data), indent=2) + "\n")
    files.markdown.write_text(markdown if markdown is not None else markdown_document(title, tables, notes))
    if isinstance(chart, LineChart):
        save_line_chart(chart, files.chart)
    elif chart is not None:
        save_bar_chart(chart, files.chart)
    return files


@dataclass(frozen=True)
class CdfChart:
    """One empirical CDF per series (e.g. request latency per configuration): the share of samples at or below x."""

    filename: str
    title: str
    xlabel: str
    samples: Mapping[str, Sequence[float]]
    log_x: bool = False


def save_cdf_chart(chart: CdfChart, path: Path) -> None:
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for label, values in chart.samples.items():
        ordered = sorted(values)
        if ordered:
            shares = [(rank + 1) / len(ordered) for rank in range(len(ordered))]
            axes.step(ordered, shares, where="post", label=f"{label} (n={len(ordered)})")
    if chart.log_x:
        axes.set_xscale("log")
    axes.set_title(chart.title)
    axes.set_xlabel(chart.xlabel)
    axes.set_ylabel("share of requests at or below")
    axes.set_ylim(0, 1.02)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)
