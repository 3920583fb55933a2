"""The options of `agentserve bench --workload W` and the settings they make (`AgentBenchSettings`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agents_eval.bench.agent.configs import CONFIGS, DEFAULT_CONFIGS, NAMED_SETS, config_names
from agents_eval.bench.agent.report.cost import CostSettings
from agents_eval.bench.agent.run import HTTP, WS, RunOptions
from agents_eval.bench.agent.search.search import SearchOptions
from agents_eval.bench.agent.settings import DEFAULT_SLO, AgentBenchSettings, SearchSettings
from agents_eval.bench.agent.workload import WORKLOADS, WorkloadOptions
from agents_eval.bench.deployments.cli import add_arguments as closed_loop_arguments
from agents_eval.harness.drive import RunLimits
from agents_eval.harness.servers.gateway import env_item
from agents_eval.harness.stats import Slo

SEARCH = SearchSettings()
HISTORY_POLICIES = ("age", "query", "attention")  # trajectory.settings.HistorySettings' policies
HISTORY_POLICY_ENV = "AGENTSERVE_TRAJECTORY_HISTORY__DEFAULT"


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
    group.add_argument("--configs", type=config_names, default=DEFAULT_CONFIGS,
                       help=f"comma-separated, of {','.join(CONFIGS)}; or a named set: {', '.join(NAMED_SETS)} "
                       "(ablation: all seven, each adding one step)")
    group.add_argument("--out", type=Path, help="folder for the report files")
    group.add_argument("--model", default="tiny", help="built-in model name or checkpoint dir")
    group.add_argument("--rate", type=float, help="sessions per second: one point at this rate instead of the "
                       "SLO-rate search")
    group.add_argument("--duration", type=float, default=60.0, help="seconds during which turns are sent (--rate)")
    group.add_argument("--rate-sweep", type=_fractions, default=(1.0,), help="fractions of --rate, e.g. 0.5,1,2")
    _add_search_arguments(parser)
    closed_loop_arguments(parser)
    group.add_argument("--max-requests", type=int, help="requests per point at most")
    group.add_argument("--client", choices=(WS, HTTP), default=WS, help="the agent configuration's session client")
    group.add_argument("--env", type=env_item, action="append", default=[], metavar="AGENTSERVE_KEY=VALUE",
                       help="setting for every gateway (repeatable), e.g. AGENTSERVE_DEPLOYMENT_PREFILL=2")
    group.add_argument("--history-policy", choices=HISTORY_POLICIES,
                       help="which history every configuration's replies read (configs/trajectory.yaml: history; "
                       "default: the deployment's, age)")
    group.add_argument("--slo-ttft", type=float, default=DEFAULT_SLO.ttft_s, help="TTFT SLO, seconds")
    group.add_argument("--slo-tpot", type=float, default=DEFAULT_SLO.tpot_s, help="TPOT SLO, seconds")
    group.add_argument("--price-per-core-hour", type=float, help="dollars (default: configs/cost.yaml)")
    group.add_argument("--price-per-gpu-hour", type=float, help="dollars (default: configs/cost.yaml)")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--length-scale", type=float, help="token sizes x this (default: the workload's)")
    group.add_argument("--time-scale", type=float, help="tool gaps x this (default: the workload's)")
    group.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request at most")
    group.add_argument("--warm-up-turns", type=int, default=3, help="unmeasured turns before each point")


def _add_search_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("SLO-rate search (agentserve bench --workload W without --rate)")
    options = SEARCH.options
    group.add_argument("--probe-duration", type=float, default=SEARCH.probe_duration_s,
                       help="seconds during which each probe sends turns")
    group.add_argument("--max-probes", type=int, default=options.max_probes, help="probes per configuration at most")
    group.add_argument("--precision", type=float, default=options.precision,
                       help="stop when the bracket's high / low - 1 is at most this")
    group.add_argument("--growth", type=float, default=options.growth, help="rate factor between bracketing probes")
    group.add_argument("--search-start", type=float, help="first rate probed, sessions/s (default: the workload's)")
    group.add_argument("--max-rate", type=float, help="highest rate probed, sessions/s (default: no cap)")


def search_from_args(args: argparse.Namespace) -> SearchSettings | None:
    if args.rate is not None:
        return None
    options = SearchOptions(growth=args.growth, precision=args.precision, max_probes=args.max_probes,
                            max_rate=SEARCH.options.max_rate if args.max_rate is None else args.max_rate)
    return SearchSettings(args.probe_duration, args.search_start, options)


def prices_from_args(args: argparse.Namespace) -> CostSettings:
    given: dict[str, Any] = {"price_per_core_hour": args.price_per_core_hour,
                             "price_per_gpu_hour": args.price_per_gpu_hour}
    return CostSettings(**{key: value for key, value in given.items() if value is not None})


def settings_from_args(args: argparse.Namespace) -> AgentBenchSettings:
    workload = WorkloadOptions(args.workload, args.seed, args.rate, args.duration, args.max_requests,
                               args.length_scale, args.time_scale)
    limits = RunLimits(args.duration, args.max_requests, args.request_timeout)
    env = dict(args.env)
    if args.history_policy is not None:
        env[HISTORY_POLICY_ENV] = args.history_policy
    run = RunOptions(args.model, args.client, limits, args.warm_up_turns, env)
    return AgentBenchSettings(workload, tuple(args.configs), run, (1.0, *args.rate_sweep),
                              Slo(args.slo_ttft, args.slo_tpot), prices_from_args(args), search_from_args(args))
