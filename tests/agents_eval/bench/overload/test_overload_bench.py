"""`agentserve bench overload`: the outcome classification on hand-made records, and a short real run whose
guarded gateway refuses with 429/503 and Retry-After while nothing times out."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
from rich.progress import Progress

from agents_eval.bench.overload.cli import write
from agents_eval.bench.overload.outcomes import outcomes
from agents_eval.bench.overload.overload import OverloadSettings, goals, run_overload
from agents_eval.harness.stats import RequestRecord, Slo

SLO = Slo(ttft_s=0.5, tpot_s=0.05)


def record(ttft: float | None, e2e: float, tokens: int = 11, error: str | None = None, status: int | None = None,
           retry_after: str | None = None) -> RequestRecord:
    return RequestRecord("s", 0, "act", 0.0, ttft, e2e, 100, 0, tokens, error, status, retry_after)


def test_a_turn_retried_after_a_refusal_counts_once_and_its_wait_is_counted_apart() -> None:
    retried = RequestRecord("s", 0, "act", 1.0, 0.1, 0.6, 100, 0, 11, retries=1, waited_s=1.0)
    found = outcomes([record(None, 0.01, 0, "RequestFailed: HTTP 429: busy", 429, "1"), retried], SLO)
    assert (found.sent, found.completed, found.retried_turns) == (2, 1, 1)
    assert (found.turns_within_slo, found.turns_within_slo_with_waits) == (1, 0)


def test_requests_are_sorted_into_completed_refused_timed_out_and_other() -> None:
    records = [record(0.1, 0.6), record(0.9, 1.2),  # one within the SLO, one over its TTFT
               record(None, 0.01, 0, "RequestFailed: HTTP 429: busy", 429, "2"),
               record(None, 0.01, 0, "RequestFailed: HTTP 503: down", 503, None),
               record(None, 60.0, 0, "TimeoutError"), record(None, 1.0, 0, "RequestFailed: HTTP 500: oops", 500)]
    found = outcomes(records, SLO)
    assert (found.sent, found.completed, found.refused) == (6, 2, {"429": 1, "503": 1})
    assert (found.refused_without_retry_after, found.timed_out, found.other_errors) == (1, 1, 1)
    assert found.admitted_within_slo == 0.5 and math.isclose(found.admitted_ttft_p99_s, 0.892)
    assert (found.turns_within_slo, found.turns_within_slo_with_waits, found.retried_turns) == (1, 1, 0)
    run = asdict(found)
    met = {g["name"]: g["met"] for g in goals({"guarded": run, "unguarded": run}, SLO)}
    assert met == {"guarded/unguarded turns completed within the SLO": True,
                   "guarded admitted TTFT p99 / TTFT SLO": False, "guarded admitted TPOT p99 / TPOT SLO": True,
                   "guarded refusals without Retry-After": False, "guarded requests timed out": False,
                   "guarded requests failed otherwise": False}


@pytest.mark.slow
def test_a_guarded_gateway_refuses_with_retry_after_and_nothing_times_out(tmp_path: Path) -> None:
    # a TTFT SLO no prompt meets behind another: admission refuses whatever arrives while a prefill is queued
    settings = OverloadSettings(workload="swe", slo=Slo(ttft_s=0.001, tpot_s=1.0), slo_rate=2.0, factor=2.0,
                                duration_s=8.0, request_timeout_s=60.0)
    with Progress(disable=True) as progress:
        report = run_overload(settings, tmp_path, progress)
    guarded, unguarded = report["runs"]["guarded"], report["runs"]["unguarded"]
    assert sum(guarded["refused"].values()) > 0 and guarded["refused_without_retry_after"] == 0
    assert guarded["timed_out"] == unguarded["timed_out"] == 0 and guarded["other_errors"] == 0
    assert unguarded["refused"] == {} and unguarded["completed"] == unguarded["sent"] > 0
    assert guarded["retried_turns"] > 0  # refused turns were sent again after their Retry-After, and completed
    names = [g["name"] for g in report["goals"]]
    assert names[0] == "guarded/unguarded turns completed within the SLO" and len(names) == 6
    files = write(tmp_path / "report", report)
    assert json.loads(files.json.read_text())["offered_rate_sessions_per_s"] == 4.0 and files.chart.exists()
