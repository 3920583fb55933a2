"""A validation run's traced steps against the calibration: summed per step kind, with the idle penalty after
a gap and the co-run factor when another engine process was mid-step, as the simulator times a batch."""

from __future__ import annotations

import pytest

from agents_eval.sim.calibration import FEATURES, CalibratedTimer, Calibration
from agents_eval.sim.cost import StepWork
from agents_eval.sim.step_agreement import agreement, run_speed
from engine.core.step_trace import TracedStep

COEFFICIENTS = {"decode": {name: 0.0 for name in FEATURES} | {"step": 0.010},
                "prefill": {name: 0.0 for name in FEATURES} | {"step": 0.020, "linear_flop": 1e-11}}
CALIBRATION = Calibration("tiny", "float32", COEFFICIENTS, idle_penalty=((1.0, 0.005),),
                          worker_idle_penalty=((1.0, 0.008),), co_run_slowdown={"decode": 1.5, "prefill": 1.2})
DECODE = [(1, 40, True), (1, 7, True)]
PREFILL = [(24, 0, True)]


def _predicted(batch: list[tuple[int, int, bool]], worker_process: bool = False) -> float:
    return CalibratedTimer(CALIBRATION, worker_process).step_time(StepWork.of(batch))


def test_each_kind_is_measured_over_predicted() -> None:
    steps = {1: [TracedStep(0.0, 2 * _predicted(DECODE), None, DECODE),
                 TracedStep(1.0, 2 * _predicted(DECODE), 0.0, DECODE),
                 TracedStep(2.0, _predicted(PREFILL), 0.0, PREFILL)]}
    result = agreement(CALIBRATION, steps, worker_process=False)
    assert result["decode"]["steps"] == 2 and result["decode"]["ratio"] == pytest.approx(2.0)
    assert result["prefill"]["ratio"] == pytest.approx(1.0)
    assert result["decode"]["measured_s"] == pytest.approx(4 * _predicted(DECODE))


@pytest.mark.parametrize("worker_process, penalty", [(False, 0.005), (True, 0.008)])
def test_a_step_after_an_idle_gap_is_predicted_with_the_penalty(worker_process: bool, penalty: float) -> None:
    measured = _predicted(PREFILL, worker_process) + penalty
    steps = {1: [TracedStep(0.0, measured, 1.0, PREFILL)]}
    assert agreement(CALIBRATION, steps, worker_process)["prefill"]["ratio"] == pytest.approx(1.0)


def test_a_step_begun_while_another_process_is_mid_step_is_predicted_with_the_co_run_factor() -> None:
    decode_s = _predicted(DECODE)
    steps = {1: [TracedStep(10.0, 1.0, None, PREFILL)],  # 10.0-11.0
             2: [TracedStep(10.5, 1.5 * decode_s, None, DECODE),  # begins inside process 1's step
                 TracedStep(12.0, decode_s, 0.0, DECODE)]}  # alone
    result = agreement(CALIBRATION, steps, worker_process=False)
    assert result["decode"]["predicted_s"] == pytest.approx(2.5 * decode_s)
    assert result["decode"]["ratio"] == pytest.approx(1.0)
    assert result["prefill"]["predicted_s"] == pytest.approx(_predicted(PREFILL))  # nothing ran when it began


def test_run_speed_is_the_factor_on_the_step_time_that_makes_the_calibration_agree() -> None:
    """Steps that took twice and three times the calibrated step time, one after a gap (its idle penalty is not
    scaled) and one beside another process (its co-run factor kept): pooled over both runs, the factor makes the
    scaled calibration's prediction sum to what was measured."""
    decode_s, prefill_s = _predicted(DECODE), _predicted(PREFILL)
    first = {1: [TracedStep(0.0, 2 * decode_s + 0.005, 1.0, DECODE), TracedStep(1.0, 2 * prefill_s, 0.0, PREFILL)]}
    second = {1: [TracedStep(10.0, 1.0, None, PREFILL)],
              2: [TracedStep(10.5, 3 * 1.5 * decode_s, None, DECODE)]}
    speed = run_speed(CALIBRATION, [first, second], worker_process=False)
    assert speed["decode"] == pytest.approx((2 + 3 * 1.5) / (1 + 1.5))
    assert speed["prefill"] == pytest.approx((2 * prefill_s + 1.0) / (2 * prefill_s))
    scaled = [agreement(CALIBRATION.scaled(speed), run, worker_process=False) for run in (first, second)]
    for name in ("decode", "prefill"):
        measured = sum(kinds[name]["measured_s"] for kinds in scaled)
        assert sum(kinds[name]["predicted_s"] for kinds in scaled) == pytest.approx(measured), name
