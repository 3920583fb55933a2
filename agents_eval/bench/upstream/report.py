"""Figures of the upstream benchmark: per turn index and routing, the mean prompt tokens the replica had to
prefill and the p99 time to first token, and affinity's ratios to round-robin."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agents_eval.bench.upstream.drive import TurnResult
from agents_eval.bench.upstream.workload import ROUTINGS
from agents_eval.harness.report import LineChart, ReportFiles, Table, goal, write_report
from agents_eval.harness.stats import percentile


def routing_json(results: Sequence[TurnResult], turns: int, wall_s: float) -> dict[str, Any]:
    per_turn = []
    for turn in range(turns):
        rows = [r for r in results if r.turn == turn]
        per_turn.append({"turn": turn, "n": len(rows),
                         "prefill_tokens_mean": float(np.mean([r.prefill_tokens for r in rows])),
                         "cached_tokens_mean": float(np.mean([r.cached_tokens for r in rows])),
                         "ttft_p99_s": percentile([r.ttft_s for r in rows], 99)})
    later = [r for r in results if r.turn > 0]
    return {"wall_s": wall_s, "per_turn": per_turn,
            "prefill_tokens_total": sum(r.prefill_tokens for r in results),
            "later_turns": {"prefill_tokens_mean": float(np.mean([r.prefill_tokens for r in later])),
                            "ttft_p99_s": percentile([r.ttft_s for r in later], 99)}}


def ratios(routings: dict[str, Any]) -> dict[str, float | None]:
    """Affinity over round-robin on turns after the first (below 1: affinity is better)."""
    affinity, baseline = routings["affinity"]["later_turns"], routings["round_robin"]["later_turns"]
    return {metric: (affinity[metric] / baseline[metric] if baseline[metric] else None)
            for metric in ("prefill_tokens_mean", "ttft_p99_s")}


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Affinity prefills and waits no more than round-robin on later turns; failover answers every turn."""
    r, settings = report["ratios"], report["settings"]
    return [goal("affinity/round-robin prefill tokens, later turns", 1.0, "max", r["prefill_tokens_mean"]),
            goal("affinity/round-robin TTFT p99, later turns", 1.0, "max", r["ttft_p99_s"]),
            goal("failover: turns answered", settings["sessions"] * settings["turns"], "min",
                 report["failover"]["turns_answered"])]


def _turn_table(report: dict[str, Any]) -> Table:
    rows = []
    for routing in ROUTINGS:
        for turn in report["routings"][routing]["per_turn"]:
            rows.append([routing, str(turn["turn"]), str(turn["n"]), f"{turn['prefill_tokens_mean']:.0f}",
                         f"{turn['cached_tokens_mean']:.0f}", f"{turn['ttft_p99_s'] * 1000:.0f}"])
    return Table("Per turn", ["routing", "turn", "requests", "prefill tokens (mean)", "cached tokens (mean)",
                              "TTFT p99 ms"], rows)


def _ratio_table(report: dict[str, Any]) -> Table:
    r = report["ratios"]
    cells = ["-" if r[m] is None else f"{r[m]:.2f}" for m in ("prefill_tokens_mean", "ttft_p99_s")]
    return Table("Affinity / round-robin, turns after the first (below 1: affinity is better)",
                 ["prefill tokens", "TTFT p99"], [cells])


def _failover_table(report: dict[str, Any]) -> Table:
    f = report["failover"]
    ttft = f["first_turn_ttft_median_s"]
    cells = [str(f["sessions_moved"]), f"{f['failovers']:.0f}", str(f["turns_answered"]),
             *("-" if ttft[k] is None else f"{ttft[k] * 1000:.0f}" for k in ("failed_over", "direct"))]
    return Table("Failover: one replica of the pool is a dead address",
                 ["sessions homed on it", "failovers", "turns answered", "first-turn TTFT median ms, failed over",
                  "direct"], [cells])


def _chart(report: dict[str, Any]) -> LineChart:
    series = {routing: [t["prefill_tokens_mean"] for t in report["routings"][routing]["per_turn"]]
              for routing in ROUTINGS}
    turns = [t["turn"] for t in report["routings"][ROUTINGS[0]]["per_turn"]]
    return LineChart("prefill_per_turn.png", "Prompt tokens the replica prefilled, per turn", "turn",
                     "tokens (mean over sessions)", turns, series, integer_x=True)


def notes(report: dict[str, Any]) -> list[str]:
    settings, machine = report["settings"], report["machine"]
    return [f"{settings['replicas']} upstream `agentserve serve --model {settings['model']}` replicas on loopback, "
            f"{settings['sessions']} concurrent sessions of {settings['turns']} turns, a front gateway per routing "
            "(AGENTSERVE_UPSTREAMS); prefill tokens are the replica's prompt tokens less its reported cached tokens. "
            "Replicas run with a 3600 s TTFT SLO: they queue every turn instead of shedding load.",
            f"Wall times on a machine with load average {machine['load_average'][0]:.1f} over "
            f"{machine['cpu_count']} cores, shared with other work: compare ratios, not absolute times."]


def write(out_dir: Path, report: dict[str, Any]) -> ReportFiles:
    return write_report(out_dir, report, "agentserve upstream benchmark: session affinity against round-robin",
                        [_ratio_table(report), _turn_table(report), _failover_table(report)], _chart(report),
                        notes(report))
