"""Which step buys what: each measured configuration against the ablation step it adds to (its `previous`,
agent_bench_configs), where both ran. Per step, the change in throughput (the SLO rate in sessions/s after a
search, finished requests/s at a fixed rate), p99 TTFT and cost per 1,000 generated tokens, as a difference
and as a ratio to the previous step, and the tokens pruned and masked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents_eval.bench.agent.configs import CONFIGS
from agents_eval.harness.stats import ratio

SLO_RATE, THROUGHPUT = "slo_rate_sessions_per_s", "throughput_rps"


def step_figures(figures: Mapping[str, Any], throughput_key: str) -> dict[str, float]:
    return {"throughput": figures[throughput_key], "p99_ttft_s": figures["latency"]["ttft"]["p99"],
            "cost_per_1k_output_tokens": figures["cost_per_1k_output_tokens"]}


def ablation_steps(configs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration whose previous step was measured too, in the order the run measured them."""
    throughput_key = SLO_RATE if all(SLO_RATE in figures for figures in configs.values()) else THROUGHPUT
    steps = []
    for name, figures in configs.items():
        previous = CONFIGS[name].previous
        if previous is None or previous not in configs:
            continue
        now, before = step_figures(figures, throughput_key), step_figures(configs[previous], throughput_key)
        steps.append({"config": name, "previous": previous, "adds": CONFIGS[name].adds,
                      "throughput_measured_as": throughput_key, **now,
                      "change": {key: now[key] - before[key] for key in now},
                      "ratio": {key: ratio(now[key], before[key]) for key in now},
                      "pruned_tokens": figures["pruned_tokens"], "masked_tokens": figures["masked_tokens"]})
    return steps
