"""The overload run: the configuration's SLO rate (the agent benchmark's search, admission off as in every
probe), then `factor` times that rate for `duration_s`, once with the gateway's admission control set to the
TTFT and TPOT SLO ("guarded") and once without ("unguarded"), on the same workload over chat completions with
`X-Session-Id` (an HTTP refusal carries its Retry-After header). A refused turn is sent again after its
Retry-After (at most `max_retry_wait_s`, `retries` times), as a real client does; a session ends only when
its retries run out.

Goals (`goals`), each judged on the guarded run against the unguarded one at the same rate: the guarded run
completes at least as many turns within the SLO (goodput), its admitted TTFT and TPOT p99 within the SLO,
every refusal with Retry-After, nothing timed out."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import Progress

from agents_eval.bench.agent.run import HTTP, RunOptions, measure_point
from agents_eval.bench.agent.search.search import SearchOptions
from agents_eval.bench.agent.search.slo import probe_workloads, run_search, start_rate
from agents_eval.bench.agent.settings import DEFAULT_SLO, AgentBenchSettings, SearchSettings
from agents_eval.bench.agent.workload import WorkloadOptions, build_workload
from agents_eval.bench.overload.outcomes import outcomes
from agents_eval.harness.drive import RunLimits
from agents_eval.harness.report import check_settings, goal
from agents_eval.harness.stats import Slo, ratio

ADMISSION_TTFT_ENV = "AGENTSERVE_LIMITS__TTFT_SLO_S"
ADMISSION_TPOT_ENV = "AGENTSERVE_LIMITS__TPOT_SLO_S"


@dataclass(frozen=True)
class OverloadSettings:
    workload: str = "swe"
    config: str = "agent"
    model: str = "tiny"
    factor: float = 2.0  # times the SLO rate
    duration_s: float = 60.0
    slo: Slo = DEFAULT_SLO
    slo_rate: float | None = None  # sessions/s; None: found by the search
    probe_duration_s: float = 20.0
    max_probes: int = 6
    request_timeout_s: float = 60.0
    retries: int = 3  # sends of a refused turn again, after its Retry-After
    max_retry_wait_s: float = 10.0
    seed: int = 0
    env: dict[str, str] = field(default_factory=dict)  # for every gateway

    def validate(self) -> None:
        check_settings([(self.factor > 1, "--factor must be above 1"),
                        (self.duration_s > 0, "--duration must be positive"),
                        (self.slo_rate is None or self.slo_rate > 0, "--slo-rate must be positive"),
                        (self.slo.ttft_s > 0 and self.slo.tpot_s > 0, "--slo-ttft and --slo-tpot must be positive"),
                        (self.request_timeout_s > 0, "--request-timeout must be positive"),
                        (self.retries >= 0 and self.max_retry_wait_s >= 0, "--retries must be 0 or more")])


def search_settings(settings: OverloadSettings) -> AgentBenchSettings:
    run = RunOptions(settings.model, HTTP, RunLimits(settings.probe_duration_s, None, settings.request_timeout_s),
                     env=settings.env)
    search = SearchSettings(settings.probe_duration_s, None, SearchOptions(max_probes=settings.max_probes))
    return AgentBenchSettings(WorkloadOptions(settings.workload, settings.seed), (settings.config,), run,
                              slo=settings.slo, search=search)


def find_slo_rate(settings: OverloadSettings, out_dir: Path,
                  progress: Progress) -> tuple[float, list[dict[str, Any]], bool]:
    """The configuration's SLO rate, its probes (rate, attainment), and whether every probe met the SLO (the
    rate is then a lower bound: raise --max-probes)."""
    bench = search_settings(settings)
    workloads = probe_workloads(bench)
    assert bench.search is not None
    _, searches = run_search(bench, workloads, start_rate(bench.search, workloads), out_dir, progress)
    search = searches[settings.config]
    if search.rate <= 0:
        raise RuntimeError("no rate probed met the SLO: relax --slo-ttft / --slo-tpot or give --slo-rate")
    return search.rate, [{"rate": p.rate, "attainment": p.attainment} for p in search.probes], search.capped


def overloaded(settings: OverloadSettings, rate: float, guarded: bool, out_dir: Path,
               progress: Progress) -> dict[str, Any]:
    """One run at `rate`; with `guarded`, admission control refuses what would miss the TTFT or TPOT SLO."""
    workload = build_workload(WorkloadOptions(settings.workload, settings.seed, rate, settings.duration_s),
                              settings.model, rate)
    slo_env = {ADMISSION_TTFT_ENV: str(settings.slo.ttft_s), ADMISSION_TPOT_ENV: str(settings.slo.tpot_s)}
    env = {**settings.env, **(slo_env if guarded else {})}
    limits = RunLimits(settings.duration_s, None, settings.request_timeout_s, settings.request_timeout_s,
                       settings.retries, settings.max_retry_wait_s)
    options = RunOptions(settings.model, HTTP, limits, env=env)
    tag = "guarded" if guarded else "unguarded"
    point = measure_point(settings.config, tag, rate, workload, options, out_dir, progress)
    found = outcomes(point.result.records, settings.slo)
    return {**asdict(found), "gateway_env": point.result.env}


def run_overload(settings: OverloadSettings, out_dir: Path, progress: Progress) -> dict[str, Any]:
    settings.validate()
    probes: list[dict[str, Any]] = []
    slo_rate, lower_bound = settings.slo_rate, False
    if slo_rate is None:
        slo_rate, probes, lower_bound = find_slo_rate(settings, out_dir, progress)
    rate = settings.factor * slo_rate
    runs = {tag: overloaded(settings, rate, tag == "guarded", out_dir, progress) for tag in ("guarded", "unguarded")}
    found = goals(runs, settings.slo)
    return {"settings": asdict(settings), "slo_rate_sessions_per_s": slo_rate, "slo_rate_is_lower_bound": lower_bound,
            "search_probes": probes, "offered_rate_sessions_per_s": rate, "runs": runs, "goals": found,
            "goals_met": all(g["met"] for g in found)}


def goals(runs: dict[str, dict[str, Any]], slo: Slo) -> list[dict[str, Any]]:
    """The guarded run against the unguarded one: goodput (turns within the SLO) at least its equal; and the
    guarded run's own bounds, each as a ratio to its limit (the SLO) or a count that must stay 0."""
    guarded, unguarded = runs["guarded"], runs["unguarded"]
    return [
        goal("guarded/unguarded turns completed within the SLO", 1.0, "min",
             _at_least(guarded["turns_within_slo"], unguarded["turns_within_slo"]),
             guarded=guarded["turns_within_slo"], unguarded=unguarded["turns_within_slo"]),
        goal("guarded admitted TTFT p99 / TTFT SLO", 1.0, "max", guarded["admitted_ttft_p99_s"] / slo.ttft_s),
        goal("guarded admitted TPOT p99 / TPOT SLO", 1.0, "max", guarded["admitted_tpot_p99_s"] / slo.tpot_s),
        goal("guarded refusals without Retry-After", 0, "max", guarded["refused_without_retry_after"]),
        goal("guarded requests timed out", 0, "max", guarded["timed_out"]),
        goal("guarded requests failed otherwise", 0, "max", guarded["other_errors"]),
    ]


def _at_least(guarded: int, unguarded: int) -> float:
    """guarded / unguarded; with no unguarded turn within the SLO, 1.0 when neither had one, else infinity."""
    if unguarded:
        return ratio(guarded, unguarded)
    return math.inf if guarded else 1.0
