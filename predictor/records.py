"""Types shared by recording, training data and the online forecaster. No torch here: the controller imports
`Forecast` without pulling in the model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

Phase = Literal["think", "act"]
PHASES: tuple[Phase, ...] = ("think", "act")


class PredictorInputError(ValueError):
    """Bad input to the predictor (a trace, a recording, a model file, a number): one line, no traceback."""


@dataclass(frozen=True)
class TurnRecord:
    """One agent turn as the gateway (or a trace) saw it.

    `new_tokens` are the prompt tokens not covered by the session's previous request: `prompt_tokens` minus
    `cached_tokens`, the prefill work. `tool_gap_s` is the time from the arrival of the session's previous turn
    to this turn's arrival (0 for a session's first turn); traces carry only arrival times, so this is the
    definition the model learns.
    """

    new_tokens: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    tool_gap_s: float
    phase: Phase

    def __post_init__(self) -> None:
        counts = {"new_tokens": self.new_tokens, "prompt_tokens": self.prompt_tokens,
                  "cached_tokens": self.cached_tokens, "output_tokens": self.output_tokens}
        for name, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PredictorInputError(f"{name} must be a non-negative integer, got {value!r}")
        gap = self.tool_gap_s
        if isinstance(gap, bool) or not isinstance(gap, int | float) or not math.isfinite(gap) or gap < 0:
            raise PredictorInputError(f"tool_gap_s must be a finite number of seconds >= 0, got {gap!r}")
        if self.phase not in PHASES:
            raise PredictorInputError(f"phase must be 'think' or 'act', got {self.phase!r}")


def phase_of(new_tokens: int, output_tokens: int) -> Phase:
    """The phase of a trace turn that carries none: think when it prefills more tokens than it decodes."""
    return "think" if new_tokens > output_tokens else "act"


class NextTurn(NamedTuple):
    """A prediction of a session's next turn."""

    new_tokens: float
    output_tokens: float
    gap_s: float


@dataclass(frozen=True)
class Forecast:
    """The load the live sessions are expected to send within the forecast horizon."""

    prefill_tokens: float
    decode_tokens: float
    sessions: int
