"""The report of `agentserve simulate --swing`: per shift, the admitted demand's change, the controller's move and
the moved worker serving in its new role; moves per role per window; SLO attainment, goodput and p99 TTFT/TPOT
per configuration; the goals. Shifts and moves are counted as `agentserve bench capacity` counts them."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from agents_eval.bench.capacity.bench import ROLE_FOR, moves_per_window, reallocations
from agents_eval.bench.capacity.simulated import move_events
from agents_eval.bench.capacity.swing import RunResult
from agents_eval.harness.report import Table
from agents_eval.sim.model.records import Decided, RunLog
from agents_eval.sim.swing.runs import SwingPlan, SwingRun

GOAL_MS, AIM_MS = 500.0, 100.0
MAX_MOVES_PER_ROLE = 1
GOODPUT_OVER_STATIC = 1.6  # DynaServe reports 1.61-1.91x over a static split on mixed phases
SIGNALS = ("admission", "smoothing", "hold", "drain")
NOT_EXERCISED = "not exercised: no shift of this swing demands capacity (not met, not missed)"
NOTE = ("Simulated: the capacity controller (engine.capacity.policy), the KV-aware router and the engine's "
        "scheduler on a roofline cost model of each node. A shift's latency runs from its window's start: "
        "`demand asks` when the gateway's admitted demand per worker first favours the new window's role "
        "(admission), `target moves` when the policy's target first moves a worker that way (smoothing: the demand "
        "margin; admitted work is not averaged over time), `move` when the move is made (hold: hold_s), `serving` "
        "when the moved worker serves in its new role (drain: its current step, then role_switch_s). planned: at "
        "each window's start, the fixed split that met the SLO most often in that window, if it met it at least 1% "
        "more often than the split held (else the split held; in the first window, ties: lower p99 TTFT). "
        "static: the split sized for the average, planned's splits averaged over the swing's time. Goodput: "
        "requests meeting both SLO targets per second. A shift demands capacity where planned moves at its start "
        "towards the new phase's role (it moves only for 1% of attainment); the shift goals judge those shifts "
        "(elsewhere the right move is none, judged by the moves).")


def demands_capacity(planned: tuple[int, ...], plan: SwingPlan) -> list[bool]:
    """Per window, whether the shift into it demands capacity, a property of the swing and not of the controller:
    the planned oracle's splits (`best_split_per_window`) move at its start towards the new window's role, which
    they do only where the move buys at least `DEMAND_GAIN` of SLO attainment in the window. Elsewhere the split
    that served the last window serves this one about as well, and the right move is none."""
    return [False] + [wanted > held if window.phase == "think" else wanted < held
                      for held, wanted, window in zip(planned[:-1], planned[1:], plan.windows[1:], strict=True)]


def shifts(run: SwingRun, plan: SwingPlan, warmup_s: float, workers: int, demanded: list[bool] | None = None
           ) -> list[dict[str, Any]]:
    """Per shift after the warm-up: ms from its window's start to the admitted demand asking for the new role
    (its demand per worker above the other role's), the policy's target moving that way, the move, and the moved
    worker serving in its new role; and the signal that took longest (admission: the demand's change; smoothing:
    the demand margin; hold: hold_s; drain: the worker's current step and its switch)."""
    result = _as_bench_result(run, plan)
    rows = []
    demanded = demanded or [True] * len(plan.windows)
    for row, window, asks in zip(reallocations(result), plan.windows[1:], demanded[1:], strict=True):
        if window.start_s < warmup_s:
            continue
        flip, ask = _asked(run.decisions, window.start_s, window.end_s, ROLE_FOR[window.phase], workers)
        times = {"demand_ms": _ms(flip, window.start_s), "target_ms": _ms(ask, window.start_s),
                 "move_ms": _scaled(row["decision_s"]), "serving_ms": _scaled(row["serving_s"])}
        rows.append({"shift_to": window.phase, "at_s": window.start_s, "window_s": window.end_s - window.start_s,
                     "demands_capacity": asks, **times, **_late(times, window.end_s - window.start_s)})
    return rows


def _as_bench_result(run: SwingRun, plan: SwingPlan) -> RunResult:
    log = RunLog(role_changes=run.role_changes, roles_applied=run.roles_applied)
    return RunResult(window_starts=[(w.start_s, w.phase) for w in plan.windows], events=move_events(log))


def _asked(decisions: list[Decided], start: float, end: float, role: str, workers: int
           ) -> tuple[float | None, float | None]:
    """When, within [start, end), the demand per worker first favoured `role`, and the policy's target first
    moved workers to it."""
    flip = ask = None
    for d in decisions:
        if not start <= d.at_s < end:
            continue
        prefill_busy = d.prefill_demand / max(d.prefill, 1)
        decode_busy = d.decode_demand / max(workers - d.prefill, 1)
        favours = prefill_busy > decode_busy if role == "prefill" else decode_busy > prefill_busy
        towards = d.target > d.prefill if role == "prefill" else d.target < d.prefill
        flip = d.at_s if flip is None and favours else flip
        ask = d.at_s if ask is None and towards else ask
    return flip, ask


def _ms(at: float | None, start: float) -> float | None:
    return None if at is None else 1000 * (at - start)


def _scaled(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def _late(times: dict[str, float | None], window_s: float) -> dict[str, Any]:
    """Each signal's share of the shift's latency (a step never reached counts to the window's end), and the
    latest one with how far the shift missed the goal by."""
    marks = [times["demand_ms"], times["target_ms"], times["move_ms"], times["serving_ms"]]
    at, parts = 0.0, {}
    for signal, mark in zip(SIGNALS, marks, strict=True):
        reached = 1000 * window_s if mark is None else max(mark, at)
        parts[signal], at = reached - at, reached
    served = times["serving_ms"]
    missed = served is None or served > GOAL_MS
    return {"signals_ms": parts, "late_signal": max(parts, key=lambda k: parts[k]) if missed else None,
            "missed_by_ms": (at - GOAL_MS) if missed else 0.0}


def moves(run: SwingRun, plan: SwingPlan, warmup_s: float = 0.0) -> list[dict[str, Any]]:
    """Moves per role per window; a window is `judged` where it ends after the warm-up (the goal counts those: the
    first window's moves set a cold cluster up for sessions that all start with their whole first prompt). The
    moves after the swing's end, while its last requests drain, belong to no window (the benchmark's last window
    runs on to the end of its run)."""
    result = _as_bench_result(run, plan)
    result.events = [e for e in result.events if e["at"] < plan.duration_s]
    return [{**row, "judged": window.end_s > warmup_s}
            for row, window in zip(moves_per_window(result), plan.windows, strict=True)]


def configurations(runs: dict[str, SwingRun], static: str) -> dict[str, dict[str, Any]]:
    rows = {}
    for name, run in runs.items():
        s = run.summary
        rows[name] = {"attainment": s.attainment, "goodput_rps": s.attainment * s.throughput_rps,
                      "throughput_rps": s.throughput_rps, "ttft_p99_s": s.ttft_p99_s, "tpot_p99_s": s.tpot_p99_s,
                      "requests": s.requests, "moves": s.role_changes, "static": name == static}
    return rows


def goals(shift_rows: list[dict[str, Any]], move_rows: list[dict[str, Any]], rows: dict[str, dict[str, Any]],
          static: str) -> list[dict[str, Any]]:
    served = [r["serving_ms"] if r["serving_ms"] is not None else 1000 * r["window_s"] for r in shift_rows
              if r.get("demands_capacity", True)]  # a shift that asks for no move is judged by moves alone
    fixed = {k: v for k, v in rows.items() if k.startswith("fixed")}
    best = max(fixed.values(), key=lambda v: v["goodput_rps"])
    controller = rows["controller"]
    most = max((max(r[role] for role in ROLE_FOR.values()) for r in move_rows if r["judged"]), default=0)
    p99 = _ratio(controller["ttft_p99_s"], min(v["ttft_p99_s"] for v in fixed.values()))
    unexercised = {} if served else {"note": NOT_EXERCISED}
    return [
        {**_goal("every shift served in its new split (ms, slowest)", GOAL_MS, "max", max(served, default=None)),
         **unexercised},
        {**_goal("shifts served in their new split (ms, median)", AIM_MS, "max",
                 statistics.median(served) if served else None), **unexercised},
        _goal("moves per role per judged window (most)", MAX_MOVES_PER_ROLE, "max", most),
        _goal("controller goodput / best fixed split's", 1.0, "min",
              _ratio(controller["goodput_rps"], best["goodput_rps"])),
        _goal("controller goodput / static split's", GOODPUT_OVER_STATIC, "min",
              _ratio(controller["goodput_rps"], rows[static]["goodput_rps"])),
        {**_goal("controller p99 TTFT / lowest fixed split's (below 1)", 1.0, "max", p99),
         "met": p99 is not None and p99 < 1.0},
    ]


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _goal(name: str, target: float, bound: str, value: float | None) -> dict[str, Any]:
    met = value is not None and (value <= target if bound == "max" else value >= target)
    return {"name": name, "target": target, "bound": bound, "measured": value, "met": met}


def tables(shift_rows: list[dict[str, Any]], move_rows: list[dict[str, Any]], rows: dict[str, dict[str, Any]],
           goal_rows: list[dict[str, Any]]) -> list[Table]:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    shift_cells = [[f"to {r['shift_to']} at {r['at_s']:.1f} s", "yes" if r.get("demands_capacity", True) else "no",
                    ms(r["demand_ms"]), ms(r["target_ms"]),
                    ms(r["move_ms"]), ms(r["serving_ms"]),
                    _late_cell(r)]
                   for r in shift_rows]
    config_cells = [[name + (" (static: sized for the average)" if v["static"] else ""), f"{v['attainment']:.3f}",
                     f"{v['goodput_rps']:.1f}", ms(1000 * v["ttft_p99_s"]), ms(1000 * v["tpot_p99_s"]), str(v["moves"])]
                    for name, v in rows.items()]
    move_cells = [[f"{r['window']} at {r['at_s']:.1f} s" + ("" if r["judged"] else " (warm-up)"),
                   str(r["prefill"]), str(r["decode"])] for r in move_rows]
    goal_cells = [[g["name"], str(g["target"]), g["bound"], "-" if g["measured"] is None else f"{g['measured']:.3g}",
                   "not exercised" if "note" in g else "met" if g["met"] else "missed"] for g in goal_rows]
    return [Table("Goals", ["goal", "target", "bound", "measured", ""], goal_cells),
            Table("Shifts (ms from the window's start)", ["shift", "demands capacity", "demand asks", "target moves",
                                                          "move",
                                                          "serving in new role", "late signal"], shift_cells),
            Table("Configurations", ["configuration", "SLO attainment", "goodput req/s", "p99 TTFT ms",
                                     "p99 TPOT ms", "moves"], config_cells),
            Table("Controller moves per window", ["window", "into prefill", "into decode"], move_cells)]


def _late_cell(row: dict[str, Any]) -> str:
    if not row.get("demands_capacity", True):
        return "(no move demanded)"
    return "-" if row["late_signal"] is None else f"{row['late_signal']} (+{row['missed_by_ms']:,.0f} ms)"


def summary_of(runs: dict[str, SwingRun]) -> dict[str, Any]:
    return {name: asdict(run.summary) for name, run in runs.items()}
