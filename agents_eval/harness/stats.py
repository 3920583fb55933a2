"""The one place benchmarks compute percentiles and latency summaries.

Percentile: linear interpolation between closest ranks, numpy's default (`method="linear"`): for sorted
values v[0..n-1] the q-th percentile is v[r] interpolated at rank r = (n - 1) * q / 100; nan when there are
no values. Every p50/p90/p99 in every report comes from `percentile`.

Units: times in seconds (keys end `_s`) unless a key says otherwise (`_ms`, `_us`); rates per second.

A `RequestRecord` is one request a client sent, finished or failed. Latencies are client-observed: TTFT to the
first streamed token, end-to-end to the last byte of the reply, TPOT the mean gap between the output tokens
after the first. The measured window runs from the first send to the last reply (or failure).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
    retries: int = 0  # refused attempts of this turn before this one (the driver's retries after Retry-After)
    waited_s: float = 0.0  # from the turn's first send to this attempt's

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


def summary(values: Iterable[float], scale: float = 1.0) -> dict[str, float]:
    """p50, p90, p99 and mean of `values` times `scale` (1000.0 for milliseconds), plus their count."""
    scaled = [value * scale for value in values]
    return {**quantiles(scaled), "count": float(len(scaled))}
