"""Step probes: time goes to the innermost open step, `leave` closes what an exception left open, and with
no timer on the probes do nothing."""

from __future__ import annotations

import asyncio

import pytest

from trajectory import step_timer


class Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def test_time_goes_to_the_innermost_open_step(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(step_timer, "perf_counter_ns", clock)

    async def request() -> dict[str, int]:
        times = step_timer.timing("outside")
        step_timer.enter("engine")
        clock.ns += 20
        step_timer.enter("outputs")  # pauses the engine step
        clock.ns += 30
        step_timer.leave("outputs")
        clock.ns += 5
        step_timer.leave("engine")
        clock.ns += 10
        return times.finish()

    assert asyncio.run(request()) == {"outside": 10, "engine": 25, "outputs": 30}


def test_leave_closes_the_steps_opened_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(step_timer, "perf_counter_ns", clock)
    times = step_timer.StepTimes("outside")
    times.enter("session_save")
    times.enter("render_tokenize")  # an exception skipped its leave
    clock.ns += 7
    times.leave("session_save")
    times.leave("render_tokenize")  # no longer open: nothing happens
    clock.ns += 3
    assert times.finish() == {"outside": 3, "session_save": 0, "render_tokenize": 7}


def test_tasks_started_by_a_timed_task_share_its_timer() -> None:
    async def child() -> None:
        step_timer.enter("serialize")
        step_timer.leave("serialize")

    async def request() -> dict[str, int]:
        times = step_timer.timing("outside")
        await asyncio.create_task(child())
        return times.finish()

    assert "serialize" in asyncio.run(request())


def test_probes_do_nothing_without_a_timer() -> None:
    async def untimed() -> None:
        step_timer.enter("plan")
        step_timer.leave("plan")
        step_timer.leave("never entered")

    asyncio.run(untimed())
