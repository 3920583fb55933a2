"""The campaign's report: the figures with their goals (lost, duplicated, corrupted sessions and leaked KV
blocks all 0), the fault timeline, what each attempt got, and a chart of turns completed and attempts
refused per second with the faults marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents_eval.bench.faults.campaign import CampaignResult, CampaignSettings
from agents_eval.harness.report import LineChart, ReportFiles, Table, goal, write_report

ZERO_GOALS = ("lost", "duplicated", "sessions_corrupted", "kv_blocks_leaked")
BIN_S = 2.0


def goals(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Each count that must stay 0; the campaign's baseline is the same sessions without faults, which lose,
    duplicate, corrupt and leak nothing by construction."""
    return [goal(name, 0, "max", figures[name], figure=name) for name in ZERO_GOALS]


def per_second(result: CampaignResult, duration_s: float) -> LineChart:
    bins = int(duration_s // BIN_S) + 1
    completed, refused = [0.0] * bins, [0.0] * bins
    for turn in result.turns:
        for label, at in zip(turn.attempts, turn.attempt_times, strict=True):
            index = min(bins - 1, max(0, int((at - result.start) // BIN_S)))
            (completed if label == "200" else refused)[index] += 1 / BIN_S
    faults = "; ".join(f"{t:.0f}s {what}" for t, what in result.timeline)
    return LineChart("faults.png", f"Turns under faults ({faults})", "seconds from start", "per second",
                     [i * BIN_S for i in range(bins)], {"completed": completed, "refused or cut": refused})


def write(out: Path, settings: CampaignSettings, result: CampaignResult, wall_s: float) -> ReportFiles:
    figures = result.figures()
    checks = goals(figures)
    data = {"settings": vars(settings), "figures": figures, "goals": checks, "audit": result.audit,
            "timeline": [{"at_s": round(t, 2), "fault": what} for t, what in result.timeline],
            "kv_blocks": {"idle": result.kv_blocks_idle, "after": result.kv_blocks_after}, "wall_s": round(wall_s, 1)}
    rows = [[name, str(value)] for name, value in figures.items() if name != "attempt_outcomes"]
    tables = [
        Table("Figures", ["figure", "value"], rows),
        Table("Goals", ["figure", "goal", "value", "met"],
              [[c["figure"], "0", str(c["measured"]), "yes" if c["met"] else "MISSED"] for c in checks]),
        Table("Faults", ["at (s)", "fault"], [[f"{t:.1f}", what] for t, what in result.timeline]),
        Table("Attempts", ["outcome", "count"], [[k, str(v)] for k, v in figures["attempt_outcomes"].items()]),
    ]
    notes = [f"{figures['sessions']} agent sessions (Responses HTTP, chat streamed, Responses WebSocket) over "
             f"{settings.duration_s:.0f} s on two replicas sharing one Redis; {wall_s:.0f} s in all."]
    return write_report(out, data, "Faults under load", tables, per_second(result, settings.duration_s), notes)
