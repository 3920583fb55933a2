"""What one closed-loop run is told (`agentserve bench --workload W --loop closed`), and its `--quick` sizes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from agents_eval.bench.agent.workload import WorkloadOptions
from agents_eval.bench.deployments.deployments import DEPLOYMENTS, LLAMA_SERVER, DeploymentOptions
from agents_eval.harness.report import check_settings


@dataclass(frozen=True)
class ClosedLoopSettings:
    workload: WorkloadOptions
    deployments: tuple[str, ...] = DEPLOYMENTS
    options: DeploymentOptions = field(default_factory=DeploymentOptions)
    window_s: float = 30.0  # each agent-count step sends turns for this long
    light_calls: int = 6  # calls of the one-agent light-load run (and of the SLO calibration)
    batch_sessions: int = 4  # the fixed batch, all started at once
    batch_calls: int = 6  # calls kept of each batch session (its first ones)
    batch_timeout_s: float = 150.0  # a batch not done by then is reported as not completed
    slo_factor: float = 5.0  # the SLO: this x the single-agent latency on llama-server, measured at the start
    request_timeout_s: float = 60.0
    drain_timeout_s: float = 60.0  # a step's requests still running this long after its window: misses
    warm_up_turns: int = 1
    budget_s: float = 40 * 60.0  # the whole run: each deployment's steps stop within its share
    rotate: int = 0  # the deployments' order, rotated by this many places (runs on a drifting host: vary it)

    def validate(self) -> None:
        unknown = sorted(set(self.deployments) - set(DEPLOYMENTS))
        check_settings([
            (not unknown, f"unknown --deployments {', '.join(unknown)}; choose from {', '.join(DEPLOYMENTS)}"),
            (bool(self.deployments) and len(set(self.deployments)) == len(self.deployments),
             "--deployments: at least one, each once"),
            (self.window_s > 0 and self.batch_timeout_s > 0, "--window and --batch-timeout must be positive"),
            (self.light_calls >= 2 and self.batch_sessions >= 1 and self.batch_calls >= 1,
             "--light-calls >= 2, --batch-sessions >= 1, --batch-calls >= 1"),
            (self.options.max_agents >= 1 and self.options.threads >= 1, "--max-agents and --threads >= 1"),
            (self.slo_factor > 0, "--slo-factor must be positive"),
        ])

    def ordered(self) -> tuple[str, ...]:
        """The deployments in the order run: alternating agentserve's and llama.cpp's (`interleaved`), rotated."""
        names = interleaved(self.deployments)
        shift = self.rotate % len(names)
        return names[shift:] + names[:shift]


def interleaved(names: tuple[str, ...]) -> tuple[str, ...]:
    """agentserve's deployments and the others in turn, so a host slowing down during the run slows both alike."""
    from agents_eval.bench.deployments.deployments import AGENTSERVE

    ours = [n for n in names if n in AGENTSERVE]
    others = [n for n in names if n not in AGENTSERVE]
    order: list[str] = []
    while ours or others:
        order += [lst.pop(0) for lst in (others, ours) if lst]
    return tuple(order)


def quick(settings: ClosedLoopSettings) -> ClosedLoopSettings:
    """`--quick`: a few agents, short windows and batches (tests, a smoke run)."""
    options = replace(settings.options, max_agents=min(settings.options.max_agents, 2))
    return replace(settings, options=options, window_s=min(settings.window_s, 6.0), light_calls=3,
                   batch_sessions=2, batch_calls=3, batch_timeout_s=min(settings.batch_timeout_s, 60.0),
                   warm_up_turns=1)


CALIBRATION = LLAMA_SERVER  # the deployment whose single-agent latency sets the SLO
