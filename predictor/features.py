"""Per-turn features, next-turn examples, and the two baselines (last value, exponential moving average).

No torch here: the forecaster's baseline mode runs without the model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from predictor.records import NextTurn, TurnRecord

WINDOW_TURNS = 8
EMA_ALPHA = 0.5  # weight of the newest value
FEATURES = ("log1p_new_tokens", "log1p_output_tokens", "log1p_tool_gap_s", "think")
TARGETS = ("log1p_new_tokens", "log1p_output_tokens", "log1p_gap_s")

Baseline = Literal["last_value", "ema"]


def turn_features(turn: TurnRecord) -> tuple[float, float, float, float]:
    return (math.log1p(turn.new_tokens), math.log1p(turn.output_tokens), math.log1p(turn.tool_gap_s),
            1.0 if turn.phase == "think" else 0.0)


def turn_targets(turn: TurnRecord) -> tuple[float, float, float]:
    return math.log1p(turn.new_tokens), math.log1p(turn.output_tokens), math.log1p(turn.tool_gap_s)


class Baselines:
    """Last value and EMA of one session's new tokens, output tokens and arrival gaps, updated turn by turn.

    A session's first turn has no gap, so until a second turn arrives both baselines predict `fallback_gap_s`.
    """

    def __init__(self, fallback_gap_s: float, alpha: float = EMA_ALPHA) -> None:
        self.fallback_gap_s = fallback_gap_s
        self.alpha = alpha
        self.turns = 0
        self._last = NextTurn(0.0, 0.0, fallback_gap_s)
        self._ema = NextTurn(0.0, 0.0, fallback_gap_s)

    def observe(self, turn: TurnRecord) -> None:
        self.turns += 1
        gap = turn.tool_gap_s if self.turns > 1 else self.fallback_gap_s
        latest = NextTurn(float(turn.new_tokens), float(turn.output_tokens), gap)
        if self.turns == 1:
            self._ema = latest
        else:
            ema_gap = gap if self.turns == 2 else self._blend(self._ema.gap_s, gap)
            self._ema = NextTurn(self._blend(self._ema.new_tokens, latest.new_tokens),
                                 self._blend(self._ema.output_tokens, latest.output_tokens), ema_gap)
        self._last = latest

    def predict(self, baseline: Baseline) -> NextTurn:
        return self._last if baseline == "last_value" else self._ema

    def _blend(self, old: float, new: float) -> float:
        return self.alpha * new + (1 - self.alpha) * old


@dataclass(frozen=True)
class Example:
    """One next-turn target with what each predictor sees before it."""

    history: tuple[TurnRecord, ...]  # the last `window` turns before the target, oldest first
    target: TurnRecord
    last_value: NextTurn
    ema: NextTurn
    turn_index: int  # the target's place in its session: 2 for a second turn


def session_examples(turns: Sequence[TurnRecord], window: int, fallback_gap_s: float) -> list[Example]:
    """An example for every turn of the session but its first."""
    baselines = Baselines(fallback_gap_s)
    found = []
    for index, turn in enumerate(turns):
        if index:
            history = tuple(turns[max(0, index - window):index])
            found.append(Example(history, turn, baselines.predict("last_value"), baselines.predict("ema"), index + 1))
        baselines.observe(turn)
    return found


def examples(sessions: Iterable[Sequence[TurnRecord]], window: int, fallback_gap_s: float) -> list[Example]:
    return [example for turns in sessions for example in session_examples(turns, window, fallback_gap_s)]


def typical_gap_s(sessions: Iterable[Sequence[TurnRecord]]) -> float:
    """The median arrival gap between turns: what a session with a single turn is assumed to wait."""
    gaps = [turn.tool_gap_s for turns in sessions for turn in turns[1:]]
    return statistics.median(gaps) if gaps else 0.0


def mean_absolute_error(predicted: Sequence[float], actual: Sequence[float]) -> float:
    if not actual:
        return 0.0
    return sum(abs(p - a) for p, a in zip(predicted, actual, strict=True)) / len(actual)
