"""The real runs' steps against the calibration: every step a validation run's engine processes traced
(engine/step_trace.py), timed as the simulator times its batch (the calibrated step time, the idle penalty
after the gap before it, the co-run factor when another engine process was mid-step as it began), summed per
step kind. A ratio away from 1 says the host ran the run at another speed than it ran the profile, or that the
step model misses something; the run's figures carry that error whatever the simulator's scheduling does."""

from __future__ import annotations

import bisect
from typing import Any

from agents_eval.sim.calibration import CalibratedTimer, Calibration, kind
from agents_eval.sim.cost import StepWork
from engine.step_trace import TracedStep


def agreement(calibration: Calibration, steps: dict[int, list[TracedStep]], worker_process: bool
              ) -> dict[str, dict[str, Any]]:
    """Per step kind: steps, measured and predicted seconds (summed), measured over predicted."""
    timer = CalibratedTimer(calibration, worker_process)
    starts = {pid: [step.start for step in run] for pid, run in steps.items()}
    sums: dict[str, list[float]] = {}
    for pid, run in steps.items():
        for step in run:
            work = StepWork.of(step.batch)
            predicted = timer.step_time(work) + timer.after_idle_s(step.idle_s or 0.0)
            if _another_mid_step(step.start, pid, steps, starts):
                predicted *= timer.co_run_factor(work)
            total = sums.setdefault(kind(work), [0, 0.0, 0.0])
            total[0], total[1], total[2] = total[0] + 1, total[1] + step.seconds, total[2] + predicted
    return {name: {"steps": int(count), "measured_s": measured, "predicted_s": predicted,
                   "ratio": measured / predicted if predicted else float("inf")}
            for name, (count, measured, predicted) in sorted(sums.items())}


def _another_mid_step(start: float, pid: int, steps: dict[int, list[TracedStep]],
                      starts: dict[int, list[float]]) -> bool:
    for other, run in steps.items():
        if other != pid:
            latest = bisect.bisect_right(starts[other], start) - 1
            if latest >= 0 and run[latest].start + run[latest].seconds > start:
                return True
    return False
