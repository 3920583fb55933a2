"""Figures of the batcher benchmark: TTFT and TPOT percentiles per request kind and policy, in wall seconds
and in engine steps, the SLO/FCFS ratios, and how evenly agent sessions were served."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agents_eval.bench.batcher.drive import RequestTiming
from agents_eval.bench.batcher.workload import AGENT, KINDS
from agents_eval.report import BarChart, ReportFiles, Table, write_report
from engine.core.slo import SloClass

ALL = "all"
POLICIES = ("fcfs", "slo")  # in the order they run
METRICS = ("ttft_s", "tpot_s", "ttft_steps", "tpot_steps")


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}


def _figures(timings: Sequence[RequestTiming], targets: Mapping[str, SloClass]) -> dict[str, Any]:
    figures: dict[str, Any] = {"n": len(timings)}
    for metric in METRICS:
        values = [v for v in (getattr(t, metric) for t in timings) if v is not None]
        figures[metric] = _percentiles(values)
    met = [t.ttft_s <= targets[t.kind].ttft_s for t in timings]
    figures["ttft_slo_met"] = sum(met) / len(met) if met else None
    return figures


def _session_ttft(timings: Sequence[RequestTiming]) -> dict[str, float]:
    by_session: dict[str, list[float]] = {}
    for timing in timings:
        if timing.session_id is not None and timing.kind == AGENT:
            by_session.setdefault(timing.session_id, []).append(timing.ttft_steps)
    return {key: float(np.mean(values)) for key, values in sorted(by_session.items())}


def policy_json(timings: Sequence[RequestTiming], targets: Mapping[str, SloClass], wall_s: float, steps: int,
                preemptions: int) -> dict[str, Any]:
    """Figures per request kind; targets: each kind's SLO class, for the share that met its TTFT target."""
    kinds = {kind: _figures([t for t in timings if t.kind == kind], targets) for kind in KINDS}
    return {"wall_s": wall_s, "steps": steps, "num_preemptions": preemptions,
            "kinds": kinds | {ALL: _figures(timings, targets)}, "session_mean_ttft_steps": _session_ttft(timings)}


def _ratio(slo: float | None, fcfs: float | None) -> float | None:
    return None if slo is None or not fcfs else slo / fcfs


def ratios(policies: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """p99 under SLO over p99 under FCFS, per kind and metric: below 1 is better."""
    out: dict[str, dict[str, float | None]] = {}
    for kind in (*KINDS, ALL):
        fcfs, slo = policies["fcfs"]["kinds"][kind], policies["slo"]["kinds"][kind]
        out[kind] = {metric: _ratio(slo[metric]["p99"], fcfs[metric]["p99"]) for metric in METRICS}
    return out


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _latency_table(report: dict[str, Any]) -> Table:
    rows = []
    for kind in (*KINDS, ALL):
        for policy in POLICIES:
            f = report["policies"][policy]["kinds"][kind]
            rows.append([kind, policy, str(f["n"]), _fmt(f["ttft_s"]["p50"]), _fmt(f["ttft_s"]["p99"]),
                         _fmt(f["tpot_s"]["p50"], 1000, 1), _fmt(f["tpot_s"]["p99"], 1000, 1),
                         _fmt(f["ttft_steps"]["p99"], digits=0), _fmt(f["tpot_steps"]["p99"]),
                         _fmt(f["ttft_slo_met"], 100, 0)])
    headers = ["kind", "policy", "requests", "TTFT p50 s", "TTFT p99 s", "TPOT p50 ms", "TPOT p99 ms",
               "TTFT p99 steps", "TPOT p99 steps", "TTFT SLO met %"]
    return Table("Latency per request kind", headers, rows)


def _ratio_table(report: dict[str, Any]) -> Table:
    rows = [[kind, *(_fmt(r[metric]) for metric in METRICS)] for kind, r in report["ratios"].items()]
    return Table("p99 under SLO / p99 under FCFS (below 1: SLO is better)",
                 ["kind", "TTFT (wall)", "TPOT (wall)", "TTFT (steps)", "TPOT (steps)"], rows)


def _fairness_table(report: dict[str, Any]) -> Table:
    rows = []
    for policy in POLICIES:
        data = report["policies"][policy]
        means = data["session_mean_ttft_steps"].values()
        rows.append([policy, _fmt(max(means), digits=1), _fmt(min(means), digits=1),
                     _fmt(max(means) / min(means)), str(data["num_preemptions"]), str(data["steps"]),
                     _fmt(data["wall_s"], digits=1), _fmt(data["wall_s"] / data["steps"], 1000, 1)])
    return Table("Non-VIP agent sessions, and the runs", ["policy", "worst session mean TTFT steps", "best",
                                                          "worst / best", "preemptions", "steps", "wall s",
                                                          "ms per step"], rows)


def _chart(report: dict[str, Any]) -> BarChart:
    labels, values = [], []
    for kind in (*KINDS, ALL):
        for policy in POLICIES:
            labels.append(f"{kind}\n{policy}")
            values.append((report["policies"][policy]["kinds"][kind]["ttft_s"]["p99"] or 0.0) * 1000)
    return BarChart("ttft_p99.png", "p99 time to first token, FCFS against SLO", "ms", labels, values)


def notes(report: dict[str, Any]) -> list[str]:
    load = report["machine"]["load_average"][0]
    scale = report["settings"]["slo_scale"]
    return [f"Wall times on a machine with load average {load:.1f} over {report['machine']['cpu_count']} cores: "
            "compare ratios and step counts, not absolute times.",
            f"SLO targets are configs/slo.yaml's times {scale:g} (chat: interactive, agents: normal, one VIP "
            "session: vip). TPOT targets are not scored: they are below one step of a loaded CPU.",
            "Arrivals are counted in engine steps, so both policies are offered the same load."]


def write(out_dir: Path, report: dict[str, Any]) -> ReportFiles:
    tables = [_latency_table(report), _ratio_table(report), _fairness_table(report)]
    return write_report(out_dir, report, "agentserve batcher benchmark: SLO against FCFS", tables,
                        _chart(report), notes(report))
