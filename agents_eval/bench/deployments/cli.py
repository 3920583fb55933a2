"""The options of `agentserve bench --workload W --loop closed` (the default for coding-agent) and the settings
they make (`ClosedLoopSettings`)."""

from __future__ import annotations

import argparse

from agents_eval.bench.agent.workload import WorkloadOptions
from agents_eval.bench.deployments.deployments import DEPLOYMENTS, DeploymentOptions
from agents_eval.bench.deployments.settings import ClosedLoopSettings, quick
from agents_eval.harness.servers.litellm_proxy import DEFAULT_STRATEGY

OPEN, CLOSED = "open", "closed"
CLOSED_BY_DEFAULT = ("coding-agent",)
DEFAULTS = ClosedLoopSettings(WorkloadOptions("coding-agent"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("closed loop (agentserve bench --workload W --loop closed: deployments)")
    group.add_argument("--loop", choices=(OPEN, CLOSED), help="open: the SLO-rate search over --configs; closed: "
                       "the deployments, agents held within the SLO and batch completion (default for "
                       f"{', '.join(CLOSED_BY_DEFAULT)})")
    group.add_argument("--deployments", type=lambda text: tuple(p.strip() for p in text.split(",") if p.strip()),
                       default=DEPLOYMENTS, help=f"comma-separated, of {','.join(DEPLOYMENTS)}")
    group.add_argument("--quick", action="store_true", help="2 agents at most, short windows and batches")
    group.add_argument("--threads", type=int, default=DEFAULTS.options.threads, help="cores of every deployment")
    group.add_argument("--max-agents", type=int, default=DEFAULTS.options.max_agents)
    group.add_argument("--window", type=float, default=DEFAULTS.window_s, help="seconds per agent-count step")
    group.add_argument("--batch-sessions", type=int, default=DEFAULTS.batch_sessions)
    group.add_argument("--batch-calls", type=int, default=DEFAULTS.batch_calls, help="calls kept of each")
    group.add_argument("--slo-factor", type=float, default=DEFAULTS.slo_factor,
                       help="the SLO: this x llama-server's single-agent TTFT p50 and TPOT p50")
    group.add_argument("--litellm-strategy", default=DEFAULT_STRATEGY, help="LiteLLM router's routing_strategy")
    group.add_argument("--budget", type=float, default=DEFAULTS.budget_s / 60, help="minutes for the whole run")
    group.add_argument("--rotate", type=int, default=0, help="rotate the deployments' order by this many places")


def closed_loop(args: argparse.Namespace) -> bool:
    return args.loop == CLOSED or (args.loop is None and args.workload in CLOSED_BY_DEFAULT)


def settings_from_args(args: argparse.Namespace) -> ClosedLoopSettings:
    workload = WorkloadOptions(args.workload, args.seed, None, 100.0, None, args.length_scale, args.time_scale)
    options = DeploymentOptions(args.model, args.threads, args.max_agents, client=args.client,
                                litellm_strategy=args.litellm_strategy, env=dict(args.env),
                                request_timeout_s=args.request_timeout)
    settings = ClosedLoopSettings(workload, args.deployments, options, args.window,
                                  batch_sessions=args.batch_sessions, batch_calls=args.batch_calls,
                                  slo_factor=args.slo_factor, request_timeout_s=args.request_timeout,
                                  budget_s=args.budget * 60, rotate=args.rotate)
    return quick(settings) if args.quick else settings
