"""`agentserve bench --workload W` without `--rate`: each configuration's SLO rate, DistServe's throughput.

For each configuration, a search (`search.py`) probes session arrival rates from the workload's own
(`--search-start`), each probe a full run of `--probe-duration` seconds on a fresh gateway (the workload built
at that rate with the same seed), until it has the highest rate at which at least 90% of the requests meet the
SLO within `--precision`, in `--max-probes` probes at most. The configurations' searches take their probes in
turn (`search_in_turn`), so a host whose speed drifts during the run slows them alike. A probe's drain is cut to
the longest a request could take and still meet the SLO: a request still running then has missed it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.progress import Progress, TaskID

from agents_eval.bench.agent.run import Point, RunOptions, measure_point
from agents_eval.bench.agent.search.search import SearchResult, search_in_turn
from agents_eval.bench.agent.settings import AgentBenchSettings, SearchSettings
from agents_eval.bench.agent.workload import WorkloadOptions, build_workload, default_rate, session_rate
from agents_eval.harness.drive import RunLimits
from agents_eval.harness.stats import Slo, slo_attainment
from agents_eval.workloads.types import Workload

DRAIN_MARGIN_S = 1.0
MIN_SESSIONS_PER_PROBE = 3.0  # the search goes no lower than a rate starting this many sessions a probe


@dataclass
class Workloads:
    """The workload at each rate probed, built once and shared by the configurations."""

    options: WorkloadOptions
    model: str
    built: dict[float | None, Workload] = field(default_factory=dict)

    def at(self, rate: float | None) -> Workload:
        if rate not in self.built:
            self.built[rate] = build_workload(self.options, self.model, rate)
        return self.built[rate]


def start_rate(settings: SearchSettings, workloads: Workloads) -> float:
    if settings.start_rate is not None:
        return settings.start_rate
    own = default_rate(workloads.options.name)
    return own if own is not None else session_rate(workloads.at(None), settings.probe_duration_s)


def probe_limits(limits: RunLimits, slo: Slo, workload: Workload, duration_s: float) -> RunLimits:
    """The probe's duration, and a drain no longer than the slowest reply that could still meet the SLO."""
    longest = max((t.max_output_tokens for s in workload.sessions for t in s.turns), default=1)
    drain = slo.ttft_s + slo.tpot_s * max(0, longest - 1) + DRAIN_MARGIN_S
    return replace(limits, duration_s=duration_s, drain_timeout_s=min(limits.drain_timeout_s, drain))


def probe_point(config: str, tag: str, rate: float, workloads: Workloads, run: RunOptions, slo: Slo,
                settings: SearchSettings, out_dir: Path, progress: Progress) -> Point | None:
    """One probe-length run of `config` at `rate` on a fresh gateway; None when no session starts."""
    workload = workloads.at(rate)
    if not workload.sessions:
        return None
    options = replace(run, limits=probe_limits(run.limits, slo, workload, settings.probe_duration_s))
    return measure_point(config, tag, rate, workload, options, out_dir, progress)


def prober(config: str, workloads: Workloads, run: RunOptions, slo: Slo, settings: SearchSettings, out_dir: Path,
           progress: Progress) -> Callable[[float], tuple[float, Point | None]]:
    """`measure(rate)` for the search: one full run of `config` at `rate`; NaN when no session starts."""
    count = 0

    def measure(rate: float) -> tuple[float, Point | None]:
        nonlocal count
        count += 1
        point = probe_point(config, f"probe{count}", rate, workloads, run, slo, settings, out_dir, progress)
        return (math.nan, None) if point is None else (slo_attainment(point.result.records, slo), point)

    return measure


def headline(search: SearchResult[Point | None]) -> Point:
    """The probe at the SLO rate; when none met the SLO, the lowest rate measured."""
    if search.low is not None and search.low.figures is not None:
        return search.low.figures
    measured = [p.figures for p in search.probes if p.figures is not None]
    if not measured:
        raise ValueError("no session started within --probe-duration at any rate probed: raise --probe-duration "
                         "or --search-start")
    return min(measured, key=lambda point: point.offered_rate)


def tracked(measure: Callable[[float], tuple[float, Point | None]], task: TaskID,
            progress: Progress) -> Callable[[float], tuple[float, Point | None]]:
    """`measure` advancing the progress bar of the configuration's search."""

    def measure_tracked(rate: float) -> tuple[float, Point | None]:
        attainment, point = measure(rate)
        progress.update(task, advance=1, note=f"{rate:.3g} sessions/s: {attainment:.0%} within SLO")
        return attainment, point

    return measure_tracked


def probe_workloads(settings: AgentBenchSettings) -> Workloads:
    if settings.search is None:
        raise ValueError("the SLO-rate search needs its settings")
    return Workloads(replace(settings.workload, rate=None, duration_s=settings.search.probe_duration_s),
                     settings.run.model)


def run_search(settings: AgentBenchSettings, workloads: Workloads, start: float, out_dir: Path, progress: Progress,
               ) -> tuple[list[Point], dict[str, SearchResult[Point | None]]]:
    """Every configuration's search from `start`; each probe's Point, the configuration's headline one marked."""
    search_settings = settings.search or SearchSettings()
    floor = MIN_SESSIONS_PER_PROBE / search_settings.probe_duration_s
    options = replace(search_settings.options, min_rate=min(floor, start, search_settings.options.max_rate))
    tasks = {config: progress.add_task(f"SLO-rate search: {config}", total=options.max_probes, note="")
             for config in settings.configs}
    measures = {config: tracked(prober(config, workloads, settings.run, settings.slo, search_settings, out_dir,
                                       progress), task, progress)
                for config, task in tasks.items()}
    searches = search_in_turn(measures, start, options)
    points: list[Point] = []
    for config, search in searches.items():
        progress.update(tasks[config], total=len(search.probes), note=f"SLO rate {search.rate:.3g} sessions/s")
        best = headline(search)
        points += [replace(p.figures, headline=p.figures is best) for p in search.probes if p.figures is not None]
    return points, searches
