"""report.json, report.md and agents.png of a closed-loop run, through the harness's `write_report`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents_eval.harness.report import BarChart, ReportFiles, Table, write_report


def _ms(value: Any) -> str:
    return "-" if value is None or value != value else f"{value * 1000:.0f}"


def _held(figures: dict[str, Any]) -> str:
    """The most agents held; ">= N" where the time budget stopped the steps first."""
    return (">= " if figures["agents_held_is_lower_bound"] else "") + str(figures["agents_held"])


def _tables(report: dict[str, Any]) -> list[Table]:
    configs = report["configurations"]
    rows = [[name, _held(c), "-" if c["batch"]["completion_s"] is None else f"{c['batch']['completion_s']:.1f}",
             _ms(c["light_load"]["per_call_s_p50"]), _ms(c["light_load"]["ttft_s_p50"]),
             _ms(c["light_load"]["tpot_s_p50"])] for name, c in configs.items()]
    steps = [[name, str(s["agents"]), "yes" if s["held"] else "no", f"{s['slo_attainment']:.2f}",
              f"{s['calls_per_s']:.2f}", _ms(s["ttft_s_p90"]), _ms(s["tpot_s_p90"]), str(s["errors"])]
             for name, c in configs.items() for s in c["steps"]]
    goal_rows = [[g["name"], f"{g['target']:g} ({g['bound']})",
                  "-" if g["measured"] is None or g["measured"] != g["measured"] else f"{g['measured']:.2f}",
                  "met" if g["met"] else "missed"] for g in report["goals"]]
    return [Table("Deployments", ["deployment", "agents within SLO", "batch completion s", "light per-call ms",
                                  "light TTFT ms", "light TPOT ms"], rows),
            Table("Agent-count steps", ["deployment", "agents", "held", "SLO share", "calls/s", "TTFT p90 ms",
                                        "TPOT p90 ms", "errors"], steps),
            Table("Goals", ["goal", "target", "measured", ""], goal_rows)]


def write(out_dir: Path, report: dict[str, Any]) -> ReportFiles:
    slo = report["slo"]
    notes = [f"SLO: TTFT {slo['ttft_s'] * 1000:.0f} ms, TPOT {slo['tpot_s'] * 1000:.0f} ms ({slo['how']}).",
             f"Order run: {', '.join(report['order'])}. Load average at start "
             f"{report['machine'].get('load_average')}, at end {[round(x, 2) for x in report['load_average_at_end']]}."]
    configs = report["configurations"]
    chart = BarChart("agents.png", "Concurrent agents within the SLO", "agents", list(configs),
                     [float(c["agents_held"]) for c in configs.values()])
    return write_report(out_dir, report, f"Closed loop: {report['workload']['name']}", _tables(report), chart, notes)
