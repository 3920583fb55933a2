"""`agentserve bench --workload {mooncake,webarena,swe}`: real agent sessions through real gateways, one
gateway process per configuration, and the table the project's claim rests on.

Configurations (`--configs`, default all three), each measured on the same workload (same seed, sessions,
turns and arrival times):
- `baseline`: the colocated engine without prefix caching, pruning or masks; the client resends the whole
  history each turn over chat completions, with no session id;
- `disaggregated`: prefill and decode workers (DistServe), fixed split, prefix caching on; client as baseline;
- `agent`: everything on (capacity controller, sessions, turn-delta reuse, pruning, masks); the client keeps
  each session over the Responses WebSocket (`--client ws`) or chat completions with `X-Session-Id`
  (`--client http`).

The workload runs at `--rate` (sessions per second; default the workload's own) times each fraction of
`--rate-sweep` (1.0 always included: the headline point), for `--duration` seconds, each point on a fresh
gateway. See docs/agents_eval.md ("Agent benchmark") for every figure's definition.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agents_eval import agent_bench_report as bench_report
from agents_eval.agent_bench_driver import RunLimits, planned_requests
from agents_eval.agent_bench_gateway import CONFIGS, colocated_threads
from agents_eval.agent_bench_metrics import RequestRecord, Slo
from agents_eval.agent_bench_run import HTTP, WS, PointResult, RunOptions, run_point
from agents_eval.agent_bench_workload import WORKLOADS, WorkloadOptions, build_workload, default_rate, session_rate
from agents_eval.report import ReportFiles, check_settings, machine_info
from agents_eval.workloads.types import Workload

# About 10x what an unloaded gateway gives the tiny model on 2 CPU cores (TTFT ~50 ms, TPOT ~5 ms); set both
# for a real model and machine.
DEFAULT_SLO = Slo(ttft_s=0.5, tpot_s=0.05)
DEFAULT_PRICE_PER_WORKER_HOUR = 2.0


@dataclass(frozen=True)
class AgentBenchSettings:
    workload: WorkloadOptions
    configs: tuple[str, ...] = CONFIGS
    run: RunOptions = field(default_factory=RunOptions)
    fractions: tuple[float, ...] = (1.0,)
    slo: Slo = DEFAULT_SLO
    price_per_worker_hour: float = DEFAULT_PRICE_PER_WORKER_HOUR

    def validate(self) -> None:
        limits = self.run.limits
        checks = [
            (bool(self.configs) and set(self.configs) <= set(CONFIGS), f"--configs: choose from {', '.join(CONFIGS)}"),
            (len(set(self.configs)) == len(self.configs), "--configs: each configuration once"),
            (limits.duration_s > 0, "--duration must be positive"),
            (limits.max_requests is None or limits.max_requests >= 1, "--max-requests must be at least 1"),
            (self.workload.rate is None or self.workload.rate > 0, "--rate must be positive"),
            (all(f > 0 for f in self.fractions), "--rate-sweep fractions must be positive"),
            (self.slo.ttft_s > 0 and self.slo.tpot_s > 0, "--slo-ttft and --slo-tpot must be positive"),
            (self.price_per_worker_hour >= 0, "--price-per-worker-hour must not be negative"),
            (self.run.client in (WS, HTTP), f"--client: {WS} or {HTTP}"),
        ]
        check_settings(checks)


@dataclass
class BenchResult:
    report: dict[str, Any]
    files: ReportFiles
    points: list[bench_report.Point]


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("errors {task.fields[errors]}"), TimeElapsedColumn())


def _measure_point(settings: AgentBenchSettings, config: str, fraction: float, rate: float, workload: Workload,
                   out_dir: Path, progress: Progress) -> PointResult:
    total = planned_requests(workload, settings.run.limits)
    task = progress.add_task(f"{config} @ {rate:.3g} sessions/s", total=total, errors=0)
    errors = 0

    def on_record(record: RequestRecord) -> None:
        nonlocal errors
        errors += not record.ok
        progress.update(task, advance=1, errors=errors)

    log = out_dir / "logs" / f"gateway-{config}-x{fraction:g}.log"
    result = run_point(config, workload, settings.run, log, on_record)
    progress.update(task, total=len(result.records), completed=len(result.records))
    return result


def run_benchmark(settings: AgentBenchSettings, out_dir: Path) -> BenchResult:
    settings.validate()
    rate = settings.workload.rate if settings.workload.rate is not None else default_rate(settings.workload.name)
    if rate is None and set(settings.fractions) != {1.0}:
        raise ValueError(f"--rate-sweep needs --rate: {settings.workload.name} replays its trace's own times")
    machine = machine_info()  # before the run: its load average shows other work on the machine, not ours
    points = []
    workloads = {f: build_workload(settings.workload, settings.run.model, None if rate is None else rate * f)
                 for f in set(settings.fractions)}
    if not all(w.sessions for w in workloads.values()):
        raise ValueError("the workload has no session starting within --duration at this --rate: raise either")
    with _progress() as progress:
        for fraction, workload in sorted(workloads.items()):
            offered = session_rate(workload, settings.run.limits.duration_s) if rate is None else rate * fraction
            for config in settings.configs:
                result = _measure_point(settings, config, fraction, offered, workload, out_dir, progress)
                points.append(bench_report.Point(config, fraction, offered, result))
    report = assemble(settings, rate, workloads[1.0], points, machine)
    files = bench_report.write(out_dir, report, points, notes(settings, report))
    return BenchResult(report, files, points)


def assemble(settings: AgentBenchSettings, rate: float | None, workload: Workload, points: Sequence[bench_report.Point],
             machine: dict[str, Any]) -> dict[str, Any]:
    slo, price = settings.slo, settings.price_per_worker_hour
    configs = {p.config: bench_report.config_figures(p, slo, price) for p in points if p.fraction == 1.0}
    ratios = bench_report.config_ratios(configs)
    run = settings.run
    return {
        "workload": {"name": workload.name, "sessions": len(workload.sessions), "requests": workload.num_requests,
                     "settings": workload.settings},
        "configs": configs, "ratios": ratios, "goal": bench_report.goal_check(ratios),
        "sweep": bench_report.sweep_rows(points, slo, price),
        "settings": {
            "workload": asdict(settings.workload), "rate": rate, "rate_fractions": sorted(set(settings.fractions)),
            "configs": list(settings.configs), "model": run.model, "client": run.client,
            "limits": asdict(run.limits), "warm_up_turns": run.warm_up_turns, "slo": asdict(slo),
            "price_per_worker_hour": price, "user_env": dict(run.env),
            "colocated_threads": colocated_threads(run.env),
            "gateway_env": {p.config: p.result.env for p in points if p.fraction == 1.0},
        },
        "machine": machine, "load_average_at_end": list(os.getloadavg()),
    }


def notes(settings: AgentBenchSettings, report: dict[str, Any]) -> list[str]:
    slo = settings.slo
    lines = [
        f"SLO: TTFT <= {slo.ttft_s} s and TPOT <= {slo.tpot_s} s; goodput counts the requests meeting both.",
        f"Cost: ${settings.price_per_worker_hour}/worker-hour x the configuration's workers x the measured window "
        "(first send to last reply), per 1,000 prompt + output tokens (usage). The colocated engine counts as one "
        "worker although it runs as many threads as the disaggregated workers together.",
        f"Equal cores: the colocated baseline runs {report['settings']['colocated_threads']} torch threads, what the "
        "disaggregated workers run in all (configs/deployment.yaml).",
        "The baseline and disaggregated clients resend the whole history over chat completions without a session "
        f"id; the agent client keeps each session ({settings.run.client}).",
    ]
    cores, loads = report["machine"]["cpu_count"] or 1, (report["machine"]["load_average"][0],
                                                         report["load_average_at_end"][0])
    if loads[0] >= 1.0:
        lines.append(f"Other work ran on the machine: 1-minute load {loads[0]:.1f} before the run ({loads[1]:.1f} "
                     f"after it, ours included), on {cores} cores; the figures are noisy.")
    sent = {name: figures["requests_sent"] for name, figures in report["configs"].items()}
    if len(set(sent.values())) > 1:
        counts = ", ".join(f"{name} {count}" for name, count in sent.items())
        lines.append(f"Requests sent differ ({counts}): a session sends its next turn only after its reply, so a "
                     "configuration that falls behind reaches fewer turns before --duration ends.")
    changes = ", ".join(f"{name} {figures['role_changes']}" for name, figures in report["configs"].items())
    lines.append(f"Changes of the prefill/decode split seen during the run (polled every 0.25 s): {changes}.")
    if any(set(f["split"].values()) == {1} and len(f["split"]) == 2 for f in report["configs"].values()):
        lines.append("With one prefill and one decode worker the capacity controller has nothing to move (it keeps "
                     "min_per_role workers per role): add workers, e.g. --env AGENTSERVE_DEPLOYMENT_DECODE=3, to "
                     "see role shifts.")
    for name, figures in report["configs"].items():
        if name != "baseline" and "colocated" in figures["split"]:
            lines.append(f"{name} ran on a colocated engine: this gateway ignored AGENTSERVE_DISAGGREGATED=true.")
        errors = figures["errors"] + len(figures["session_errors"])
        if errors:
            common = next(iter(figures["error_messages"]), None) or figures["session_errors"][0]
            lines.append(f"{name}: {errors} errors (failed requests count as SLO misses); most common: {common}")
    return lines


def _env_item(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.startswith("AGENTSERVE_"):
        raise argparse.ArgumentTypeError(f"--env takes AGENTSERVE_KEY=VALUE, got {text!r}")
    return key, value


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _fractions(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in _names(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rate-sweep takes comma-separated numbers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `agentserve bench --workload`, on the `bench` parser itself."""
    group = parser.add_argument_group("agent benchmark (agentserve bench --workload W --out DIR)")
    group.add_argument("--workload", choices=WORKLOADS, help="agent workload to drive through every configuration")
    group.add_argument("--configs", type=_names, default=CONFIGS, help="comma-separated, of " + ",".join(CONFIGS))
    group.add_argument("--out", type=Path, help="folder for the report files")
    group.add_argument("--model", default="tiny", help="built-in model name or checkpoint dir")
    group.add_argument("--duration", type=float, default=60.0, help="seconds during which turns are sent")
    group.add_argument("--rate", type=float, help="sessions per second (default: the workload's; mooncake: the "
                       "trace's own times)")
    group.add_argument("--rate-sweep", type=_fractions, default=(1.0,), help="fractions of --rate, e.g. 0.5,1,2")
    group.add_argument("--max-requests", type=int, help="requests per point at most")
    group.add_argument("--client", choices=(WS, HTTP), default=WS, help="the agent configuration's session client")
    group.add_argument("--env", type=_env_item, action="append", default=[], metavar="AGENTSERVE_KEY=VALUE",
                       help="setting for every gateway (repeatable), e.g. AGENTSERVE_DEPLOYMENT_PREFILL=2")
    group.add_argument("--slo-ttft", type=float, default=DEFAULT_SLO.ttft_s, help="TTFT SLO, seconds")
    group.add_argument("--slo-tpot", type=float, default=DEFAULT_SLO.tpot_s, help="TPOT SLO, seconds")
    group.add_argument("--price-per-worker-hour", type=float, default=DEFAULT_PRICE_PER_WORKER_HOUR)
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--length-scale", type=float, help="token sizes x this (default: the workload's)")
    group.add_argument("--time-scale", type=float, help="tool gaps x this (default: the workload's)")
    group.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request at most")
    group.add_argument("--warm-up-turns", type=int, default=3, help="unmeasured turns before each point")


def settings_from_args(args: argparse.Namespace) -> AgentBenchSettings:
    workload = WorkloadOptions(args.workload, args.seed, args.rate, args.duration, args.max_requests,
                               args.length_scale, args.time_scale)
    limits = RunLimits(args.duration, args.max_requests, args.request_timeout)
    run = RunOptions(args.model, args.client, limits, args.warm_up_turns, dict(args.env))
    return AgentBenchSettings(workload, tuple(args.configs), run, (1.0, *args.rate_sweep),
                              Slo(args.slo_ttft, args.slo_tpot), args.price_per_worker_hour)


def run(args: argparse.Namespace) -> None:
    if args.workload is None:
        raise ValueError("agentserve bench: give a benchmark kind (see agentserve bench -h) or --workload "
                         + "{" + ",".join(WORKLOADS) + "}")
    if args.out is None:
        raise ValueError("agentserve bench --workload: --out DIR is required")
    result = run_benchmark(settings_from_args(args), args.out)
    print(result.files.markdown.read_text())
    print(f"report: {result.files.json}")

