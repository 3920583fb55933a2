"""The simulator's plots: SLO attainment against load per configuration, and the role split through a swing.
Drawn on bare matplotlib Figures (Agg canvas), as agents_eval.harness.report does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agents_eval.sim.experiments import ATTAINMENT_GOAL


def attainment_plot(curves: Mapping[str, Sequence[tuple[float, float]]], path: Path,
                    xlabel: str = "load (requests/s)") -> None:
    """curves: configuration -> (load, attainment) points."""
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for name, points in curves.items():
        ordered = sorted(points)
        axes.plot([x for x, _ in ordered], [y for _, y in ordered], marker="o", markersize=3, label=name)
    axes.axhline(ATTAINMENT_GOAL, color="grey", linestyle="--", linewidth=1, label="90% goal")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("SLO attainment (TTFT and TPOT)")
    axes.set_ylim(0, 1.02)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)


def role_timeline(splits: Sequence[tuple[float, int, int]], windows: Sequence[Mapping[str, object]], end_s: float,
                  path: Path) -> None:
    """Prefill workers over time (a step line), think windows shaded."""
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for window in windows:
        if window["phase"] == "think":
            axes.axvspan(float(window["start_s"]), min(float(window["end_s"]), end_s),  # type: ignore[arg-type]
                         color="tab:orange", alpha=0.15)
    times = [at for at, _, _ in splits] + [end_s]
    prefill = [p for _, p, _ in splits]
    axes.step(times, prefill + prefill[-1:], where="post", label="prefill workers")
    decode = [d for _, _, d in splits]
    axes.step(times, decode + decode[-1:], where="post", label="decode workers")
    axes.set_xlabel("simulated time (s); shaded: think-heavy windows")
    axes.set_ylabel("workers")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)
