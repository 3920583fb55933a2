"""The real runs' steps against the calibration: every step a validation run's engine processes traced
(engine/core/step_trace.py), timed as the simulator times its batch (the calibrated step time, the idle penalty
after the gap before it, the co-run factor when another engine process was mid-step as it began), summed per
step kind. A ratio away from 1 says the host ran the run at another speed than it ran the profile, or that the
step model misses something; the run's figures carry that error whatever the simulator's scheduling does.
`run_speed` turns the same sums into factors on the calibration's step time, so the simulator can be run again
at the speed the host ran the runs at (`Calibration.scaled`)."""

from __future__ import annotations

import bisect
from typing import Any

from agents_eval.sim.calibration import CalibratedTimer, Calibration, kind
from agents_eval.sim.cost import StepWork
from engine.core.step_trace import TracedStep


def agreement(calibration: Calibration, steps: dict[int, list[TracedStep]], worker_process: bool
              ) -> dict[str, dict[str, Any]]:
    """Per step kind: steps, measured and predicted seconds (summed), measured over predicted."""
    return {name: {"steps": int(count), "measured_s": measured, "predicted_s": predicted,
                   "ratio": measured / predicted if predicted else float("inf")}
            for name, (count, measured, predicted, _) in sorted(_sums(calibration, [steps], worker_process).items())}


def run_speed(calibration: Calibration, runs: list[dict[int, list[TracedStep]]], worker_process: bool
              ) -> dict[str, float]:
    """Per step kind, the factor on the calibration's step time (the coefficients; the idle penalty and the
    co-run factor as they are) under which its prediction of these runs' traced steps, pooled, sums to what
    they measured: the speed the host ran them at, against the profile's."""
    return {name: (measured - penalty) / (predicted - penalty) if predicted > penalty else 1.0
            for name, (_, measured, predicted, penalty) in sorted(_sums(calibration, runs, worker_process).items())}


def _sums(calibration: Calibration, runs: list[dict[int, list[TracedStep]]], worker_process: bool
          ) -> dict[str, list[float]]:
    """Per step kind: [steps, measured s, predicted s, the idle penalties' share of the predicted s]."""
    timer = CalibratedTimer(calibration, worker_process)
    sums: dict[str, list[float]] = {}
    for steps in runs:
        starts = {pid: [step.start for step in run] for pid, run in steps.items()}
        for pid, run in steps.items():
            for step in run:
                work = StepWork.of(step.batch)
                base, penalty = timer.step_time(work), timer.after_idle_s(step.idle_s or 0.0)
                if _another_mid_step(step.start, pid, steps, starts):  # as the simulated worker: on both
                    factor = timer.co_run_factor(work)
                    base, penalty = base * factor, penalty * factor
                total = sums.setdefault(kind(work), [0, 0.0, 0.0, 0.0])
                for index, value in enumerate((1, step.seconds, base + penalty, penalty)):
                    total[index] += value
    return sums


def _another_mid_step(start: float, pid: int, steps: dict[int, list[TracedStep]],
                      starts: dict[int, list[float]]) -> bool:
    for other, run in steps.items():
        if other != pid:
            latest = bisect.bisect_right(starts[other], start) - 1
            if latest >= 0 and run[latest].start + run[latest].seconds > start:
                return True
    return False
