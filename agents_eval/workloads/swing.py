"""Load swinging between think-heavy and act-heavy phases over the run.

The run is cut into windows of `window_s` seconds that alternate, starting with `first`: in a think window a
turn is "think" with probability `share` (large observation, short output), in an act window "act" with that
probability (small observation, output long relative to it). A turn draws its phase from the window holding
its planned arrival; the phase then decides its sizes within the workload's ranges.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from agents_eval.workloads.types import ACT, THINK


@dataclass(frozen=True)
class Swing:
    window_s: float = 15.0
    share: float = 0.8  # the window's own phase, among the turns planned in it
    first: str = THINK

    def window_phase(self, at_s: float) -> str:
        other = ACT if self.first == THINK else THINK
        return self.first if math.floor(at_s / self.window_s) % 2 == 0 else other

    def draw(self, rng: random.Random, at_s: float) -> str:
        phase = self.window_phase(at_s)
        if rng.random() < self.share:
            return phase
        return ACT if phase == THINK else THINK

    def windows(self, until_s: float) -> list[dict[str, object]]:
        """The schedule up to `until_s`, for a report to shade: start, end and phase of each window."""
        count = max(1, math.ceil(until_s / self.window_s))
        return [{"start_s": i * self.window_s, "end_s": (i + 1) * self.window_s,
                 "phase": self.window_phase(i * self.window_s)} for i in range(count)]

    def settings(self, until_s: float) -> dict[str, object]:
        return {"window_s": self.window_s, "share": self.share, "first": self.first,
                "windows": self.windows(until_s)}
