"""`agentserve simulate` and `agentserve profile` (registered by agentserve/cli.py). Heavy imports wait for the
command to run."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agents_eval.harness.report import Table, machine_info, markdown_document

SIM_DURATION_S = 90.0  # seconds of session arrivals of a simulated run
SIM_WARMUP_S = 30.0  # requests arriving before this are not judged
SWING_DURATION_S, SWING_WARMUP_S = 600.0, 60.0


def register(sub: argparse._SubParsersAction) -> None:
    from agents_eval.sim.calibration.profile import add_arguments as add_profile

    p = sub.add_parser("simulate", help="cluster simulator: the project's policies on simulated nodes")
    p.add_argument("--out", type=Path, required=True, help="directory for report.json, report.md and plots")
    p.add_argument("--cluster", default="moe27b-agent", help="a cluster of configs/sim.yaml (single run)")
    p.add_argument("--workload", default="swe", choices=["swe", "webarena", "sharegpt"])
    p.add_argument("--rate", type=float, default=1.0, help="sessions started per second (single run)")
    p.add_argument("--duration", type=float,
                   help="seconds over which sessions start (90; --validate: 120; --agent-table: 40)")
    p.add_argument("--warmup", type=float, help="requests arriving before this are not judged (30; --agent-table: 10)")
    p.add_argument("--seed", type=int, default=0)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--table", action="store_true", help="the 27B-MoE deployment's three configurations at the SLO")
    what.add_argument("--placement", type=int, metavar="GPUS", help="DistServe's placement search on GPUS GPUs")
    what.add_argument("--distserve", action="store_true",
                      help="DistServe's chatbot setting (13B, A100s, ShareGPT lengths): goodput per GPU")
    what.add_argument("--scale", action="store_true", help="one simulated hour of the 48-node cluster (scale-48)")
    what.add_argument("--validate", action="store_true", help="predicted against measured real CPU runs")
    what.add_argument("--swing", action="store_true",
                      help="a think/act swing of --duration s (600) on --swing-cluster: the controller against every "
                           "fixed split, the planned oracle and the split sized for the average")
    what.add_argument("--agent-table", action="store_true",
                      help="the agent benchmark's three configurations on calibrated workers of a core each "
                           "(--calibration; --workload swe or webarena)")
    p.add_argument("--calibration", type=Path,
                   help="calibration file of `agentserve profile` (--validate, --agent-table)")
    p.add_argument("--workers", type=int, default=2, help="one-thread workers of each configuration (--agent-table)")
    p.add_argument("--repeats", type=int, help="real runs of each deployment and rate, in turn (--validate; default 2)")
    p.add_argument("--start-rate", type=float, default=1.0, help="first sessions/s of the rate search")
    p.add_argument("--search-steps", type=int, default=3, help="bisections of the rate search after doubling")
    p.add_argument("--placement-cluster", default="moe27b-distserve",
                   help="the cluster whose devices, routing and controller the placement search places (--placement;"
                        " moe27b-agent: with the capacity controller moving workers through the swe workload's "
                        "think/act swings)")
    p.add_argument("--tensor-parallel", type=int, nargs="+", default=[1, 2, 4, 8],
                   help="tensor-parallel degrees the placement search tries per phase (--placement)")
    _add_swing_arguments(p)
    p.add_argument("--hours", type=float, default=1.0, help="simulated hours of session arrivals (--scale)")
    p.set_defaults(run=run)
    add_profile(sub.add_parser("profile", help="record the real engine's step times; write a calibration file"))


def _add_swing_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--swing-cluster", default="moe27b-swing", help="the deployment of the swing (--swing)")
    p.add_argument("--capacity-rate", type=float, default=None,
                   help="sessions/s the swing's deployment serves at the SLO (--swing; default: configs/sim.yaml's)")
    p.add_argument("--jobs", type=int, default=2,
                   help="configurations simulated at once, a process each (--swing, --table, --placement, --distserve)")
    p.add_argument("--measured", type=Path, nargs="+", default=[],
                   help="report.json files (or their directories) of `agentserve bench --workload swe|webarena` and "
                        "`agentserve bench disagg`: their ratios against the simulator's (--validate)")
    p.add_argument("--ratios-only", action="store_true", help="--validate: the ratio validation alone, no real runs")


def run(args: argparse.Namespace) -> None:
    from agents_eval.sim import reports  # simpy, the engine's policies, matplotlib

    if args.agent_table:  # its own defaults: the benchmark's short runs
        from agents_eval.sim.agent_table import AgentLoad

        args.warmup = AgentLoad.warmup_s if args.warmup is None else args.warmup
        args.duration = AgentLoad.duration_s if args.duration is None else args.duration
    if args.swing:  # its own defaults: a 10-minute swing, its first minute not judged
        args.duration = SWING_DURATION_S if args.duration is None else args.duration
        args.warmup = SWING_WARMUP_S if args.warmup is None else args.warmup
    if args.warmup is None:
        args.warmup = SIM_WARMUP_S
    if args.duration is None and not args.validate:  # --validate has a default of its own
        args.duration = SIM_DURATION_S
    if args.validate:
        if args.calibration is None:
            raise ValueError("--validate needs --calibration FILE (write one with `agentserve profile`)")
        data, tables = _validation(args)
    elif args.table:
        data, tables = reports.table(args)
    elif args.agent_table:
        data, tables = reports.agent_table(args)
    elif args.placement:
        data, tables = reports.placement(args)
    elif args.distserve:
        data, tables = reports.distserve(args)
    elif args.swing:
        data, tables = reports.swing(args)
    elif args.scale:
        data, tables = reports.scale(args)
    else:
        data, tables = reports.single(args)
    write(args.out, data, tables)


def _validation(args: argparse.Namespace) -> tuple[dict[str, Any], list[Table]]:
    """The absolute validation (real runs against their prediction) and, with --measured, the ratio validation."""
    from agents_eval.sim.validation.absolute import validate
    from agents_eval.sim.validation.ratios import validate_ratios

    if args.ratios_only:
        data: dict[str, Any] = {"validation": {}, "notes": []}
        tables: list[Table] = []
    else:
        data = validate(args.calibration, args.seed, repeats=args.repeats, duration_s=args.duration)
        tables = data.pop("tables")
    if args.measured:
        ratios = validate_ratios(args.calibration, args.measured, args.workers, args.start_rate, args.search_steps,
                                 args.seed)
        data["validation"]["ratios"] = ratios
        data["goals"] = [ratios["goal"]]
        tables.append(Table("Ratios: simulated against measured (median of the runs given)",
                            ["ratio", "simulated", "measured", "relative error", "measured bracket", "in it"],
                            [[r["ratio"], _fmt(r["simulated"]), _fmt(r["measured"]), _fmt(r["relative_error"]),
                              _bracket(r["measured_bracket"]),
                              {None: "-", True: "yes", False: "no"}[r["within_bracket"]]] for r in ratios["rows"]]))
    return data, tables


def _bracket(bracket: tuple[float, float] | None) -> str:
    return "-" if bracket is None else f"[{bracket[0]:.3f}, {bracket[1]:.3f}]"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def write(out: Path, data: dict[str, Any], tables: list[Table]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {**data, "machine": machine_info()}
    (out / "report.json").write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    (out / "report.md").write_text(markdown_document("Cluster simulator", tables, data.get("notes", ())))
    shown = ("summary", "validation", "scale", "resources")
    print(json.dumps({k: v for k, v in data.items() if k in shown}, default=_jsonable))


def _jsonable(value: object) -> object:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)  # type: ignore[call-overload]
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
