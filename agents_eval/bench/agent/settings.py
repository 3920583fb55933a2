"""Everything one `agentserve bench --workload` run is told: the workload, the configurations, the client and
limits, the SLO, the prices, and either the SLO-rate search (the default) or a fixed `--rate`."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents_eval.bench.agent.configs import CONFIGS, DEFAULT_CONFIGS, NAMED_SETS
from agents_eval.bench.agent.report.cost import CostSettings
from agents_eval.bench.agent.run import HTTP, WS, RunOptions
from agents_eval.bench.agent.search.search import SearchOptions
from agents_eval.bench.agent.workload import WorkloadOptions
from agents_eval.harness.report import check_settings
from agents_eval.harness.stats import Slo

# About 10x what an unloaded gateway gives the tiny model on 2 CPU cores (TTFT ~50 ms, TPOT ~5 ms); set both
# for a real model and machine.
DEFAULT_SLO = Slo(ttft_s=0.5, tpot_s=0.05)


@dataclass(frozen=True)
class SearchSettings:
    """The SLO-rate search: each probe a run of `probe_duration_s` at one rate (agent_bench_slo)."""

    probe_duration_s: float = 20.0
    start_rate: float | None = None  # None: the workload's own rate (mooncake: its trace's)
    options: SearchOptions = field(default_factory=SearchOptions)

    def check(self) -> list[tuple[bool, str]]:
        return [(self.probe_duration_s > 0, "--probe-duration must be positive"),
                (self.start_rate is None or self.start_rate > 0, "--search-start must be positive"),
                *self.options.check()]


@dataclass(frozen=True)
class AgentBenchSettings:
    workload: WorkloadOptions
    configs: tuple[str, ...] = DEFAULT_CONFIGS
    run: RunOptions = field(default_factory=RunOptions)
    fractions: tuple[float, ...] = (1.0,)  # of workload.rate, with a fixed rate
    slo: Slo = DEFAULT_SLO
    prices: CostSettings = field(default_factory=CostSettings)
    search: SearchSettings | None = None  # None: one point per fraction at workload.rate

    def validate(self) -> None:
        limits = self.run.limits
        checks = [
            (bool(self.configs) and set(self.configs) <= set(CONFIGS),
             f"--configs: choose from {', '.join(CONFIGS)}, or a named set ({', '.join(NAMED_SETS)})"),
            (len(set(self.configs)) == len(self.configs), "--configs: each configuration once"),
            (limits.duration_s > 0, "--duration must be positive"),
            (limits.max_requests is None or limits.max_requests >= 1, "--max-requests must be at least 1"),
            (self.workload.rate is None or self.workload.rate > 0, "--rate must be positive"),
            (all(f > 0 for f in self.fractions), "--rate-sweep fractions must be positive"),
            (self.slo.ttft_s > 0 and self.slo.tpot_s > 0, "--slo-ttft and --slo-tpot must be positive"),
            (self.prices.price_per_core_hour >= 0 and self.prices.price_per_gpu_hour >= 0,
             "--price-per-core-hour and --price-per-gpu-hour must not be negative"),
            (self.run.client in (WS, HTTP), f"--client: {WS} or {HTTP}"),
        ]
        if self.search is not None:
            checks += [(self.workload.rate is None, "--rate gives one point: the SLO-rate search takes no --rate"),
                       (set(self.fractions) == {1.0}, "--rate-sweep needs --rate"), *self.search.check()]
        check_settings(checks)
