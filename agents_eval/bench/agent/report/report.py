"""The report of `agentserve bench --workload`: per configuration its figures at its headline point (the
offered `--rate`, or the SLO rate the search found), their ratios between configurations, the goal check,
every point measured; written as `report.json`, `report.md` (`agent_bench_tables`), the plots
(`agent_bench_plots`); every request's record is in `requests/<config>-<point>.jsonl`, written as its
point ends (`run.measure_point`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agents_eval.bench.agent.configs import CONFIGS, LABELS
from agents_eval.bench.agent.gateway import deployment_workers, threads_per_worker
from agents_eval.bench.agent.metrics import summarize
from agents_eval.bench.agent.report import plots as plots
from agents_eval.bench.agent.report.cost import CostSettings, cost_figures, engine_resources
from agents_eval.bench.agent.report.tables import markdown
from agents_eval.bench.agent.run import Point
from agents_eval.bench.agent.search.search import Probe, SearchResult
from agents_eval.harness.report import ReportFiles, goal, write_report
from agents_eval.harness.stats import RequestRecord, Slo, ratio

BASELINE, AGENT = "baseline", "agent"
PAIRS = ((AGENT, BASELINE), ("disaggregated", BASELINE), (AGENT, "disaggregated"), (BASELINE, "single"))
LIGHT_LOAD_BOUND = 1.1  # agent p50 and p99 at the lowest rate, at most this times the baseline's
RATIO_KEYS = {"throughput": "throughput_rps", "goodput": "goodput_rps", "p99_latency": "p99_latency_s",
              "cost": "cost_per_1k_output_tokens", "slo_rate": "slo_rate_sessions_per_s"}
PREFERRED = {"throughput": "slo_rate", "p99_latency": "p99_latency_at_baseline_rate"}  # after a search
GOALS = {  # the project's claims per ratio pair: (figure, "min" or "max", target ratio)
    "agent/baseline": (("throughput", "min", 5.0), ("p99_latency", "max", 0.2), ("cost", "max", 0.4)),
    "agent/disaggregated": (("throughput", "min", 1.35),),
}


def config_figures(point: Point, slo: Slo, prices: CostSettings) -> dict[str, Any]:
    result = point.result
    figures = summarize(result.records, slo, result.deltas)
    resources = engine_resources(result.env, result.capacity["split"])
    cost = cost_figures(resources, prices, figures["window_s"], figures["output_tokens"], figures["prompt_tokens"],
                        figures["cached_tokens"])
    return {"label": LABELS[point.config], "offered_rate": point.offered_rate, **figures, **cost,
            "workers": result.workers, "session_errors": result.session_errors, "split": result.capacity["split"],
            "split_source": result.capacity["source"], "capacity_enabled": result.capacity["enabled"],
            "capacity_events": result.capacity["events"], "role_timeline": result.timeline,
            "role_changes": max(0, len(result.timeline) - 1),
            "error_messages": dict(Counter(r.error for r in result.records if r.error).most_common(5)),
            "model_name": result.model_name,
            "deployment": CONFIGS[point.config].deployment(deployment_workers(result.env),
                                                           threads_per_worker(result.env)),
            "prompt_tokens_per_turn": prompt_tokens_per_turn(result.records)}


def prompt_tokens_per_turn(records: Sequence[RequestRecord]) -> dict[str, list[int]]:
    """Per session, the prompt tokens the gateway counted for each completed turn, in turn order: equal work
    across configurations is checkable from the report (a turn that failed is left out)."""
    turns: dict[str, dict[int, int]] = {}
    for record in records:
        if record.ok:
            turns.setdefault(record.session_id, {})[record.turn] = record.prompt_tokens
    return {session: [tokens for _, tokens in sorted(by_turn.items())] for session, by_turn in sorted(turns.items())}


def slo_figures(search: SearchResult[Point | None], headline: Mapping[str, Any], precision: float) -> dict[str, Any]:
    """What the search found, for `configs.<name>` beside the figures of its headline probe: the SLO rate in
    sessions/s and in requests/s (the throughput of the probe at that rate), every probe, the bracket."""
    found = search.low is not None
    return {"slo_rate_sessions_per_s": search.rate, "slo_rate_rps": headline["throughput_rps"] if found else 0.0,
            "slo_probes": [probe_row(p) for p in search.probes],
            "slo_search": {"target": search.target, "found": found, "capped": search.capped,
                           "converged": search.converged(precision), "probes": len(search.probes),
                           "bracket": [None if p is None else p.rate for p in (search.low, search.high)]}}


def probe_row(probe: Probe[Point | None]) -> dict[str, Any]:
    row: dict[str, Any] = {"rate": probe.rate, "attainment": probe.attainment}
    if probe.figures is not None:
        records = probe.figures.result.records
        row.update(point=probe.figures.tag, requests_sent=len(records), errors=sum(not r.ok for r in records))
    return row


def config_ratios(configs: Mapping[str, Mapping[str, Any]],
                  sweep: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> dict[str, dict[str, float]]:
    """`<a>/<b>` for each pair of PAIRS both measured; `slo_rate` only when both ran the search; for
    agent/baseline after a search, `p99_latency_at_baseline_rate`: the agent's p99 at the baseline's SLO rate
    (a point of `sweep`) over the baseline's p99 there."""
    ratios = {}
    for top, bottom in PAIRS:
        if top in configs and bottom in configs:
            a, b = configs[top], configs[bottom]
            ratios[f"{top}/{bottom}"] = {short: ratio(a[key], b[key]) for short, key in RATIO_KEYS.items()
                                         if key in a and key in b}
    at_rate = _p99_at_baseline_rate(configs, sweep or {})
    if at_rate is not None:
        ratios[f"{AGENT}/{BASELINE}"]["p99_latency_at_baseline_rate"] = at_rate
    return ratios


def _p99_at_baseline_rate(configs: Mapping[str, Mapping[str, Any]],
                          sweep: Mapping[str, Sequence[Mapping[str, Any]]]) -> float | None:
    baseline = configs.get(BASELINE)
    if AGENT not in configs or baseline is None or not baseline.get("slo_search", {}).get("found"):
        return None
    rate = baseline["slo_rate_sessions_per_s"]
    rows = [row for row in sweep.get(AGENT, []) if row["offered_rate"] == rate]
    return ratio(rows[0]["p99_latency_s"], baseline["p99_latency_s"]) if rows else None


def goal_check(ratios: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    """Each goal of each measured pair; throughput is judged on the SLO rate when the search ran."""
    checks = []
    for pair, goals in GOALS.items():
        measured_ratios = ratios.get(pair)
        if measured_ratios is None:
            continue
        config, _, against = pair.partition("/")
        for figure, bound, target in goals:
            key = PREFERRED.get(figure, figure)
            key = key if key in measured_ratios else figure
            measured = measured_ratios[key]
            checks.append(goal(f"{pair} {figure}", target, bound, measured, config=config, against=against,
                               figure=figure, measured_as=key, shortfall=_shortfall(measured, target, bound)))
    return checks


def light_load_check(sweep: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The agent layer costs no latency where it has nothing to save: agent p50 and p99 end to end against the
    baseline's at the lowest rate both were measured at (the search's first probe, or the lowest fraction)."""
    rows = {config: {row["offered_rate"]: row for row in sweep.get(config, [])} for config in (AGENT, BASELINE)}
    common = set(rows[AGENT]) & set(rows[BASELINE])
    if not common:
        return []
    rate = min(common)
    checks = []
    for key, figure in (("p50_latency_s", "p50_latency"), ("p99_latency_s", "p99_latency")):
        measured = ratio(rows[AGENT][rate][key], rows[BASELINE][rate][key])
        checks.append(goal(f"{AGENT}/{BASELINE} {figure} at light load", LIGHT_LOAD_BOUND, "max", measured,
                           config=AGENT, against=BASELINE, figure=figure,
                           measured_as=f"{figure} at {rate:.3g} sessions/s", rate=rate,
                           shortfall=_shortfall(measured, LIGHT_LOAD_BOUND, "max")))
    return checks


def _shortfall(measured: float, target: float, bound: str) -> float:
    """How far from the target, as a factor (1.0: met): target/measured for a floor, measured/target for a cap."""
    if math.isnan(measured) or measured <= 0:
        return math.inf
    return max(1.0, target / measured if bound == "min" else measured / target)


def sweep_rows(points: Sequence[Point], slo: Slo, prices: CostSettings) -> dict[str, list[dict[str, Any]]]:
    """Every point measured, per configuration, by offered rate."""
    keep = ("offered_rate", "throughput_rps", "goodput_rps", "slo_attainment", "p50_latency_s", "p99_latency_s",
            "cost_per_1k_output_tokens", "requests_sent", "errors")
    sweep: dict[str, list[dict[str, Any]]] = {}
    for point in sorted(points, key=lambda p: p.offered_rate):
        figures = config_figures(point, slo, prices)
        sweep.setdefault(point.config, []).append({"point": point.tag, **{k: figures[k] for k in keep}})
    return sweep


def write(out_dir: Path, report: dict[str, Any], points: Sequence[Point], notes: Sequence[str]) -> ReportFiles:
    files = write_report(out_dir, report, "", (), None, markdown=markdown(report, notes))
    headline = {p.config: p.result.records for p in points if p.headline}
    plots.save_all(out_dir, report, headline)
    return ReportFiles(files.json, files.markdown, out_dir / plots.THROUGHPUT)
