"""Admission against the TTFT SLO: queued prefill work, throughput EMA, retry-after, injected clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.capacity.signals import AdmittedWork
from gateway.admission import AdmissionController


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def controller(clock: Clock | None = None, slo: float = 1.0, throughput: float = 1000.0) -> AdmissionController:
    return AdmissionController(ttft_slo_s=slo, initial_prefill_tokens_per_s=throughput, clock=clock or Clock())


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
    admission.on_first_token("a")
    assert admission.pending_tokens() == pytest.approx(400)
    clock.now += 0.25
    assert admission.pending_tokens() == pytest.approx(150)


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


def test_throughput_follows_observed_prefills() -> None:
    admission = AdmissionController(ttft_slo_s=1.0, initial_prefill_tokens_per_s=1000.0, ema_alpha=0.5,
                                    clock=Clock())
    admission.observe_prefill(3000, 1.0)
    assert admission.prefill_tokens_per_s == pytest.approx(2000.0)
    admission.observe_prefill(0, 1.0)
    admission.observe_prefill(100, 0.0)
    assert admission.prefill_tokens_per_s == pytest.approx(2000.0)
    admission.on_admit("a", 1500)
    assert admission.check(500).admit and not admission.check(600).admit


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


@pytest.mark.parametrize(("slo", "throughput", "alpha"), [(0.0, 100.0, 0.2), (1.0, -1.0, 0.2), (1.0, 100.0, 0.0),
                                                          (1.0, 100.0, 1.5)])
def test_bad_settings_are_refused(slo: float, throughput: float, alpha: float) -> None:
    with pytest.raises(ValueError):
        AdmissionController(ttft_slo_s=slo, initial_prefill_tokens_per_s=throughput, ema_alpha=alpha)


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
