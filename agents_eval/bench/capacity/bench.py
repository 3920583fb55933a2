"""`agentserve bench capacity`: how fast the capacity controller follows a think/act swing, and what it buys.

One swinging workload (`swing.py`) runs on the disaggregated engine with the controller on, then on every fixed
split of the same workers (with `--simulated CAL`, all of it in the cluster simulator, `simulated.py`, plus a
split planned from the swing's schedule). Reported: for each load shift, the seconds from its first
turns to (a) the phase-shift event, (b) the controller's move, (c) the moved worker confirming its new role
(it serves in that role from then on: a role only steers routing); the controller's moves into each role per
window; and p99 TTFT and TPOT with the controller against the best and the worst fixed split, TTFT counted
from each turn's planned arrival. Goal: (c) within 500 ms for every shift and 100 ms at the median, at most
one move per role per window, and a p99 TTFT below every fixed split's."""

from __future__ import annotations

import argparse
import functools
import statistics
from pathlib import Path
from typing import Any

from rich.progress import Progress, track

from agents_eval.bench.capacity.simulated import simulate_swing
from agents_eval.bench.capacity.swing import RunResult, SwingWorkload, run_swing
from agents_eval.harness.report import LineChart, Table, goal, machine_info, write_report
from agents_eval.harness.stats import percentile
from engine.capacity.settings import CapacitySettings

GOAL_S, AIM_S = 0.5, 0.1
MAX_MOVES_PER_ROLE = 1
EVENTS_KEPT = 1_000_000
ROLE_FOR = {"think": "prefill", "act": "decode"}


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    return percentile(values, 99)


def reallocations(result: RunResult) -> list[dict[str, Any]]:
    """Per load shift after the first window: seconds from its first turn to shift event, move, applied."""
    rows = []
    bounds = [*[s for s, _ in result.window_starts[1:]], float("inf")]
    for (start, phase), end in zip(result.window_starts[1:], bounds[1:], strict=True):
        role = ROLE_FOR[phase]

        def first(kind: str, start: float = start, end: float = end, role: str = role) -> float | None:
            times = [e["at"] for e in result.events if e["kind"] == kind and e.get("role") == role
                     and start <= e["at"] < end]
            return min(times) - start if times else None

        shift = [t - start for t, p in result.shifts if p == phase and start <= t < end]
        rows.append({"shift_to": phase, "at_s": start, "shift_event_s": min(shift) if shift else None,
                     "decision_s": first("move"), "serving_s": first("role_applied")})
    return rows


def moves_per_window(result: RunResult) -> list[dict[str, Any]]:
    """Per window: the controller's decisions that moved workers into each role (a decision may move several)."""
    bounds = [*[s for s, _ in result.window_starts[1:]], float("inf")]
    rows = []
    for (start, phase), end in zip(result.window_starts, bounds, strict=True):
        moves = {role: len({e["at"] for e in result.events if e["kind"] == "move" and e.get("role") == role
                            and start <= e["at"] < end}) for role in ROLE_FOR.values()}
        rows.append({"window": phase, "at_s": start, **moves})
    return rows


def shift_summary(shifts: list[dict[str, Any]], moves: list[dict[str, Any]]) -> dict[str, Any]:
    serving = [r["serving_s"] for r in shifts if r["serving_s"] is not None]
    return {"shifts": len(shifts), "shifts_served": len(serving), "max_serving_s": max(serving) if serving else None,
            "p50_serving_s": statistics.median(serving) if serving else None,
            "most_moves_per_role_per_window": max((max(row[role] for role in ROLE_FOR.values()) for row in moves),
                                                  default=0)}


def goals(shifts: list[dict[str, Any]], moves: list[dict[str, Any]], summaries: dict[str, dict[str, Any]]
          ) -> list[dict[str, Any]]:
    """Every shift served in its new role within GOAL_S (a shift never served: not met), AIM_S at the median,
    at most MAX_MOVES_PER_ROLE moves per role per window, and the controller's p99 TTFT below every fixed
    split's (the ratio to the best fixed split's under 1)."""
    figures = shift_summary(shifts, moves)
    all_served = bool(shifts) and figures["shifts_served"] == figures["shifts"]
    fixed_p99 = [v["p99_ttft_s"] for k, v in summaries.items() if k.startswith("fixed") and v["p99_ttft_s"]]
    controller_p99 = summaries["controller"]["p99_ttft_s"]
    p99_ratio = controller_p99 / min(fixed_p99) if controller_p99 is not None and fixed_p99 else None
    return [goal("slowest shift served in the new role (s)", GOAL_S, "max",
                 figures["max_serving_s"] if all_served else None,
                 shifts=figures["shifts"], shifts_served=figures["shifts_served"]),
            goal("median shift served in the new role (s)", AIM_S, "max", figures["p50_serving_s"]),
            goal("most controller moves per role per window", MAX_MOVES_PER_ROLE, "max",
                 figures["most_moves_per_role_per_window"]),
            goal("controller p99 TTFT / best fixed split's p99 TTFT", 1.0, "max", p99_ratio)]


def summary(result: RunResult) -> dict[str, Any]:
    return {"requests": result.requests, "finished": result.finished, "p99_ttft_s": p99(result.ttft_s),
            "p99_tpot_s": p99(result.tpot_s), "p50_ttft_s": percentile(result.ttft_s, 50) if result.ttft_s else None,
            "p50_tpot_s": statistics.median(result.tpot_s) if result.tpot_s else None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (each one torch thread)")
    parser.add_argument("--duration", type=float, default=SwingWorkload.duration_s)
    parser.add_argument("--period", type=float, default=SwingWorkload.period_s, help="seconds per think/act window")
    parser.add_argument("--rate", type=float, default=SwingWorkload.rate, help="requests per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--think-prompt", type=int, default=SwingWorkload.think_prompt,
                        help="prompt tokens of a think turn")
    parser.add_argument("--act-output", type=int, default=SwingWorkload.act_output,
                        help="output tokens of an act turn")
    parser.add_argument("--simulated", type=Path, default=None, metavar="CALIBRATION",
                        help="run the swing in the cluster simulator, each worker one core as this calibration "
                             "(`agentserve profile`) measured it, instead of on this host's worker processes")


def run(args: argparse.Namespace) -> None:
    if args.workers < 2:
        raise ValueError(f"--workers must be at least 2 (one per role), got {args.workers}")
    for flag in ("think_prompt", "act_output"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if args.simulated is not None and not args.simulated.is_file():
        raise ValueError(f"--simulated: no calibration file at {args.simulated} (make one with agentserve profile)")
    workload = SwingWorkload(duration_s=args.duration, period_s=args.period, rate=args.rate, seed=args.seed,
                             think_prompt=args.think_prompt, act_output=args.act_output)
    half = args.workers // 2
    log = EVENTS_KEPT  # the whole run's moves are read from the event log at its end
    runs = {"controller": ((half, args.workers - half), CapacitySettings(enabled=True, event_log_size=log))}
    runs |= {f"fixed {p}P/{args.workers - p}D": ((p, args.workers - p),
                                                 CapacitySettings(enabled=False, event_log_size=log))
             for p in range(1, args.workers)}
    if args.simulated is not None:
        results = _simulated(args, workload, runs)
    else:
        results = {}
        with Progress() as progress:
            for name, (split, capacity) in runs.items():
                task = progress.add_task(name, total=len(workload.arrivals()))
                results[name] = run_swing(args.model, workload, split, capacity,
                                          functools.partial(progress.advance, task))
    write(args.out, args, workload, results)


def _simulated(args: argparse.Namespace, workload: SwingWorkload,
               runs: dict[str, tuple[tuple[int, int], CapacitySettings]]) -> dict[str, RunResult]:
    """The same runs in the simulator (each takes well under a second), and one more that knows the schedule:
    every worker but one prefills in think windows and decodes in act windows, the most moving workers can buy."""
    results = {name: simulate_swing(args.model, workload, split, capacity, args.simulated)
               for name, (split, capacity) in track(runs.items(), description="simulating")}
    n = args.workers
    plan = ((n - 1, 1), (1, n - 1))
    results[f"planned {n - 1}P/1D think, 1P/{n - 1}D act"] = simulate_swing(
        args.model, workload, *runs["controller"], args.simulated, plan)
    return results


def _rank(summaries: dict[str, dict[str, Any]]) -> list[str]:
    """Fixed splits from best to worst: p99 TTFT and p99 TPOT, each relative to the best of the splits."""
    fixed = {k: v for k, v in summaries.items() if k.startswith("fixed")}
    best_ttft = min(v["p99_ttft_s"] or float("inf") for v in fixed.values())
    best_tpot = min(v["p99_tpot_s"] or float("inf") for v in fixed.values())
    score = {k: (v["p99_ttft_s"] or float("inf")) / best_ttft + (v["p99_tpot_s"] or float("inf")) / best_tpot
             for k, v in fixed.items()}
    return sorted(fixed, key=score.__getitem__)


def write(out: Path, args: argparse.Namespace, workload: SwingWorkload, results: dict[str, RunResult]) -> None:
    summaries = {name: summary(result) for name, result in results.items()}
    ranked = _rank(summaries)
    shifts = reallocations(results["controller"])
    moves = moves_per_window(results["controller"])
    reached = goals(shifts, moves, summaries)
    settings = {k: v for k, v in vars(args).items() if isinstance(v, int | float | str)}
    simulated = None if args.simulated is None else str(args.simulated)
    data = {"settings": {**settings, "out": str(args.out), "workload": workload.__dict__, "simulated": simulated},
            "machine": machine_info(), "configs": summaries, "best_fixed": ranked[0], "worst_fixed": ranked[-1],
            "reallocations": shifts, "moves_per_window": moves, "shift_summary": shift_summary(shifts, moves),
            "goals": reached, "goals_met": all(g["met"] for g in reached),
            "timeline": results["controller"].timeline, "windows": results["controller"].window_starts}
    tables = [_latency_table(summaries, ranked), _shift_table(shifts), _moves_table(moves)]
    timeline = results["controller"].timeline
    chart = LineChart("role_timeline.png", "Prefill workers and think share over the swing (controller on)",
                      "seconds", "prefill workers / think share x workers", [t for t, _, _ in timeline],
                      {"prefill workers": [n for _, n, _ in timeline],
                       "think share x workers": [share * args.workers for _, _, share in timeline]})
    title = "Capacity controller: reallocation latency and p99 through a swing"
    notes = _goal_notes(reached)
    if args.simulated is not None:
        title += " (simulated)"
        notes.insert(0, f"Simulated: each worker one core as the calibration {args.simulated} measured it "
                        "(agents_eval/bench/capacity/simulated.py); moves apply at once, the controller decides "
                        "every interval, no phase-shift events.")
    write_report(out, data, title, tables, chart, notes=notes)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:.0f} ms"


def _latency_table(summaries: dict[str, dict[str, Any]], ranked: list[str]) -> Table:
    label = {ranked[0]: " (best fixed)", ranked[-1]: " (worst fixed)"}
    rows = [[name + label.get(name, ""), _ms(s["p99_ttft_s"]), _ms(s["p99_tpot_s"]), _ms(s["p50_ttft_s"]),
             _ms(s["p50_tpot_s"]), f"{s['finished']}/{s['requests']}"] for name, s in summaries.items()]
    return Table("p99 latency through the swing", ["configuration", "p99 TTFT", "p99 TPOT", "p50 TTFT", "p50 TPOT",
                                                   "finished"], rows)


def _shift_table(shifts: list[dict[str, Any]]) -> Table:
    rows = [[f"to {r['shift_to']} at {r['at_s']:.1f} s", _ms(r["shift_event_s"]), _ms(r["decision_s"]),
             _ms(r["serving_s"]), _ms(_after_event(r))] for r in shifts]
    return Table("Reallocation latency from the first turns of each shift",
                 ["shift", "(a) shift event", "(b) controller move", "(c) serving in new role", "(c) - (a)"], rows)


def _after_event(row: dict[str, Any]) -> float | None:
    """The controller's own part: from the shift event to the moved worker serving (None if either is missing
    or the move came first, driven by the queue)."""
    if row["serving_s"] is None or row["shift_event_s"] is None or row["serving_s"] < row["shift_event_s"]:
        return None
    return float(row["serving_s"] - row["shift_event_s"])


def _moves_table(moves: list[dict[str, Any]]) -> Table:
    rows = [[f"{r['window']} from {r['at_s']:.1f} s", str(r["prefill"]), str(r["decode"])] for r in moves]
    return Table("Controller moves per window (decisions moving workers into each role)",
                 ["window", "to prefill", "to decode"], rows)


def _goal_notes(goals: list[dict[str, Any]]) -> list[str]:
    return [f"Goal {g['name']}: {_show(g['measured'])} ({g['bound']} {g['target']:g}): "
            f"{'met' if g['met'] else 'not met'}" for g in goals]


def _show(value: float | None) -> str:
    return "none (a shift never served, or nothing measured)" if value is None else f"{value:.3f}"
