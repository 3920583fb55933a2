"""The figures of `agentserve bench --workload`: pure functions over per-request records and /metrics scrapes.

Records, percentiles and SLO checks are the harness's (`agents_eval.harness.stats`). The measured window runs
from the first send to the last reply (or failure), so a system that falls behind stretches the window and
shows a lower throughput than the rate offered to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agents_eval.harness.stats import (
    RequestRecord,
    Slo,
    measured_window_s,
    meets_slo,
    per_second,
    quantiles,
    ratio,
    slo_attainment,
)


def cache_figures(deltas: Mapping[str, float]) -> dict[str, float]:
    """Reuse over the measured run, from the gateway's counters: prefix-cache hits per token looked up, cached
    prompt tokens per prompt token, prompt tokens actually prefilled, tokens pruned and masked."""
    return {
        "prefix_hit_ratio": ratio(deltas["prefix_cache_hits"], deltas["prefix_cache_queries"]),
        "kv_hit_ratio": ratio(deltas["cached_tokens"], deltas["prompt_tokens"]),
        "prefill_tokens": deltas["prompt_tokens"] - deltas["cached_tokens"],
        "pruned_tokens": deltas["pruned_tokens"],
        "masked_tokens": deltas["masked_tokens"],
    }


def _values(records: Iterable[RequestRecord], field: str) -> list[float]:
    return [value for r in records if r.ok and (value := getattr(r, field)) is not None]


def latency_figures(records: Sequence[RequestRecord]) -> dict[str, dict[str, float]]:
    return {name: quantiles(_values(records, f"{name}_s")) for name in ("ttft", "tpot", "e2e")}


def summarize(records: Sequence[RequestRecord], slo: Slo, deltas: Mapping[str, float]) -> dict[str, Any]:
    """Every figure of one configuration's measured run but its cost (`agent_bench_cost`)."""
    window = measured_window_s(records)
    finished = [r for r in records if r.ok]
    prompt, output = sum(r.prompt_tokens for r in finished), sum(r.output_tokens for r in finished)
    latency = latency_figures(records)
    return {
        "requests_sent": len(records), "requests_ok": len(finished), "errors": len(records) - len(finished),
        "window_s": window,
        "throughput_rps": per_second(len(finished), window),
        "output_tokens_per_s": per_second(output, window),
        "goodput_rps": per_second(sum(meets_slo(r, slo) for r in records), window),
        "slo_attainment": slo_attainment(records, slo),
        "p50_latency_s": latency["e2e"]["p50"], "p99_latency_s": latency["e2e"]["p99"],
        "latency": latency,
        "prompt_tokens": prompt, "cached_tokens": sum(r.cached_tokens for r in finished), "output_tokens": output,
        **cache_figures(deltas),
    }
