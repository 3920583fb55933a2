"""The line in front of admission: arrival order, a wait bounded by the TTFT budget, a refused request's retry
keeping its place, and the SLO derived from the measured prefill rate. Injected clock; the tests wait on the
requests' outcomes, never on time."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import pytest

from gateway.admission import MIN_DERIVED_SLO_S, AdmissionController, AdmissionDecision, AdmissionQueue


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def line(clock: Clock, slo: float = 1.0) -> AdmissionQueue:
    """Headroom 1 and 1000 tokens/s: the budget is 1000 queued prompt tokens and `slo` seconds of waiting."""
    return AdmissionQueue(AdmissionController(slo, 1000.0, clock=clock, headroom=1.0), clock)


async def waiting(queue: AdmissionQueue, count: int) -> None:
    async def until() -> None:
        while queue.num_waiting < count:
            await asyncio.sleep(0)
    await asyncio.wait_for(until(), 10)


def start(queue: AdmissionQueue, admitted: list[str], request_id: str, tokens: int,
          key: str | None = None) -> asyncio.Task[AdmissionDecision]:
    async def one() -> AdmissionDecision:
        decision = await queue.admit(request_id, tokens, key)
        if decision.admit:
            admitted.append(request_id)
        return decision
    return asyncio.create_task(one())


async def test_an_empty_line_admits_at_once_as_the_controller_would() -> None:
    queue = line(Clock())
    decision = await queue.admit("a", 400)
    assert decision.admit and queue.controller.queued_tokens == 400 and queue.num_waiting == 0


async def test_requests_past_the_budget_wait_and_go_in_arrival_order() -> None:
    queue, admitted = line(Clock()), []
    await queue.admit("a", 900)
    b = start(queue, admitted, "b", 600)
    await waiting(queue, 1)
    c = start(queue, admitted, "c", 50)  # would fit now, but b came first
    await waiting(queue, 2)
    assert admitted == []
    queue.controller.on_first_token("a")
    await asyncio.wait_for(asyncio.gather(b, c), 10)
    assert admitted == ["b", "c"] and queue.num_waiting == 0


async def test_a_wait_past_the_budget_is_refused_with_a_retry_after() -> None:
    clock = Clock()
    queue, admitted = line(clock), []
    await queue.admit("a", 900)
    b = start(queue, admitted, "b", 600)
    await waiting(queue, 1)
    clock.now += 1.0  # the whole TTFT budget spent waiting
    queue.controller.on_admit("other", 10)  # any change wakes the head
    refused = await asyncio.wait_for(b, 10)
    assert (refused.admit, refused.reason) == (False, "ttft_slo")
    assert refused.retry_after_s > 0 and admitted == [] and queue.num_waiting == 0


async def test_the_budget_counts_the_wait_already_spent() -> None:
    clock = Clock()
    queue, admitted = line(clock), []
    await queue.admit("a", 900)
    b = start(queue, admitted, "b", 600)
    await waiting(queue, 1)
    clock.now += 0.5  # half the budget waited: 500 tokens of work ahead may remain, not 1000
    queue.controller.on_first_token("a")
    queue.controller.on_admit("x", 450)  # 450 + 600 > 1000: a fresh request would not fit either
    queue.controller.on_finish("x")
    queue.controller.on_admit("y", 100)  # 100 + 600 fits 1000 but not the 500 left of b's budget... wakes b
    await asyncio.sleep(0)
    assert admitted == [] and queue.num_waiting == 1
    queue.controller.on_finish("y")  # nothing ahead: b is admitted into an empty queue
    await asyncio.wait_for(b, 10)
    assert admitted == ["b"]


async def refused_once(queue: AdmissionQueue, clock: Clock, request_id: str, key: str) -> None:
    """`request_id` (600 tokens) waits behind 900 admitted ones until its one second of budget is spent and is
    refused; then the engine finishes everything, leaving the line and the ledger empty."""
    await queue.admit("a", 900)
    first = start(queue, [], request_id, 600, key=key)
    await waiting(queue, 1)
    clock.now += 1.0
    queue.controller.on_admit("other", 10)
    assert not (await asyncio.wait_for(first, 10)).admit
    for admitted in ("a", "other"):
        queue.controller.on_finish(admitted)


async def test_a_refused_requests_retry_keeps_its_place() -> None:
    clock = Clock()
    queue, admitted = line(clock), []
    await refused_once(queue, clock, "b", "session-b")
    await queue.admit("a2", 900)  # the engine busy again
    newer = start(queue, admitted, "c", 600, key="session-c")  # arrives after b first did
    await waiting(queue, 1)
    retry = start(queue, admitted, "b-again", 600, key="session-b")
    await waiting(queue, 2)
    queue.controller.on_first_token("a2")
    await asyncio.wait_for(retry, 10)
    assert admitted == ["b-again"]  # ahead of c, which came later than b's first send
    queue.controller.on_first_token("b-again")
    await asyncio.wait_for(newer, 10)
    assert admitted == ["b-again", "c"]


async def test_an_admitted_retry_forgets_its_first_arrival() -> None:
    clock = Clock()
    queue = line(clock)
    await refused_once(queue, clock, "b", "s")
    assert (await queue.admit("b-again", 600, "s")).admit
    queue.controller.on_finish("b-again")
    clock.now += 10.0
    assert queue._recall("s", clock.now) == clock.now  # a later turn of the session is a new arrival


def test_the_derived_slo_is_a_full_context_at_the_measured_prefill_rate() -> None:
    clock = Clock()
    admission = AdmissionController(None, 2000.0, clock=clock, slo_context_tokens=8192, ema_alpha=1.0)
    assert admission.slo_s == math.inf  # nothing measured: the initial 2000 tokens/s is a guess, no SLO
    admission.on_admit("a", 800)
    assert admission.check(20_000).admit
    clock.now += 10.0
    admission.on_first_token("a")  # 80 tokens/s measured
    assert admission.slo_s == pytest.approx(8192 / 80)
    assert admission.check(3000).admit  # 3,000 tokens queued fit half of 102 s at 80 tokens/s
    admission.on_admit("b", 3000)
    assert not admission.check(2000).admit
    admission.on_first_token("b")
    admission.on_admit("c", 10)
    clock.now += 0.001  # 10 tokens in a millisecond (alpha 1: the latest gap alone): a fast host gets the floor
    admission.on_first_token("c")
    assert admission.slo_s == MIN_DERIVED_SLO_S


def test_a_set_slo_is_kept() -> None:
    admission = AdmissionController(5.0, 80.0, slo_context_tokens=8192)
    assert admission.slo_s == 5.0


def test_the_derived_slo_does_not_average_in_the_initial_guess() -> None:
    clock = Clock()
    admission = AdmissionController(None, 2000.0, clock=clock, slo_context_tokens=8192, ema_alpha=0.2)
    admission.on_admit("a", 800)
    clock.now += 10.0
    admission.on_first_token("a")  # one measurement, 80 tokens/s: the seeded rate would still say ~470
    assert admission.slo_s == pytest.approx(8192 / 80)
    assert admission.prefill_tokens_per_s == pytest.approx(80.0)
