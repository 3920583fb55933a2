"""`agentserve bench upstream`: session-affine routing against round-robin in front of upstream replicas.

Starts `--replicas` upstream gateways (`agentserve serve --model M`), then for each routing a front gateway
over them (`AGENTSERVE_UPSTREAMS`, `AGENTSERVE_UPSTREAM__ROUTING`) and drives the same shape of multi-turn
sessions through it, each routing on fresh replicas so that both meet the same empty caches with the same
texts. Reports per turn the prompt tokens the replicas had to prefill (their prompt tokens
less their reported `cached_tokens`) and TTFT p99; then the cost of a failover (a front whose pool also
holds a dead address): `report.json`, `report.md` and `prefill_per_turn.png`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agents_eval.bench.upstream import report as upstream_report
from agents_eval.bench.upstream.drive import run_routing
from agents_eval.bench.upstream.failover import run_failover
from agents_eval.bench.upstream.workload import ROUTINGS, UpstreamBenchSettings
from agents_eval.harness.report import machine_info
from agents_eval.harness.servers.gateway import running_gateway

__all__ = ["UpstreamBenchSettings", "add_arguments", "run", "run_benchmark"]
REPLICA_ENV = {"AGENTSERVE_LIMITS__TTFT_SLO_S": "3600"}  # replicas queue every turn: routing is measured, not shedding


def _routing(settings: UpstreamBenchSettings, upstreams: list[str], routing: str, log_dir: Path) -> dict[str, Any]:
    start = time.perf_counter()
    results = run_routing(settings, upstreams, routing, log_dir)
    return upstream_report.routing_json(results, settings.turns, time.perf_counter() - start)


def run_benchmark(settings: UpstreamBenchSettings, out_dir: Path) -> dict[str, Any]:
    settings.validate()
    start = time.perf_counter()
    machine = machine_info()  # before the run, so its load average shows other work, not ours
    log_dir = out_dir / "logs"
    routings = {}
    for routing in ROUTINGS:  # the last routing's replicas then serve the failover run (its own texts)
        with running_replicas(settings, log_dir / routing) as upstreams:
            routings[routing] = _routing(settings, upstreams, routing, log_dir)
            if routing == ROUTINGS[-1]:
                failover = run_failover(settings, upstreams, log_dir)
    report = {"settings": asdict(settings), "machine": machine, "routings": routings, "failover": failover,
              "ratios": upstream_report.ratios(routings), "bench_wall_s": time.perf_counter() - start,
              "load_average_at_end": list(os.getloadavg())}
    report["goals"] = upstream_report.goals(report)
    upstream_report.write(out_dir, report)
    return report


@contextlib.contextmanager
def running_replicas(settings: UpstreamBenchSettings, log_dir: Path) -> Iterator[list[str]]:
    """The upstream replicas until the block exits; their base URLs."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(running_gateway(settings.model, REPLICA_ENV, log_dir / f"replica-{i}.log")).url
               for i in range(settings.replicas)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = UpstreamBenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--model", default=defaults.model, help="model of the upstream agentserve replicas")
    parser.add_argument("--replicas", type=int, default=defaults.replicas, help="upstream replicas")
    parser.add_argument("--sessions", type=int, default=defaults.sessions, help="concurrent sessions")
    parser.add_argument("--turns", type=int, default=defaults.turns, help="turns per session")
    parser.add_argument("--observation-lines", type=int, default=defaults.observation_lines,
                        help="lines of tool output each turn adds")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="reply length cap")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="workload seed")


def run(args: argparse.Namespace) -> None:
    settings = UpstreamBenchSettings(model=args.model, replicas=args.replicas, sessions=args.sessions,
                                     turns=args.turns, observation_lines=args.observation_lines,
                                     max_tokens=args.max_tokens, seed=args.seed)
    run_benchmark(settings, args.out)
    print((args.out / "report.md").read_text())
