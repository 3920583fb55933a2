"""Figures of the sparse-history benchmark: step times per shape and variant, speed-ups over the dense step,
the goal, tables and a chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents_eval.harness.report import BarChart, ReportFiles, Table, write_report

DENSE = "skip_0"
HALF = "skip_0.5"
GOAL_SPEEDUP = 1.5


def with_speedups(result: dict[str, Any], refresh_steps: int) -> dict[str, Any]:
    """Each variant's dense median over its own; for the query policy, its refresh step spread over
    refresh_steps decode steps that attend like the half-skipped step."""
    timings = result["timings"]
    dense = timings[DENSE]["median_s"]
    speedups = {name: dense / t["median_s"] for name, t in timings.items() if name != DENSE}
    if "query_refresh" in timings and HALF in timings:
        half, refresh = timings[HALF]["median_s"], timings["query_refresh"]["median_s"]
        amortized = half + (refresh - half) / refresh_steps
        result["query_amortized_step_s"] = amortized
        speedups["query_amortized"] = dense / amortized
    return {**result, "speedup_over_dense": speedups}


def _goal_case(report: dict[str, Any]) -> dict[str, Any] | None:
    decodes = [c for c in report["cases"] if c["new_tokens"] == 1]
    return max(decodes, key=lambda c: (c["batch"], c["context"]), default=None)


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    case = _goal_case(report)
    measured = None if case is None else case["speedup_over_dense"].get(HALF)
    name = ("decode step speed-up over dense, half the history blocks skipped" if case is None else
            f"decode step speed-up over dense, batch {case['batch']}, {case['context']} tokens, half skipped")
    return [{"name": name, "target": GOAL_SPEEDUP, "bound": "min", "measured": measured,
             "met": measured is not None and measured >= GOAL_SPEEDUP}]


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _table(report: dict[str, Any], decode: bool) -> Table:
    cases = [c for c in report["cases"] if (c["new_tokens"] == 1) == decode]
    variants = [v for v in cases[0]["timings"] if v != DENSE] if cases else []
    extra = ["query_amortized"] if decode and cases and "query_amortized" in cases[0]["speedup_over_dense"] else []
    rows = []
    for c in cases:
        times = [_fmt(c["timings"][v]["median_s"], 1000, 1) for v in [DENSE, *variants]]
        speedups = [_fmt(c["speedup_over_dense"].get(v)) for v in [*variants, *extra]]
        rows.append([str(c["batch"]), str(c["context"]), *times, *speedups])
    headers = ["batch", "context", *(f"{v} ms" for v in [DENSE, *variants]), *(f"{v} x" for v in [*variants, *extra])]
    title = "Decode step (one token per stream)" if decode else "Prefill chunk (new tokens after the history)"
    return Table(f"{title}: median ms, speed-up over dense", headers, rows)


def _chart(report: dict[str, Any]) -> BarChart:
    labels, values = [], []
    for c in report["cases"]:
        kind = "decode" if c["new_tokens"] == 1 else "prefill"
        labels.append(f"{kind}\nb{c['batch']} {c['context'] // 1024}k")
        values.append(c["speedup_over_dense"].get(HALF) or 0.0)
    return BarChart("speedup.png", "Speed-up over dense with half the history blocks skipped", "x", labels, values)


def notes(report: dict[str, Any]) -> list[str]:
    s, machine = report["settings"], report["machine"]
    return [f"{report['model']}, float32, {s['num_threads']} torch threads, on a machine with load average "
            f"{machine['load_average'][0]:.1f} over {machine['cpu_count']} cores (shared): dense and sparse steps "
            f"alternate, {s['decode_repeats']} decode and {s['prefill_repeats']} prefill rounds after a warm-up "
            "one; figures are medians.",
            "dense (skip_0) is the engine's kernel today: each stream's consecutive cache slots read in place. "
            "Skipped blocks are left out of the attended slots (gathered), so they cost no reads nor FLOPs.",
            "History K/V are seeded random values, not a prefill's (attention costs the same); each stream owns "
            "its blocks. The first block and the last 256 tokens are never skipped; skipped_share in report.json "
            "is the share actually skipped (short contexts cannot skip 75%).",
            "skip_one_block: one block skipped, so the rest goes through the gathered (block-sparse) path: "
            "how much of a speed-up comes from gathering the history rather than reading it in place.",
            "query_refresh: a decode step of the query policy that scores the blocks (their summaries kept from "
            "the warm-up round); its picks apply from the next position, and the timed step repeats the same one, "
            "so it reads the whole history: it is a dense step plus the scoring. query_amortized spreads its "
            f"cost over {s['refresh_steps']} steps that attend like skip_0.5, an upper bound of the policy's step.",
            f"prefill: {s['prefill_tokens']} new tokens per stream after the history, the skipped blocks masked "
            "for the whole chunk."]


def write(out_dir: Path, report: dict[str, Any]) -> ReportFiles:
    goal_rows = [[g["name"], f">= {g['target']}", _fmt(g["measured"]), "yes" if g["met"] else "MISSED"]
                 for g in report["goals"]]
    tables = [_table(report, True), _table(report, False),
              Table("Goal", ["goal", "target", "measured", "met"], goal_rows)]
    return write_report(out_dir, report, "agentserve sparse-history benchmark: block-sparse attention against dense",
                        tables, _chart(report), notes(report))
