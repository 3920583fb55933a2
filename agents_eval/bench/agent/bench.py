"""`agentserve bench --workload {mooncake,webarena,swe}`: real agent sessions through real gateways, one
gateway process per configuration and point, and the table the project's claim rests on.

Configurations (`--configs`, agent_bench_configs), each measured on the same workload (same seed, sessions,
turns and arrival times at a given rate). The default three:
- `baseline`: the colocated engine without prefix caching, pruning or masks; the client resends the whole
  history each turn over chat completions, with no session id;
- `disaggregated`: prefill and decode workers (DistServe), fixed split, prefix caching on; client as baseline;
- `agent`: everything on (capacity controller, sessions, turn-delta reuse, pruning, masks); the client keeps
  each session over the Responses WebSocket (`--client ws`) or chat completions with `X-Session-Id`
  (`--client http`).
`--configs ablation` runs seven, each adding one step to another; the report says what each step buys
(agent_bench_ablation).

By default each configuration's throughput is its SLO rate (DistServe): the highest session arrival rate at
which 90% of the requests meet the TTFT and TPOT SLO, found by a rate search (agent_bench_slo). With `--rate`
the workload runs at that rate times each fraction of `--rate-sweep` (1.0 always included: the headline
point), for `--duration` seconds. See docs/agents_eval.md ("Agent benchmark") for every figure's definition.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rich.progress import Progress

from agents_eval.bench.agent.ablation import ablation_steps
from agents_eval.bench.agent.cli import add_arguments, settings_from_args
from agents_eval.bench.agent.gateway import colocated_threads
from agents_eval.bench.agent.report import report as bench_report
from agents_eval.bench.agent.report.notes import notes
from agents_eval.bench.agent.run import Point, measure_point
from agents_eval.bench.agent.search.search import SLO_TARGET, SearchResult
from agents_eval.bench.agent.search.slo import Workloads, probe_point, probe_workloads, run_search, start_rate
from agents_eval.bench.agent.settings import AgentBenchSettings
from agents_eval.bench.agent.workload import WORKLOADS, build_workload, default_rate, session_rate
from agents_eval.bench.deployments.bench import run_closed_loop
from agents_eval.bench.deployments.cli import closed_loop
from agents_eval.bench.deployments.cli import settings_from_args as closed_settings
from agents_eval.harness.drive import progress_display
from agents_eval.harness.report import ReportFiles, machine_info
from agents_eval.workloads.types import Workload

__all__ = ["AgentBenchSettings", "BenchResult", "add_arguments", "run", "run_benchmark"]
Searches = Mapping[str, SearchResult[Point | None]]


@dataclass
class BenchResult:
    report: dict[str, Any]
    files: ReportFiles
    points: list[Point]


def run_benchmark(settings: AgentBenchSettings, out_dir: Path) -> BenchResult:
    """The SLO-rate search of every configuration, or (with `settings.search` None) the fixed-rate points."""
    settings.validate()
    machine = machine_info()  # before the run: its load average shows other work on the machine, not ours
    with progress_display() as progress:
        if settings.search is None:
            rate, workload, points = _fixed_points(settings, out_dir, progress)
            searches: Searches = {}
        else:
            workloads = probe_workloads(settings)
            rate = start_rate(settings.search, workloads)
            points, searches = run_search(settings, workloads, rate, out_dir, progress)
            points += at_baseline_rate(settings, workloads, searches, out_dir, progress)
            workload = workloads.at(rate)
    report = assemble(settings, rate, workload, points, searches, machine)
    files = bench_report.write(out_dir, report, points, notes(settings, report))
    return BenchResult(report, files, points)


def at_baseline_rate(settings: AgentBenchSettings, workloads: Workloads, searches: Searches, out_dir: Path,
                     progress: Progress) -> list[Point]:
    """The agent measured at the baseline's SLO rate, where its p99 goal is judged: none when its search
    already probed that rate, or when either configuration did not search or the baseline met no rate."""
    baseline, agent = searches.get(bench_report.BASELINE), searches.get(bench_report.AGENT)
    if settings.search is None or baseline is None or agent is None or baseline.low is None:
        return []
    if any(probe.rate == baseline.rate for probe in agent.probes):
        return []
    point = probe_point(bench_report.AGENT, "at-baseline-rate", baseline.rate, workloads, settings.run,
                        settings.slo, settings.search, out_dir, progress)
    return [] if point is None else [point]


def _fixed_points(settings: AgentBenchSettings, out_dir: Path,
                  progress: Progress) -> tuple[float | None, Workload, list[Point]]:
    rate = settings.workload.rate if settings.workload.rate is not None else default_rate(settings.workload.name)
    if rate is None and set(settings.fractions) != {1.0}:
        raise ValueError(f"--rate-sweep needs --rate: {settings.workload.name} replays its trace's own times")
    workloads = {f: build_workload(settings.workload, settings.run.model, None if rate is None else rate * f)
                 for f in set(settings.fractions)}
    if not all(w.sessions for w in workloads.values()):
        raise ValueError("the workload has no session starting within --duration at this --rate: raise either")
    points = []
    for fraction, workload in sorted(workloads.items()):
        offered = session_rate(workload, settings.run.limits.duration_s) if rate is None else rate * fraction
        for config in settings.configs:
            point = measure_point(config, f"x{fraction:g}", offered, workload, settings.run, out_dir, progress)
            points.append(replace(point, headline=fraction == 1.0))
    return rate, workloads[1.0], points


def config_figures(settings: AgentBenchSettings, points: Sequence[Point], searches: Searches) -> dict[str, Any]:
    """Each configuration's figures at its headline point, with what its search found."""
    configs = {}
    for point in points:
        if point.headline:
            figures = bench_report.config_figures(point, settings.slo, settings.prices)
            if point.config in searches and settings.search is not None:
                figures |= bench_report.slo_figures(searches[point.config], figures,
                                                    settings.search.options.precision)
            configs[point.config] = figures
    return {name: configs[name] for name in settings.configs if name in configs}


def assemble(settings: AgentBenchSettings, rate: float | None, workload: Workload, points: Sequence[Point],
             searches: Searches, machine: dict[str, Any]) -> dict[str, Any]:
    configs = config_figures(settings, points, searches)
    sweep = bench_report.sweep_rows(points, settings.slo, settings.prices)
    ratios = bench_report.config_ratios(configs, sweep)
    run, search = settings.run, settings.search
    return {
        "workload": {"name": workload.name, "sessions": len(workload.sessions), "requests": workload.num_requests,
                     "settings": workload.settings},
        "configurations": configs, "ratios": ratios, "ablation": ablation_steps(configs),
        "goal": (checks := bench_report.goal_check(ratios)),
        "light_load": (light := bench_report.light_load_check(sweep)), "goals": [*checks, *light],
        "sweep": sweep,
        "settings": {
            "mode": "fixed-rate" if search is None else "slo-rate search", "workload": asdict(settings.workload),
            "rate": rate, "rate_fractions": sorted(set(settings.fractions)), "configs": list(settings.configs),
            "model": run.model, "client": run.client, "limits": asdict(run.limits),
            "warm_up_turns": run.warm_up_turns, "slo": asdict(settings.slo),
            "slo_target": SLO_TARGET if search is None else search.options.target,
            "search": None if search is None else {"probe_duration_s": search.probe_duration_s,
                                                   **asdict(search.options)},
            "prices": settings.prices.model_dump(), "user_env": dict(run.env),
            "colocated_threads": colocated_threads(run.env),
            "gateway_env": {p.config: p.result.env for p in points if p.headline},
        },
        "machine": machine, "load_average_at_end": list(os.getloadavg()),
    }


def run(args: argparse.Namespace) -> None:
    if args.workload is None:
        raise ValueError("agentserve bench: give a benchmark kind (see agentserve bench -h) or --workload "
                         + "{" + ",".join(WORKLOADS) + "}")
    if args.out is None:
        raise ValueError("agentserve bench --workload: --out DIR is required")
    if closed_loop(args):
        _, files = run_closed_loop(closed_settings(args), args.out)
        print(files.markdown.read_text())
        print(f"report: {files.json}")
        return
    result = run_benchmark(settings_from_args(args), args.out)
    print(result.files.markdown.read_text())
    print(f"report: {result.files.json}")
