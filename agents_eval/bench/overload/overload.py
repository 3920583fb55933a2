"""The overload run: the configuration's SLO rate (the agent benchmark's search, admission off as in every
probe), then `factor` times that rate for `duration_s`, once with the gateway's admission control set to the
TTFT and TPOT SLO ("guarded") and once without ("unguarded"), on the same workload over chat completions with
`X-Session-Id` (an HTTP refusal carries its Retry-After header)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import Progress

from agents_eval.bench.agent.run import HTTP, RunOptions, measure_point
from agents_eval.bench.agent.search import SearchOptions
from agents_eval.bench.agent.settings import DEFAULT_SLO, AgentBenchSettings, SearchSettings
from agents_eval.bench.agent.slo import probe_workloads, run_search, start_rate
from agents_eval.bench.agent.workload import WorkloadOptions, build_workload
from agents_eval.bench.overload.outcomes import outcomes
from agents_eval.harness.drive import RunLimits
from agents_eval.harness.report import check_settings
from agents_eval.harness.stats import Slo

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
    seed: int = 0
    env: dict[str, str] = field(default_factory=dict)  # for every gateway

    def validate(self) -> None:
        check_settings([(self.factor > 1, "--factor must be above 1"),
                        (self.duration_s > 0, "--duration must be positive"),
                        (self.slo_rate is None or self.slo_rate > 0, "--slo-rate must be positive"),
                        (self.slo.ttft_s > 0 and self.slo.tpot_s > 0, "--slo-ttft and --slo-tpot must be positive"),
                        (self.request_timeout_s > 0, "--request-timeout must be positive")])


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
    limits = RunLimits(settings.duration_s, None, settings.request_timeout_s, settings.request_timeout_s)
    options = RunOptions(settings.model, HTTP, limits, env=env)
    tag = "guarded" if guarded else "unguarded"
    point = measure_point(settings.config, tag, rate, workload, options, out_dir, progress)
    found = outcomes(point.result.records, settings.slo)
    return {**asdict(found), "verdicts": found.verdicts(settings.slo), "gateway_env": point.result.env}


def run_overload(settings: OverloadSettings, out_dir: Path, progress: Progress) -> dict[str, Any]:
    settings.validate()
    probes: list[dict[str, Any]] = []
    slo_rate, lower_bound = settings.slo_rate, False
    if slo_rate is None:
        slo_rate, probes, lower_bound = find_slo_rate(settings, out_dir, progress)
    rate = settings.factor * slo_rate
    runs = {tag: overloaded(settings, rate, tag == "guarded", out_dir, progress) for tag in ("guarded", "unguarded")}
    return {"settings": asdict(settings), "slo_rate_sessions_per_s": slo_rate, "slo_rate_is_lower_bound": lower_bound,
            "search_probes": probes,
            "offered_rate_sessions_per_s": rate, "runs": runs, "goals_met": all(runs["guarded"]["verdicts"].values())}
