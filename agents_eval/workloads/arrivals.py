"""Open-loop session arrivals and heavy-tailed tool gaps, both seeded.

Tool gaps are lognormal: median `median_s`, shape `sigma` (mean = median * exp(sigma^2 / 2), p99 = median *
exp(2.326 sigma)), capped at `cap_s` (a tool that runs longer is killed by the agent's timeout); all three
are multiplied by the run's time_scale.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolGaps:
    median_s: float
    sigma: float
    cap_s: float

    def draw(self, rng: random.Random, time_scale: float = 1.0) -> float:
        gap = min(self.cap_s, rng.lognormvariate(math.log(self.median_s), self.sigma))
        return gap * time_scale

    def settings(self, time_scale: float) -> dict[str, object]:
        return {"distribution": "lognormal", "median_s": self.median_s * time_scale, "sigma": self.sigma,
                "cap_s": self.cap_s * time_scale}


def poisson_starts(rng: random.Random, rate: float, duration_s: float, max_sessions: int | None) -> list[float]:
    """Session start times of a Poisson process at `rate` per second, before `duration_s`, at most `max_sessions`."""
    starts: list[float] = []
    at = rng.expovariate(rate)
    while at < duration_s and (max_sessions is None or len(starts) < max_sessions):
        starts.append(at)
        at += rng.expovariate(rate)
    return starts
