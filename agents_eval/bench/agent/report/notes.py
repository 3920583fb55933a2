"""The notes under `agentserve bench --workload`'s report: how figures were made, and what to distrust."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents_eval.bench.agent.configs import CONFIGS
from agents_eval.bench.agent.settings import AgentBenchSettings


def notes(settings: AgentBenchSettings, report: Mapping[str, Any]) -> list[str]:
    slo, prices = settings.slo, settings.prices
    lines = [
        f"SLO: TTFT <= {slo.ttft_s} s and TPOT <= {slo.tpot_s} s; goodput counts the requests meeting both.",
        f"Cost: (cores x ${prices.price_per_core_hour}/core-hour + GPUs x ${prices.price_per_gpu_hour}/GPU-hour) x "
        "the measured window (first send to last reply), per 1,000 generated tokens and per 1,000 computed "
        "(uncached) prompt tokens; cached prompt tokens are not served work.",
        f"Equal cores: a colocated engine runs {report['settings']['colocated_threads']} torch threads, what the "
        "disaggregated workers run in all (configs/deployment.yaml).",
        client_note(settings),
    ]
    lines += search_notes(settings, report) + machine_notes(report) + config_notes(report)
    return lines + ablation_notes(report) + trajectory_notes(report)


def ablation_notes(report: Mapping[str, Any]) -> list[str]:
    if not report.get("ablation"):
        return []
    return ["Ablation: each step is measured against the one it builds on (the column 'against'). DistServe's is "
            "+ prefix caching, the colocated engine with the same features, so it prices the disaggregation alone. "
            "KV-aware routing acts on a session's KV, so its step also turns on sessions, pruning and masks, "
            "whose share on their own the colocated steps give."]


def client_note(settings: AgentBenchSettings) -> str:
    stateless = [name for name in settings.configs if not CONFIGS[name].sessions]
    sessions = [name for name in settings.configs if CONFIGS[name].sessions]
    parts = []
    if stateless:
        parts.append(f"{', '.join(stateless)}: the client resends the whole history over chat completions "
                     "without a session id")
    if sessions:
        parts.append(f"{', '.join(sessions)}: the client keeps each session ({settings.run.client})")
    return "; ".join(parts) + "."


def trajectory_notes(report: Mapping[str, Any]) -> list[str]:
    """Pruning and masks that engaged nothing where they were on: the workload gave them nothing to act on."""
    lines = []
    for name, figures in report["configurations"].items():
        if not CONFIGS[name].pruning:
            continue
        idle = [kind for kind in ("pruned", "masked") if not figures[f"{kind}_tokens"]]
        if idle:
            lines.append(f"{name}: 0 tokens {' and '.join(idle)}, with pruning and masks on: no observation had "
                         "anything to prune, or no session held more observations than masks keep visible.")
    return lines


def search_notes(settings: AgentBenchSettings, report: Mapping[str, Any]) -> list[str]:
    if settings.search is None:
        return []
    search = settings.search
    lines = [f"Throughput at SLO: the highest session arrival rate with at least {search.options.target:.0%} of "
             f"requests meeting the SLO; probes of {search.probe_duration_s:g} s each on a fresh gateway, from "
             f"{report['settings']['rate']:.3g} sessions/s, x{search.options.growth:g} until one misses, then "
             f"bisected to {search.options.precision:g} relative, {search.options.max_probes} probes at most. "
             "Requests/s at SLO is the throughput of the probe at that rate; P99 and cost are that probe's."]
    for name, figures in report["configurations"].items():
        state = figures["slo_search"]
        if not state["found"]:
            lines.append(f"{name} missed the SLO at every rate probed, down to {state['bracket'][1]:.3g} sessions/s.")
        elif state["capped"]:
            lines.append(f"{name} met the SLO at every rate probed: its SLO rate is a lower bound.")
        elif not state["converged"]:
            low, high = state["bracket"]
            lines.append(f"{name}: the probe budget ran out with the SLO rate between {low:.3g} and {high:.3g} "
                         "sessions/s; the lower end is reported (raise --max-probes).")
    return lines


def machine_notes(report: Mapping[str, Any]) -> list[str]:
    cores, loads = report["machine"]["cpu_count"] or 1, (report["machine"]["load_average"][0],
                                                         report["load_average_at_end"][0])
    if loads[0] < 1.0:
        return []
    return [f"Other work ran on the machine: 1-minute load {loads[0]:.1f} before the run ({loads[1]:.1f} after it, "
            f"ours included), on {cores} cores; the figures are noisy."]


def config_notes(report: Mapping[str, Any]) -> list[str]:
    configs = report["configurations"]
    lines = []
    sent = {name: figures["requests_sent"] for name, figures in configs.items()}
    if len(set(sent.values())) > 1:
        counts = ", ".join(f"{name} {count}" for name, count in sent.items())
        lines.append(f"Requests sent differ ({counts}): a session sends its next turn only after its reply, so a "
                     "configuration that falls behind reaches fewer turns before the run ends.")
    changes = ", ".join(f"{name} {figures['role_changes']}" for name, figures in configs.items())
    lines.append(f"Changes of the prefill/decode split seen during the run (polled every 0.25 s): {changes}.")
    for name, figures in configs.items():
        if CONFIGS[name].disaggregated and "colocated" in figures["split"]:
            lines.append(f"{name} ran on a colocated engine: this gateway ignored AGENTSERVE_DISAGGREGATED=true.")
        errors = figures["errors"] + len(figures["session_errors"])
        if errors:
            common = next(iter(figures["error_messages"]), None) or figures["session_errors"][0]
            lines.append(f"{name}: {errors} errors (failed requests count as SLO misses); most common: {common}")
    return lines
