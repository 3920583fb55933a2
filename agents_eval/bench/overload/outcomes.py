"""What an overloaded run's requests came to: completed (admitted and served), refused with a status and
Retry-After, timed out, or failed otherwise; the admitted requests' latency against the SLO; and the turns
completed within the SLO (goodput: a refused turn the client retried counts once, when it completes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from agents_eval.harness.stats import RequestRecord, Slo, meets_slo, percentile

REFUSALS = (429, 503)  # what overload is answered with
TIMEOUT_MARKS = ("TimeoutError", "ReadTimeout", "drain deadline")
REFUSAL_CAUSES = {"to the first token": "ttft", "per output token": "tpot"}  # in the gateway's 503 messages


@dataclass(frozen=True)
class Outcomes:
    sent: int
    completed: int
    refused: dict[str, int]  # HTTP status -> requests
    refused_without_retry_after: int
    timed_out: int
    other_errors: int
    admitted_ttft_p99_s: float
    admitted_tpot_p99_s: float
    admitted_within_slo: float  # share of the completed requests meeting the SLO
    refused_for: dict[str, int] = field(default_factory=dict)  # the SLO admission guarded ("ttft", "tpot") -> n
    turns_within_slo: int = 0  # completed turns meeting the SLO, the attempt that completed timed from its send
    turns_within_slo_with_waits: int = 0  # the same, timed from the turn's first send (retry waits included)
    retried_turns: int = 0  # turns completed after one or more refusals


def is_timeout(record: RequestRecord) -> bool:
    return record.status is None and any(mark in (record.error or "") for mark in TIMEOUT_MARKS)


def refusal_cause(record: RequestRecord) -> str:
    return next((cause for text, cause in REFUSAL_CAUSES.items() if text in (record.error or "")), "other")


def within_slo_from_first_send(record: RequestRecord, slo: Slo) -> bool:
    """Meets the SLO with the time the turn waited for its retries added to its TTFT."""
    return meets_slo(replace(record, ttft_s=(record.ttft_s or 0.0) + record.waited_s), slo)


def outcomes(records: Sequence[RequestRecord], slo: Slo) -> Outcomes:
    completed = [r for r in records if r.ok]
    refused = [r for r in records if r.status in REFUSALS]
    timed_out = sum(is_timeout(r) for r in records)
    ttfts = [r.ttft_s for r in completed if r.ttft_s is not None]
    tpots = [t for t in (r.tpot_s for r in completed) if t is not None]
    within = sum(meets_slo(r, slo) for r in completed) / len(completed) if completed else float("nan")
    return Outcomes(sent=len(records), completed=len(completed),
                    refused={str(status): n for status, n in sorted(Counter(r.status for r in refused).items())},
                    refused_without_retry_after=sum(not r.retry_after for r in refused), timed_out=timed_out,
                    other_errors=len(records) - len(completed) - len(refused) - timed_out,
                    admitted_ttft_p99_s=percentile(ttfts, 99.0), admitted_tpot_p99_s=percentile(tpots, 99.0),
                    admitted_within_slo=within, refused_for=dict(Counter(refusal_cause(r) for r in refused)),
                    turns_within_slo=sum(meets_slo(r, slo) for r in completed),
                    turns_within_slo_with_waits=sum(within_slo_from_first_send(r, slo) for r in completed),
                    retried_turns=sum(r.retries > 0 for r in completed))
