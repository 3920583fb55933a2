"""Figures, ratios against llama.cpp, goals, tables and the chart of `agentserve bench peer`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents_eval.bench.peer.settings import AGENTSERVE_DEFAULTS, PEERS, QUANTIZED_CONFIGS
from agents_eval.harness.report import Table, check_goals
from agents_eval.harness.report import goal as harness_goal


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    higher_is_better: bool
    scale: float = 1.0  # shown value = figure x scale
    unit: str = ""


METRICS = (
    Metric("decode_tokens_per_s", "single-stream decode", True, unit="tok/s"),
    Metric("prefill_tokens_per_s", "2k-token prefill", True, unit="tok/s"),
    Metric("agent_turns_per_s", "agent turns/s", True, unit="turns/s"),
    Metric("agent_output_tokens_per_s", "agent output tok/s", True, unit="tok/s"),
    Metric("agent_ttft_p50_s", "agent TTFT p50", False, 1000.0, "ms"),
    Metric("agent_ttft_p99_s", "agent TTFT p99", False, 1000.0, "ms"),
)
METRIC = {m.key: m for m in METRICS}


@dataclass(frozen=True)
class Goal:
    name: str
    metric: str
    target_ratio: float  # agentserve / llama.cpp at least this (at most, where lower is better)
    configs: tuple[str, ...] | None = None  # None: every agentserve configuration but the defaults


GOALS = (  # issue 49: out of the box, 1.5x the peer's turns/s and half its TTFT p99; the variants at least level
    Goal("agent turns/s >= 1.5x llama.cpp, out of the box", "agent_turns_per_s", 1.5, (AGENTSERVE_DEFAULTS,)),
    Goal("agent TTFT p99 <= 0.5x llama.cpp, out of the box", "agent_ttft_p99_s", 0.5, (AGENTSERVE_DEFAULTS,)),
    Goal("agent turns/s >= llama.cpp", "agent_turns_per_s", 1.0),
    Goal("agent TTFT p99 <= llama.cpp", "agent_ttft_p99_s", 1.0),
    Goal("single-stream decode >= 0.5x llama.cpp, quantized weights", "decode_tokens_per_s", 0.5, QUANTIZED_CONFIGS),
)


def figures(result: Mapping[str, Any]) -> dict[str, float]:
    """The headline figures of one configuration's measurements."""
    agents = result["agents"]
    return {"decode_tokens_per_s": result["decode"]["tokens_per_s"],
            "prefill_tokens_per_s": result["prefill"]["tokens_per_s"],
            "agent_turns_per_s": agents["turns_per_s"], "agent_output_tokens_per_s": agents["output_tokens_per_s"],
            "agent_ttft_p50_s": agents["ttft_p50_s"], "agent_ttft_p99_s": agents["ttft_p99_s"]}


def ratios(table: Mapping[str, Mapping[str, float]], peer: str | None) -> dict[str, dict[str, float]]:
    """Each other configuration's figures over the peer's, metric by metric; empty without the peer."""
    if peer is None or peer not in table:
        return {}
    base = table[peer]
    return {config: {key: value / base[key] if base[key] else math.nan for key, value in row.items()}
            for config, row in table.items() if config != peer}


def goal_results(table: Mapping[str, Mapping[str, float]], peer: str | None) -> list[dict[str, Any]]:
    """Per goal and agentserve configuration: `name`, `target`, `bound` ("min": at least; "max": at most),
    `measured` (the ratio to the peer) and `met`, beside the older keys (`factor`: how far past the target
    it is, >= 1 when met)."""
    by_config = {config: row for config, row in ratios(table, peer).items() if config not in PEERS}
    rows = []
    for goal in GOALS:
        higher = METRIC[goal.metric].higher_is_better
        for config in goal.configs or tuple(c for c in by_config if c != AGENTSERVE_DEFAULTS):
            if config not in by_config:
                continue
            ratio = by_config[config][goal.metric]
            factor = ratio / goal.target_ratio if higher else goal.target_ratio / ratio
            rows.append(harness_goal(f"{config}: {goal.name.replace('llama.cpp', str(peer))}", goal.target_ratio,
                                     "min" if higher else "max", ratio, goal=goal.name, config=config,
                                     metric=goal.metric, peer=peer, value=table[config][goal.metric],
                                     peer_value=table[peer][goal.metric],  # type: ignore[index]
                                     ratio=ratio, target_ratio=goal.target_ratio, factor=factor))
    check_goals(rows)
    return rows


def _show(key: str, value: float) -> str:
    metric = METRIC[key]
    shown = value * metric.scale
    return f"{shown:.0f}" if abs(shown) >= 100 else f"{shown:.2f}"


def figures_table(table: Mapping[str, Mapping[str, float]], results: Mapping[str, Any]) -> Table:
    headers = ["configuration", *(f"{m.label} ({m.unit})" for m in METRICS), "prefill prompt tokens", "agent turns",
               "agent prompt tokens reused", "refusals", "longest agent prompt"]
    rows = [[config, *(_show(m.key, row[m.key]) for m in METRICS), f"{results[config]['prefill']['prompt_tokens']:.0f}",
             *_agent_columns(results[config]["agents"])] for config, row in table.items()]
    return Table("Figures", headers, rows)


def _agent_columns(agents: Mapping[str, Any]) -> list[str]:
    cached, prompt = agents.get("cached_tokens"), agents.get("prompt_tokens")
    reused = f"{cached / prompt:.0%}" if cached is not None and prompt else "n/a"
    return [str(agents["turns"]), reused, str(agents.get("refusals", 0)), str(agents.get("max_prompt_tokens", ""))]


def ratio_table(by_config: Mapping[str, Mapping[str, float]], peer: str) -> Table:
    headers = ["configuration", *(f"{m.label} {'↑' if m.higher_is_better else '↓'}" for m in METRICS)]
    rows = [[config, *(f"{row[m.key]:.2f}x" for m in METRICS)] for config, row in by_config.items()]
    return Table(f"Each / {peer} (↑: above 1 is better, ↓: below 1 is better)", headers, rows)


def verdict(row: Mapping[str, Any]) -> str:
    factor = row["factor"]
    if row["met"]:
        return f"met, {factor:.2f}x the target"
    return f"missed: {factor:.2f}x of the target ({1 / factor:.2f}x short)"


def goals_table(rows: list[dict[str, Any]]) -> Table:
    body = [[r["goal"], r["config"], _show(r["metric"], r["value"]), _show(r["metric"], r["peer_value"]),
             f"{r['ratio']:.2f}x", f"{r['target_ratio']:.2f}x", verdict(r)] for r in rows]
    headers = ["goal", "configuration", "agentserve", "peer", "ratio", "target ratio", "result"]
    return Table("Goals", headers, body)
