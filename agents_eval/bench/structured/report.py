"""The structured-outputs benchmark's report: `report.json` (figures, goals, sample replies), `report.md` and
`validity.png` (valid share with and without constraints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents_eval.harness.report import BarChart, ReportFiles, Table, write_report

GOALS = (  # name, target, bound (the measured value must be at least / at most the target), where in the figures
    ("tool_calls_valid_share_required", 1.0, "min", ("validity", "tool_calls_required", "valid_share")),
    ("json_schema_valid_share", 1.0, "min", ("validity", "json_schema_constrained", "valid_share")),
    ("mask_share_of_step_batch_many", 0.05, "max", ("cost", "batch_many", "mask_share_of_step")),
    ("jump_forward_speedup_batch_1", 1.5, "min", ("cost", "batch_1", "jump_forward_speedup")),
)


def goals(figures: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, target, bound, path in GOALS:
        value: Any = figures
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        met = value is not None and (value >= target if bound == "min" else value <= target)
        rows.append({"name": name, "target": target, "bound": bound, "measured": value, "met": met})
    return rows


def _show(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def tables(figures: dict[str, Any], checks: list[dict[str, Any]]) -> list[Table]:
    validity = figures["validity"]
    cost_keys = ("batch_size", "unconstrained_tokens_per_s", "constrained_tokens_per_s", "jump_forward_tokens_per_s",
                 "throughput_overhead", "mask_ms_per_step", "median_step_ms_constrained", "mask_share_of_step",
                 "jump_forward_speedup", "forced_tokens", "output_tokens", "same_text_share")
    batches = sorted(figures["cost"])
    return [
        Table("Validity", ["replies", "valid share", "n"],
              [[name, _show(v["valid_share"]), str(v["replies"])] for name, v in validity.items()]),
        Table("Cost (tool-call outputs, greedy)", ["figure", *batches],
              [[key, *(_show(figures["cost"][b][key]) for b in batches)] for key in cost_keys]),
        Table("Goals", ["goal", "target", "bound", "measured", "met"],
              [[g["name"], _show(g["target"]), g["bound"], _show(g["measured"]), "yes" if g["met"] else "MISSED"]
               for g in checks]),
    ]


def write(out: Path, data: dict[str, Any], notes: list[str]) -> ReportFiles:
    validity = data["figures"]["validity"]
    chart = BarChart("validity.png", "Valid replies (%)", "% valid", list(validity),
                     [100 * v["valid_share"] for v in validity.values()])
    return write_report(out, data, "agentserve structured outputs", tables(data["figures"], data["goals"]), chart,
                        notes)
