"""The figures of a closed-loop run: each deployment's light load, steps, most agents held and batch
completion; the SLO derived from the calibration run; the goals."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from agents_eval.bench.deployments.closed_loop import Step, batch_completion_s, most_agents_held
from agents_eval.bench.deployments.deployments import AGENTSERVE, LLAMA_SERVER
from agents_eval.bench.deployments.measure import Measured, Plan
from agents_eval.harness.report import goal
from agents_eval.harness.stats import RequestRecord, Slo, percentile, slo_attainment

AGENTS_GOAL, BATCH_GOAL, LIGHT_GOAL = 1.5, 0.67, 1.1


def _ok(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok]


def latency(records: Sequence[RequestRecord]) -> dict[str, Any]:
    ok = _ok(records)
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    return {"requests": len(records), "errors": len(records) - len(ok),
            "per_call_s_p50": percentile([r.e2e_s or 0.0 for r in ok], 50),
            "ttft_s_p50": percentile([r.ttft_s or 0.0 for r in ok], 50),
            "ttft_s_p90": percentile([r.ttft_s or 0.0 for r in ok], 90),
            "tpot_s_p50": percentile(tpots, 50), "tpot_s_p90": percentile(tpots, 90),
            "cached_share": sum(r.cached_tokens for r in ok) / prompt if prompt else math.nan}


def derive_slo(calibration: Sequence[RequestRecord], factor: float) -> Slo:
    """`factor` x the single agent's TTFT p50 and TPOT p50."""
    figures = latency(calibration)
    if figures["errors"] or math.isnan(figures["ttft_s_p50"]) or math.isnan(figures["tpot_s_p50"]):
        raise RuntimeError(f"the SLO calibration run failed: {[r.error for r in calibration if r.error][:3]}")
    return Slo(factor * figures["ttft_s_p50"], factor * figures["tpot_s_p50"])


def step_figures(step: Step, slo: Slo) -> dict[str, Any]:
    window = max((r.done_at_s for r in step.records), default=0.0)
    return {"agents": step.agents, "held": step.held, "slo_attainment": slo_attainment(step.records, slo),
            "calls_per_s": len(_ok(step.records)) / window if window else 0.0,
            "session_errors": step.session_errors[:5], **latency(step.records)}


def cut_short(steps: Sequence[Step], max_agents: int) -> bool:
    """Whether the steps stopped before the SLO or `max_agents` did (the time budget): the most agents held is
    then a lower bound."""
    return bool(steps) and all(step.held for step in steps) and max(s.agents for s in steps) < max_agents


def deployment_figures(measured: Measured, plan: Plan, slo: Slo, max_agents: int) -> dict[str, Any]:
    batch = measured.batch
    completion = None if batch is None else batch_completion_s(plan.batch, batch)
    return {"deployment": measured.endpoint.deployment, "env": measured.endpoint.env,
            "light_load": latency(measured.light.records),
            "steps": [step_figures(step, slo) for step in measured.steps],
            "agents_held": most_agents_held(measured.steps),
            "agents_held_is_lower_bound": cut_short(measured.steps, max_agents),
            "batch": {"sessions": len(plan.batch), "calls": sum(len(s.turns) for s in plan.batch),
                      "completion_s": completion, "completed": completion is not None,
                      **({} if batch is None else latency(batch.records))}}


def _best(configs: Mapping[str, Any], names: Sequence[str], key: Any, best: Any) -> tuple[str | None, float]:
    values = {n: key(configs[n]) for n in names if n in configs and key(configs[n]) is not None}
    values = {n: v for n, v in values.items() if not math.isnan(v)}
    if not values:
        return None, math.nan
    name = best(values, key=values.__getitem__)
    return name, values[name]


def goals(configs: Mapping[str, Any]) -> list[dict[str, Any]]:
    ours = [n for n in configs if n in AGENTSERVE]
    others = [n for n in configs if n not in AGENTSERVE]
    our_agents, held = _best(configs, ours, lambda c: float(c["agents_held"]), max)
    other_agents, other_held = _best(configs, others, lambda c: float(c["agents_held"]), max)
    our_batch, batch = _best(configs, ours, lambda c: c["batch"]["completion_s"], min)
    other_batch, other_time = _best(configs, others, lambda c: c["batch"]["completion_s"], min)
    our_light, light = _best(configs, ours, lambda c: c["light_load"]["per_call_s_p50"], min)
    peer = configs.get(LLAMA_SERVER, {}).get("light_load", {}).get("per_call_s_p50", math.nan)
    return [
        goal("coding-agent on smollm2: agentserve's best deployment / the best other, concurrent agents within "
             "the SLO", AGENTS_GOAL, "min", held / other_held if other_held else math.nan,
             ours=our_agents, ours_agents=held, best_other=other_agents, best_other_agents=other_held,
             lower_bounds=[n for n in configs if configs[n].get("agents_held_is_lower_bound")]),
        goal("coding-agent on smollm2: agentserve's best batch completion time / the best other's", BATCH_GOAL,
             "max", batch / other_time if other_time else math.nan, ours=our_batch, ours_s=batch,
             best_other=other_batch, best_other_s=other_time),
        goal("light load (one agent): agentserve's best per-call latency (p50) / llama-server's", LIGHT_GOAL,
             "max", light / peer if peer else math.nan, ours=our_light, ours_s=light, llama_server_s=peer),
    ]
