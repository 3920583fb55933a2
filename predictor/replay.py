"""What the capacity controller is told against what came: a recording's turns fed to `LoadForecaster` at their
arrival times, a forecast every `step_s`, each compared with the turns that then arrived within its horizon.

The gateway observes a turn when it finishes, with its arrival time; a replay observes it on arrival, so it
measures the forecaster, not the service time. A session's first turn cannot be forecast: it counts as arrived
load no forecast held.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from predictor.features import mean_absolute_error
from predictor.forecast import LoadForecaster
from predictor.recording import TimedTurn
from predictor.records import PredictorInputError


@dataclass(frozen=True)
class ReplayErrors:
    """Per forecast, in tokens: the mean forecast, the mean that arrived, and the mean absolute error."""

    forecast: float
    arrived: float
    mae: float


@dataclass(frozen=True)
class ReplayReport:
    forecasts: int
    horizon_s: float
    prefill_tokens: ReplayErrors
    decode_tokens: ReplayErrors

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def replay(forecaster: LoadForecaster, turns: Sequence[TimedTurn], horizon_s: float, step_s: float) -> ReplayReport:
    """Forecasts from the first arrival to the last, every `step_s`; the forecaster starts empty."""
    if not turns:
        raise PredictorInputError("the recording has no turns: nothing to replay")
    if not math.isfinite(step_s) or step_s <= 0:
        raise PredictorInputError(f"the step must be a positive number of seconds, got {step_s}")
    ordered = sorted(turns, key=lambda item: item.t)
    times = [item.t for item in ordered]
    forecast: dict[str, list[float]] = {"prefill": [], "decode": []}
    arrived: dict[str, list[float]] = {"prefill": [], "decode": []}
    observed = 0
    for step in range(math.floor((times[-1] - times[0]) / step_s) + 1):
        now = times[0] + step * step_s
        for item in ordered[observed:bisect.bisect_right(times, now)]:
            forecaster.observe(item.session_id, item.turn, item.t)
        observed = bisect.bisect_right(times, now)
        told = forecaster.forecast(horizon_s, now)
        coming = ordered[observed:bisect.bisect_right(times, now + horizon_s)]
        forecast["prefill"].append(told.prefill_tokens)
        forecast["decode"].append(told.decode_tokens)
        arrived["prefill"].append(float(sum(item.turn.new_tokens for item in coming)))
        arrived["decode"].append(float(sum(item.turn.output_tokens for item in coming)))
    return ReplayReport(len(forecast["prefill"]), horizon_s, _errors(forecast["prefill"], arrived["prefill"]),
                        _errors(forecast["decode"], arrived["decode"]))


def _errors(forecast: list[float], arrived: list[float]) -> ReplayErrors:
    return ReplayErrors(sum(forecast) / len(forecast), sum(arrived) / len(arrived),
                        mean_absolute_error(forecast, arrived))
