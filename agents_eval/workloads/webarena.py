"""WebArena-shaped web agents: a fixed instruction prefix, a page observation replaced every step.

At length_scale 1 (sizes in tokens are multiplied by length_scale and rounded, at least 1):
- system: the same 1,024-token instruction prefix for every session (prefix caching can share it);
- steps: round(lognormal(median 9, sigma 0.7)) clipped to [2, 30] (mean about 11; WebArena stops at 30);
- observation (the page's accessibility tree), uniform in a share of 1,920 tokens: 60-100% in a think
  turn, 10-35% in an act turn;
- output (reasoning and the action), uniform in a share of 384 tokens: 5-25% in a think turn, 50-100% in
  an act turn;
- history "last_action": a request is the prefix, the previous reply and the new observation;
- tool gaps (the browser acting and loading): lognormal, median 1 s, sigma 1.2, capped at 30 s.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from agents_eval.workloads.arrivals import ToolGaps
from agents_eval.workloads.swing import Swing
from agents_eval.workloads.synthetic import SyntheticOptions, build_synthetic, scaled_tokens, token_text
from agents_eval.workloads.text import TokenText
from agents_eval.workloads.types import ACT, LAST_ACTION, THINK, TOOL_OBSERVATIONS, Workload
from engine.model.tokenizer import Tokenizer

SYSTEM_TOKENS = 1024
MAX_OBSERVATION_TOKENS = 1920
MAX_OUTPUT_TOKENS = 384
MAX_STEPS = 30
MIN_STEPS = 2
STEPS_MEDIAN = 9
STEPS_SIGMA = 0.7
# (low, high) shares of the maximum, by phase
OBSERVATION_SHARE = {THINK: (0.6, 1.0), ACT: (0.1, 0.35)}
OUTPUT_SHARE = {THINK: (0.05, 0.25), ACT: (0.5, 1.0)}
TOOL_GAPS = ToolGaps(median_s=1.0, sigma=1.2, cap_s=30.0)


@dataclass(frozen=True)
class WebArenaShape:
    name: str = "webarena"
    history: str = LAST_ACTION
    gaps: ToolGaps = TOOL_GAPS
    tool: str = "browser"

    def system_tokens(self, length_scale: float) -> int:
        return scaled_tokens(SYSTEM_TOKENS, length_scale)

    def turn_count(self, rng: random.Random) -> int:
        return min(MAX_STEPS, max(MIN_STEPS, round(rng.lognormvariate(math.log(STEPS_MEDIAN), STEPS_SIGMA))))

    def turn_sizes(self, rng: random.Random, phase: str, length_scale: float) -> tuple[int, int]:
        observation = scaled_tokens(MAX_OBSERVATION_TOKENS * rng.uniform(*OBSERVATION_SHARE[phase]), length_scale)
        output = scaled_tokens(MAX_OUTPUT_TOKENS * rng.uniform(*OUTPUT_SHARE[phase]), length_scale)
        return observation, output

    def settings(self, length_scale: float) -> dict[str, object]:
        return {"system_tokens": self.system_tokens(length_scale),
                "max_observation_tokens": scaled_tokens(MAX_OBSERVATION_TOKENS, length_scale),
                "max_output_tokens": scaled_tokens(MAX_OUTPUT_TOKENS, length_scale),
                "steps": {"distribution": "lognormal", "median": STEPS_MEDIAN, "sigma": STEPS_SIGMA,
                          "min": MIN_STEPS, "max": MAX_STEPS},
                "observation_share": OBSERVATION_SHARE, "output_share": OUTPUT_SHARE, "history": self.history}


def build(*, seed: int = 0, rate: float = 0.2, duration_s: float = 60.0, max_sessions: int | None = None,
          max_requests: int | None = 200, length_scale: float = 0.25, time_scale: float = 1.0,
          tokenizer: Tokenizer | TokenText | None = None, max_model_len: int | None = 2048,
          swing: Swing | None = None, assumed_reply_s: float = 1.0, observations: str = TOOL_OBSERVATIONS) -> Workload:
    """WebArena-shaped sessions arriving at `rate` per second for `duration_s`; `max_model_len` defaults to
    the `tiny` model's context (configs/models/tiny.yaml), None for no limit. `observations`: "tool" sends each
    page after the first as a `tool` message answering a `browser` call, "user" as a user message (WebArena's)."""
    options = SyntheticOptions(seed, rate, duration_s, max_sessions, max_requests, length_scale, time_scale,
                               max_model_len, swing or Swing(), assumed_reply_s, observations)
    return build_synthetic(WebArenaShape(), options, token_text(tokenizer, seed))
