"""SWE-agent-shaped coding agents: an append-only history of shell observations and short actions.

Sizes at length_scale 1 (observation and system tokens are multiplied by length_scale and rounded, at least
1; outputs are not, 30 tokens being CPU-sized already):
- system: 1,536 tokens (instructions, tool docs, a demonstration), the same for every session;
- turns: round(lognormal(median 16, sigma 0.5)) clipped to [3, 60] (mean about 18); the first turn's
  observation is the issue;
- observation: a think turn's (a file view, a test log) is lognormal, median 2,500 tokens, sigma 0.5, capped
  at 8,000 (mean about 2,800); an act turn's (an edit applied, a short command) is uniform in 50-400;
- output: uniform in 12-28 tokens in a think turn, 28-52 in an act turn (about 30 over a swinging run);
- history "append": every observation and reply stays;
- tool gaps (shell commands, test runs): lognormal, median 0.5 s, sigma 1.5, capped at 60 s.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from agents_eval.workloads.arrivals import ToolGaps
from agents_eval.workloads.swing import Swing
from agents_eval.workloads.synthetic import SyntheticOptions, build_synthetic, scaled_tokens, token_text
from agents_eval.workloads.text import TokenText
from agents_eval.workloads.types import APPEND, THINK, TOOL_OBSERVATIONS, Workload
from engine.model.tokenizer import Tokenizer

SYSTEM_TOKENS = 1536
TURNS_MEDIAN = 16
TURNS_SIGMA = 0.5
MIN_TURNS = 3
MAX_TURNS = 60
THINK_OBSERVATION_MEDIAN = 2500
THINK_OBSERVATION_SIGMA = 0.5
THINK_OBSERVATION_CAP = 8000
ACT_OBSERVATION = (50, 400)
THINK_OUTPUT = (12, 28)
ACT_OUTPUT = (28, 52)
TOOL_GAPS = ToolGaps(median_s=0.5, sigma=1.5, cap_s=60.0)


@dataclass(frozen=True)
class SweShape:
    name: str = "swe"
    history: str = APPEND
    gaps: ToolGaps = TOOL_GAPS
    tool: str = "shell"

    def system_tokens(self, length_scale: float) -> int:
        return scaled_tokens(SYSTEM_TOKENS, length_scale)

    def turn_count(self, rng: random.Random) -> int:
        return min(MAX_TURNS, max(MIN_TURNS, round(rng.lognormvariate(math.log(TURNS_MEDIAN), TURNS_SIGMA))))

    def turn_sizes(self, rng: random.Random, phase: str, length_scale: float) -> tuple[int, int]:
        if phase == THINK:
            drawn = rng.lognormvariate(math.log(THINK_OBSERVATION_MEDIAN), THINK_OBSERVATION_SIGMA)
            return scaled_tokens(min(THINK_OBSERVATION_CAP, drawn), length_scale), rng.randint(*THINK_OUTPUT)
        return scaled_tokens(rng.uniform(*ACT_OBSERVATION), length_scale), rng.randint(*ACT_OUTPUT)

    def settings(self, length_scale: float) -> dict[str, object]:
        return {"system_tokens": self.system_tokens(length_scale),
                "turns": {"distribution": "lognormal", "median": TURNS_MEDIAN, "sigma": TURNS_SIGMA,
                          "min": MIN_TURNS, "max": MAX_TURNS},
                "think_observation": {"distribution": "lognormal", "median": THINK_OBSERVATION_MEDIAN,
                                      "sigma": THINK_OBSERVATION_SIGMA, "cap": THINK_OBSERVATION_CAP,
                                      "scaled_by": length_scale},
                "act_observation": {"distribution": "uniform", "range": ACT_OBSERVATION, "scaled_by": length_scale},
                "think_output": THINK_OUTPUT, "act_output": ACT_OUTPUT, "history": self.history}


def build(*, seed: int = 0, rate: float = 0.2, duration_s: float = 60.0, max_sessions: int | None = None,
          max_requests: int | None = 200, length_scale: float = 0.03, time_scale: float = 1.0,
          tokenizer: Tokenizer | TokenText | None = None, max_model_len: int | None = 2048,
          swing: Swing | None = None, assumed_reply_s: float = 1.0, observations: str = TOOL_OBSERVATIONS) -> Workload:
    """SWE-agent-shaped sessions arriving at `rate` per second for `duration_s`. At the default length_scale
    most sessions fit the `tiny` model's 2,048-token context (max_model_len; None: no limit), the chat
    template's markers and the replies taking about 60 tokens a turn; longer ones lose their last turns
    (settings["context_fit"]). `observations`: "tool" sends each observation after the issue as a `tool`
    message answering a `shell` call (chat function calling), "user" as a user message, as SWE-agent does."""
    options = SyntheticOptions(seed, rate, duration_s, max_sessions, max_requests, length_scale, time_scale,
                               max_model_len, swing or Swing(), assumed_reply_s, observations)
    return build_synthetic(SweShape(), options, token_text(tokenizer, seed))
