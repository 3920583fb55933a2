"""The markdown of `agentserve bench --workload`'s report: the headline table (throughput at the SLO, p99
latency and cost per configuration after the SLO-rate search; the figures at `--rate` for a fixed rate), the
ratios, the ablation steps, the goal check, the search's probes, details, the rate sweep and the notes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from agents_eval.bench.agent.ablation import SLO_RATE
from agents_eval.bench.agent.configs import LABELS
from agents_eval.harness.report import Table

COST_HEADERS = ["cost ($/1k generated tokens)", "cost ($/1k computed prompt tokens)"]
RATIO_COLUMNS = {"slo_rate": "throughput at SLO", "throughput": "throughput", "goodput": "goodput",
                 "p99_latency": "p99 latency", "p99_latency_at_baseline_rate": "p99 latency at the baseline's SLO rate",
                 "cost": "cost / generated token"}


def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}g}"


def _signed(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:+.3g}"


def _times(value: float | None) -> str:
    """A ratio as `1.5x`; `n/a` without the x when it is undefined."""
    text = _num(value)
    return text if text == "n/a" else f"{text}x"


def _costs(c: Mapping[str, Any]) -> list[str]:
    return [_num(c["cost_per_1k_output_tokens"]), _num(c["cost_per_1k_prompt_tokens"])]


def slo_rate_cell(c: Mapping[str, Any]) -> str:
    """The SLO rate, marked as a bound where the search did not bracket it."""
    search, rate = c["slo_search"], c["slo_rate_sessions_per_s"]
    if not search["found"]:
        return f"< {_num(search['bracket'][1])}"
    return f">= {_num(rate)}" if search["capped"] else _num(rate)


def slo_table(configs: Mapping[str, Mapping[str, Any]]) -> Table:
    headers = ["configuration", "throughput at SLO (sessions/s)", "throughput at SLO (req/s)", "P99 latency",
               *COST_HEADERS]
    rows = [[c["label"], slo_rate_cell(c), _num(c["slo_rate_rps"]), f"{_num(c['p99_latency_s'])} s", *_costs(c)]
            for c in configs.values()]
    return Table("Throughput at SLO", headers, rows)


def main_table(configs: Mapping[str, Mapping[str, Any]]) -> Table:
    rows = [[c["label"], _num(c["throughput_rps"]), f"{_num(c['p99_latency_s'])} s", *_costs(c)]
            for c in configs.values()]
    return Table("Agent benchmark", ["configuration", "throughput (req/s)", "p99 latency", *COST_HEADERS], rows)


def probe_table(configs: Mapping[str, Mapping[str, Any]], search: Mapping[str, Any]) -> Table:
    rows = []
    for c in configs.values():
        state = c["slo_search"]
        probes = ", ".join(f"{_num(p['rate'])}: {_num(p['attainment'], 2)}" for p in c["slo_probes"])
        converged = "yes" if state["converged"] else "no (probe budget spent)"
        low, high = (_num(rate) for rate in state["bracket"])
        rows.append([c["label"], slo_rate_cell(c), f"[{low}, {high})", converged, probes])
    return Table(f"SLO-rate search (attainment target {search['target']:.0%}, precision {search['precision']:g})",
                 ["configuration", "SLO rate (sessions/s)", "bracket", "converged", "probes (rate: attainment)"], rows)


def detail_table(configs: Mapping[str, Mapping[str, Any]]) -> Table:
    headers = ["configuration", "offered rate", "sent", "errors", "goodput (req/s)", "SLO attained", "output tok/s",
               "TTFT p50/p99 s", "TPOT p50/p99 s", "e2e p50 s", "KV hit", "prefix hit", "prefilled tokens",
               "pruned", "masked", "workers", "cores", "cost ($)"]
    rows = []
    for c in configs.values():
        ttft, tpot = c["latency"]["ttft"], c["latency"]["tpot"]
        split = ", ".join(f"{role} {n}" for role, n in c["split"].items())
        rows.append([c["label"], _num(c["offered_rate"]), str(c["requests_sent"]),
                     str(c["errors"] + len(c["session_errors"])), _num(c["goodput_rps"]), _num(c["slo_attainment"]),
                     _num(c["output_tokens_per_s"]), f"{_num(ttft['p50'])} / {_num(ttft['p99'])}",
                     f"{_num(tpot['p50'])} / {_num(tpot['p99'])}", _num(c["p50_latency_s"]), _num(c["kv_hit_ratio"]),
                     _num(c["prefix_hit_ratio"]), f"{c['prefill_tokens']:.0f}", f"{c['pruned_tokens']:.0f}",
                     f"{c['masked_tokens']:.0f}", split, str(c["cores"]), _num(c["cost_usd"])])
    return Table("Details (at each configuration's headline point)", headers, rows)


def ratio_table(ratios: Mapping[str, Mapping[str, float]]) -> Table:
    columns = [key for key in RATIO_COLUMNS if any(key in values for values in ratios.values())]
    rows = [[name, *(_times(values.get(k)) for k in columns)] for name, values in ratios.items()]
    return Table("Ratios", ["ratio", *(RATIO_COLUMNS[k] for k in columns)], rows)


def ablation_table(steps: Sequence[Mapping[str, Any]]) -> Table:
    """Each step against the one it builds on (agent_bench_ablation): throughput, p99 TTFT, cost, tokens."""
    unit = "throughput at SLO (sessions/s)" if steps[0]["throughput_measured_as"] == SLO_RATE else \
        "throughput (req/s)"
    headers = ["step", "against", "adds", unit, "change", "p99 TTFT (s)", "x previous", "cost ($/1k gen. tokens)",
               "x previous", "pruned", "masked"]
    rows = [[LABELS[s["config"]], LABELS[s["previous"]], s["adds"], _num(s["throughput"]),
             f"{_signed(s['change']['throughput'])} ({_times(s['ratio']['throughput'])})", _num(s["p99_ttft_s"]),
             _times(s["ratio"]["p99_ttft_s"]), _num(s["cost_per_1k_output_tokens"]),
             _times(s["ratio"]["cost_per_1k_output_tokens"]), f"{s['pruned_tokens']:.0f}",
             f"{s['masked_tokens']:.0f}"] for s in steps]
    return Table("Ablation: what each step buys", headers, rows)


def sweep_table(sweep: Mapping[str, Sequence[Mapping[str, Any]]]) -> Table:
    rows = [[LABELS[config], row["point"], _num(row["offered_rate"]), _num(row["throughput_rps"]),
             _num(row["goodput_rps"]), _num(row["slo_attainment"]), f"{_num(row['p99_latency_s'])} s"]
            for config, config_rows in sweep.items() for row in config_rows]
    return Table("Every point against offered rate", ["configuration", "point", "offered rate (sessions/s)",
                                                      "throughput (req/s)", "goodput (req/s)", "SLO attained",
                                                      "p99 latency"], rows)


def goal_lines(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for check in checks:
        word = "at least" if check["bound"] == "min" else "at most"
        figure = check["measured_as"].replace("slo_rate", "throughput at SLO").replace("_", " ")
        head = (f"{check['config']} {figure} is {check['measured']:.2f}x the {check['against']}'s (goal: {word} "
                f"{check['target']}x)")
        lines.append(f"- {head}: met." if check["met"] else
                     f"- {head}: **not met**, short by a factor of {check['shortfall']:.2f}.")
    return lines


def markdown(report: Mapping[str, Any], notes: Sequence[str]) -> str:
    """The headline table, the ratios, the ablation and the goal check first; then the search, details, the
    sweep, notes."""
    configs, sweep, search = report["configurations"], report["sweep"], report["settings"]["search"]
    head = slo_table(configs) if search is not None else main_table(configs)
    ratios = [ratio_table(report["ratios"]).to_markdown()] if report["ratios"] else []
    if report.get("ablation"):
        ratios.append(ablation_table(report["ablation"]).to_markdown())
    sections = [f"# Agent benchmark: {report['workload']['name']}\n", head.to_markdown(), *ratios,
                "## Goal check\n\nSame workload and SLO for every configuration.\n\n"
                + "\n".join(goal_lines([*report["goal"], *report.get("light_load", [])])
                            or ["- no baseline in this run: nothing to compare"]) + "\n"]
    if search is not None and configs:
        sections.append(probe_table(configs, search).to_markdown())
    sections.append(detail_table(configs).to_markdown())
    if any(len(rows) > 1 for rows in sweep.values()):
        sections.append(sweep_table(sweep).to_markdown())
    sections.append("## Notes\n\n" + "\n".join(f"- {note}" for note in notes) + "\n")
    return "\n".join(sections)
