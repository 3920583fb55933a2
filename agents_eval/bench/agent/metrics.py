"""The figures of `agentserve bench --workload`: pure functions over per-request records and /metrics scrapes.

A record is one request the client sent, finished or failed. Latencies are client-observed: TTFT to the first
streamed token, end-to-end to the last byte of the reply, TPOT the mean gap between the output tokens after
the first. The measured window runs from the first send to the last reply (or failure), so a system that
falls behind stretches the window and shows a lower throughput than the rate offered to it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = ("prompt_tokens", "cached_tokens", "generation_tokens", "prefix_cache_queries", "prefix_cache_hits",
            "pruned_tokens", "masked_tokens")
QUANTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0}


@dataclass(frozen=True)
class RequestRecord:
    session_id: str
    turn: int
    phase: str
    sent_at_s: float  # from the run's start
    ttft_s: float | None = None  # None: no token arrived (the request failed)
    e2e_s: float | None = None  # send to the last byte; for a failure, send to the failure
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None
    status: int | None = None  # the HTTP status of a refused request
    retry_after: str | None = None  # its Retry-After header

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        return tpot(self.ttft_s, self.e2e_s, self.output_tokens)

    @property
    def done_at_s(self) -> float:
        return self.sent_at_s + (self.e2e_s or 0.0)


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tpot_s: float


def tpot(ttft_s: float | None, e2e_s: float | None, output_tokens: int) -> float | None:
    """Time per output token after the first: (e2e - TTFT) / (tokens - 1); None with fewer than 2 tokens."""
    if ttft_s is None or e2e_s is None or output_tokens < 2:
        return None
    return max(0.0, e2e_s - ttft_s) / (output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default); nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def quantiles(values: Sequence[float]) -> dict[str, float]:
    summary = {name: percentile(values, q) for name, q in QUANTILES.items()}
    summary["mean"] = sum(values) / len(values) if values else math.nan
    return summary


def meets_slo(record: RequestRecord, slo: Slo) -> bool:
    """Finished without error, first token within the TTFT SLO, and (with 2+ tokens) TPOT within its SLO."""
    if not record.ok or record.ttft_s is None or record.ttft_s > slo.ttft_s:
        return False
    per_token = record.tpot_s
    return per_token is None or per_token <= slo.tpot_s


def slo_attainment(records: Sequence[RequestRecord], slo: Slo) -> float:
    """The fraction of sent requests that met the SLO; a failed request counts as a miss."""
    return sum(meets_slo(r, slo) for r in records) / len(records) if records else math.nan


def measured_window_s(records: Sequence[RequestRecord]) -> float:
    if not records:
        return 0.0
    return max(r.done_at_s for r in records) - min(r.sent_at_s for r in records)


def per_second(count: float, window_s: float) -> float:
    return count / window_s if window_s > 0 else 0.0


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def parse_metrics(text: str) -> dict[str, Any]:
    """The counters this benchmark reads (summed over labels, by short name) and the workers per role."""
    counters: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
    workers: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("agentserve:")
            if name.endswith("_total") and name.removesuffix("_total") in counters:
                counters[name.removesuffix("_total")] += sample.value
            elif name == "num_workers" and sample.value > 0:
                workers[sample.labels.get("role", "worker")] = int(sample.value)
    return {"counters": counters, "workers": workers}


def counter_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {name: after.get(name, 0.0) - before.get(name, 0.0) for name in COUNTERS}


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
