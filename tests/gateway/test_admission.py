"""Admission against the TTFT and TPOT SLOs: queued prefill work at the measured drain rate, streams in flight at
the measured decode rate, headroom, retry-after, injected clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.capacity.signals import AdmittedWork
from gateway.admission import HEADROOM, AdmissionController


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def controller(clock: Clock | None = None, slo: float = 1.0, throughput: float = 1000.0,
               tpot_slo: float | None = None, alpha: float = 0.2) -> AdmissionController:
    """Headroom 1: the whole SLO, so the budgets are round numbers."""
    return AdmissionController(ttft_slo_s=slo, initial_prefill_tokens_per_s=throughput, ema_alpha=alpha,
                               clock=clock or Clock(), tpot_slo_s=tpot_slo, headroom=1.0)


def test_admits_within_the_slo_and_rejects_past_it() -> None:
    admission = controller()
    admission.on_admit("a", 600)
    fits = admission.check(400)
    assert (fits.admit, fits.reason, fits.retry_after_s) == (True, "admitted", 0.0)
    assert fits.estimated_wait_s == pytest.approx(1.0)
    too_much = admission.check(500)
    assert (too_much.admit, too_much.reason) == (False, "ttft_slo")
    assert too_much.estimated_wait_s == pytest.approx(1.1)
    assert too_much.retry_after_s == pytest.approx(0.1)  # 100 tokens over the 1000-token budget


def test_first_token_and_finish_drain_the_queue() -> None:
    admission = controller()
    admission.on_admit("a", 500)
    admission.on_admit("b", 400)
    assert (admission.num_queued, admission.queued_tokens) == (2, 900)
    assert not admission.check(200).admit
    admission.on_first_token("a")
    assert admission.queued_tokens == 400 and admission.check(600).admit
    admission.on_finish("a")  # after its first token: a no-op
    admission.on_finish("b")  # e.g. aborted before its first token
    admission.on_finish("never-admitted")
    assert (admission.num_queued, admission.queued_tokens) == (0, 0)


def test_an_oversized_prompt_gets_an_empty_queue_only() -> None:
    admission = controller()
    alone = admission.check(5000)
    assert alone.admit and alone.estimated_wait_s == pytest.approx(5.0)
    admission.on_admit("small", 300)
    behind = admission.check(5000)
    assert not behind.admit
    assert behind.retry_after_s == pytest.approx(0.3)  # the time the queue ahead of it needs to drain


def test_progress_on_the_head_request_counts_with_time() -> None:
    clock = Clock()
    admission = controller(clock)
    admission.on_admit("a", 800)
    admission.on_admit("b", 400)
    assert admission.pending_tokens() == 1200
    clock.now += 0.5
    assert admission.pending_tokens() == pytest.approx(700)
    clock.now += 10  # the head should be done, but only its first token says so
    assert admission.pending_tokens() == pytest.approx(400)
    admission.on_first_token("a")  # late: the measured rate drops
    assert admission.pending_tokens() == pytest.approx(400)
    clock.now += 0.25
    assert admission.pending_tokens() == pytest.approx(400 - 0.25 * admission.prefill_tokens_per_s)


def test_removing_a_request_behind_the_head_keeps_the_head_progress() -> None:
    clock = Clock()
    admission = controller(clock)
    admission.on_admit("a", 800)
    admission.on_admit("b", 400)
    clock.now += 0.5
    admission.on_finish("b")
    assert admission.pending_tokens() == pytest.approx(300)


def test_idle_time_before_admission_is_no_progress() -> None:
    clock = Clock()
    admission = controller(clock)
    clock.now += 60
    admission.on_admit("a", 900)
    assert admission.pending_tokens() == 900


def test_the_prefill_rate_is_the_queue_drain_rate() -> None:
    """Prompt tokens reaching their first token per second of a busy queue, whatever else the engine ran."""
    clock = Clock()
    admission = controller(clock, alpha=1.0)
    admission.on_admit("a", 1000)
    clock.now += 2.0  # decode steps interleaved: the first token comes late
    admission.on_first_token("a")
    assert admission.prefill_tokens_per_s == pytest.approx(500.0)
    admission.on_admit("b", 400)
    assert admission.check(100).admit and not admission.check(101).admit  # 500 tokens in the 1 s SLO
    clock.now += 30  # an idle queue is no evidence
    admission.on_finish("b")  # aborted before its first token: no evidence either
    assert admission.prefill_tokens_per_s == pytest.approx(500.0)


def test_a_burst_of_first_tokens_averages_with_the_time_before_it() -> None:
    clock = Clock()
    admission = controller(clock, alpha=0.5)
    for request_id in ("a", "b", "c"):
        admission.on_admit(request_id, 1000)
    clock.now += 1.0
    admission.on_first_token("a")  # (1000 tokens, 1 s) folded into the seed (1000 tokens, 1 s)
    admission.on_first_token("b")  # the same instant: tokens, no seconds
    assert admission.prefill_tokens_per_s == pytest.approx(1000.0 / 0.5)
    clock.now += 3.0
    admission.on_first_token("c")
    assert admission.prefill_tokens_per_s == pytest.approx(1000.0 / 1.75)


def test_headroom_keeps_the_estimate_below_the_slo() -> None:
    admission = AdmissionController(ttft_slo_s=1.0, initial_prefill_tokens_per_s=1000.0, clock=Clock())
    assert admission.headroom == HEADROOM < 1
    admission.on_admit("a", 100)
    assert admission.check(round(1000 * HEADROOM) - 100).admit
    assert not admission.check(round(1000 * HEADROOM) - 99).admit


def test_slo_override_per_request() -> None:
    admission = controller()
    admission.on_admit("a", 900)
    assert not admission.check(200).admit
    assert admission.check(200, ttft_slo_s=2.0).admit


def test_try_admit_admits_only_what_fits() -> None:
    admission = controller()
    assert admission.try_admit("a", 900).admit
    assert not admission.try_admit("b", 200).admit
    assert (admission.num_queued, admission.queued_tokens) == (1, 900)


def test_double_admission_is_a_bug() -> None:
    admission = controller()
    admission.on_admit("a", 10)
    with pytest.raises(ValueError, match="already admitted"):
        admission.on_admit("a", 10)


@pytest.mark.parametrize(("slo", "throughput", "alpha", "tpot", "headroom"),
                         [(0.0, 100.0, 0.2, None, 0.5), (1.0, -1.0, 0.2, None, 0.5), (1.0, 100.0, 0.0, None, 0.5),
                          (1.0, 100.0, 1.5, None, 0.5), (1.0, 100.0, 0.2, 0.0, 0.5), (1.0, 100.0, 0.2, None, 0.0),
                          (1.0, 100.0, 0.2, None, 1.5)])
def test_bad_settings_are_refused(slo: float, throughput: float, alpha: float, tpot: float | None,
                                  headroom: float) -> None:
    with pytest.raises(ValueError):
        AdmissionController(ttft_slo_s=slo, initial_prefill_tokens_per_s=throughput, ema_alpha=alpha,
                            tpot_slo_s=tpot, headroom=headroom)


@dataclass
class FifoEngine:
    """Prefills admitted requests in order at exactly the estimated throughput."""

    admission: AdmissionController
    clock: Clock
    queue: list[tuple[str, float]]  # (request id, tokens left), oldest first

    def run(self, seconds: float) -> None:
        rate = self.admission.prefill_tokens_per_s
        while self.queue and self.queue[0][1] / rate <= seconds:
            request_id, tokens = self.queue.pop(0)
            self.clock.now += tokens / rate
            seconds -= tokens / rate
            self.admission.on_first_token(request_id)
        if self.queue:
            self.queue[0] = (self.queue[0][0], self.queue[0][1] - seconds * rate)
        self.clock.now += seconds


@given(queued=st.lists(st.integers(1, 5000), max_size=8), prompt=st.integers(1, 5000))
def test_retry_after_is_when_the_prompt_fits(queued: list[int], prompt: int) -> None:
    clock = Clock()
    admission = controller(clock)
    for index, tokens in enumerate(queued):
        admission.on_admit(str(index), tokens)
    decision = admission.check(prompt)
    assert decision.admit == (decision.retry_after_s == 0.0)
    if not decision.admit:
        engine = FifoEngine(admission, clock, [(str(i), float(t)) for i, t in enumerate(queued)])
        engine.run(decision.retry_after_s - 1e-3)
        assert not admission.check(prompt).admit
        engine.run(2e-3)
        assert admission.check(prompt).admit


def test_the_ledger_keeps_admitted_work_until_it_is_served() -> None:
    """Prompt tokens until the first token, expected output tokens and streams until the end."""
    admission = controller(slo=100.0)
    changes: list[AdmittedWork] = []
    admission.subscribe(lambda: changes.append(admission.admitted))
    admission.on_admit("a", 600, decode_tokens=64)
    admission.try_admit("b", 30, decode_tokens=2 * 16, streams=2)
    assert admission.admitted == AdmittedWork(630, 96, 3, prompts=2)
    admission.on_first_token("a")
    admission.on_first_token("a")  # seen once
    assert admission.admitted == AdmittedWork(30, 96, 3, prompts=1) and admission.queued_tokens == 30
    admission.on_finish("b")  # before its first token: everything it added goes
    admission.on_finish("a")
    admission.on_finish("never-admitted")
    assert admission.admitted == AdmittedWork()
    assert changes == [AdmittedWork(600, 64, 1, 1), AdmittedWork(630, 96, 3, 2), AdmittedWork(30, 96, 3, 1),
                       AdmittedWork(0, 64, 1), AdmittedWork()]
    assert admission.admitted_total == AdmittedWork(630, 96, 3, prompts=2)


def test_a_refused_request_adds_no_work() -> None:
    admission = controller()
    admission.on_admit("a", 900, decode_tokens=10)
    assert not admission.try_admit("b", 500, decode_tokens=10).admit
    assert admission.admitted == admission.admitted_total == AdmittedWork(900, 10, 1, prompts=1)


def test_negative_expected_output_is_refused() -> None:
    with pytest.raises(ValueError, match="decode_tokens"):
        controller().on_admit("a", 10, decode_tokens=-1)


def decoding(admission: AdmissionController, *requests: tuple[str, int, int]) -> None:
    """Admit (id, expected output tokens, streams) past their first token: decoding, no prefill left."""
    for request_id, output_tokens, streams in requests:
        admission.on_admit(request_id, 0, decode_tokens=output_tokens, streams=streams)
        admission.on_first_token(request_id)


def test_streams_past_the_tpot_budget_are_refused_with_a_retry_after() -> None:
    admission = controller(slo=100.0, tpot_slo=0.05, alpha=1.0)
    decoding(admission, ("a", 100, 1), ("b", 20, 1), ("c", 100, 1), ("d", 100, 1))
    admission.observe_tokens("a", 1, 0.04)  # 4 streams, a token each 40 ms: 100 stream-tokens/s
    assert admission.decode_tokens_per_s == pytest.approx(100.0)
    within = admission.try_admit("e", 10, decode_tokens=100)  # 5 streams: 50 ms a token, the budget
    assert (within.admit, within.estimated_tpot_s) == (True, pytest.approx(0.05))
    past = admission.check(10)
    assert (past.admit, past.reason, past.estimated_tpot_s) == (False, "tpot_slo", pytest.approx(0.06))
    assert past.retry_after_s == pytest.approx(20 * 0.05)  # b, the soonest to finish: 20 tokens at 50 ms
    admission.on_finish("b")
    assert admission.check(10).admit


def test_the_retry_after_counts_the_tokens_already_decoded() -> None:
    admission = controller(slo=100.0, tpot_slo=0.05, alpha=1.0)
    decoding(admission, ("a", 100, 1), ("b", 80, 2))  # b: 40 tokens a stream
    for _ in range(30):
        admission.observe_tokens("b", 1, 0.05)  # 3 streams, 50 ms a token: 60 stream-tokens/s, 3 streams fit
    assert admission.check(10).retry_after_s == pytest.approx((40 - 15) * 0.05)  # b's streams are half done
    assert admission.check(10, streams=3).retry_after_s == pytest.approx((100 - 0) * 0.05)  # all must go


def test_the_decode_rate_follows_the_observed_gaps() -> None:
    admission = controller(slo=100.0, tpot_slo=0.05, alpha=1.0)
    decoding(admission, ("a", 50, 4))
    admission.observe_tokens("a", 1, 0.05)  # 4 streams at 50 ms: one more would break the SLO
    assert not admission.check(10).admit
    admission.observe_tokens("a", 2, 0.04)  # two tokens in 40 ms with 4 streams: 200 stream-tokens/s
    assert admission.decode_tokens_per_s == pytest.approx(200.0)
    assert admission.check(10, streams=6).admit and not admission.check(10, streams=7).admit
    admission.observe_tokens("unknown", 1, 10.0)  # finished or never admitted: ignored
    admission.observe_tokens("a", 1, 0.0)
    assert admission.decode_tokens_per_s == pytest.approx(200.0)


def test_no_decode_limit_before_a_gap_was_seen_or_without_a_tpot_slo() -> None:
    unmeasured = controller(slo=100.0, tpot_slo=0.05)
    decoding(unmeasured, ("a", 10, 64))
    assert unmeasured.check(10, streams=64).admit and unmeasured.decode_tokens_per_s is None
    no_slo = controller(slo=100.0)
    decoding(no_slo, ("a", 10, 4))
    no_slo.observe_tokens("a", 1, 1.0)
    assert no_slo.check(10, streams=64).admit


def test_streams_past_the_budget_alone_wait_for_an_empty_batch() -> None:
    admission = controller(slo=100.0, tpot_slo=0.05, alpha=1.0)
    decoding(admission, ("a", 10, 1))
    admission.observe_tokens("a", 1, 0.01)  # 100 stream-tokens/s: 5 streams fit
    refused = admission.check(10, streams=8)
    assert not refused.admit and refused.retry_after_s == pytest.approx(9 * 0.01)  # a must finish its 9 tokens left
    admission.on_finish("a")
    assert admission.check(10, streams=8).admit


def test_refused_on_both_the_later_retry_counts() -> None:
    admission = controller(tpot_slo=0.05, alpha=1.0)
    decoding(admission, ("a", 100, 1))
    admission.observe_tokens("a", 1, 0.05)  # 20 stream-tokens/s: 1 stream fits
    admission.on_admit("b", 900, decode_tokens=0, streams=0)
    decision = admission.check(600)
    assert (decision.admit, decision.reason) == (False, "ttft_slo")
    assert decision.retry_after_s == pytest.approx(99 * 0.05)  # a's 99 tokens left outlast the 0.5 s of prefill


def test_a_stalled_engine_refuses_until_it_answers_again() -> None:
    """No token from the streams decoding for longer than the TTFT budget: a new request would wait it out."""
    clock = Clock()
    admission = controller(clock, tpot_slo=0.05, alpha=1.0)
    decoding(admission, ("a", 100, 1))
    admission.observe_tokens("a", 1, 0.01)
    clock.now += 0.5  # nothing for 500 ms where 10 ms was expected
    assert admission.lateness_s() == pytest.approx(0.49) and admission.check(10).admit  # within the 1 s TTFT SLO
    clock.now += 0.6
    stalled = admission.check(10)
    assert (stalled.admit, stalled.reason, stalled.retry_after_s) == (False, "ttft_slo", pytest.approx(1.09))
    admission.observe_tokens("a", 1, 1.1)  # the stall ends; its gap is now the decode rate
    assert admission.lateness_s() == 0.0 and admission.check(10).reason == "tpot_slo"


def test_an_overdue_head_prompt_counts_as_a_stall() -> None:
    clock = Clock()
    admission = controller(clock)
    admission.on_admit("a", 100)  # 0.1 s at 1000 tokens/s
    clock.now += 1.5
    assert admission.lateness_s() == pytest.approx(1.4)
    assert not admission.check(10).admit  # though the queue estimate alone (pending 0) would admit it
    admission.on_first_token("a")
    assert admission.lateness_s() == 0.0 and admission.check(10).admit
