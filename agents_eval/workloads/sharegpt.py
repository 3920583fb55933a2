"""ShareGPT-like chatbot requests: DistServe's chatbot setting (OPT-13B on A100s), one request per session.

Source: DistServe's artifact (github.com/LLMServe/DistServe, commit 20a1633ed6f2be5f456d84d1c283865c3e5112d5,
simdistserve/benchmarks/alignment/data-ground-truth/opt-13b-sharegpt/distserve-c21d12-1600-16.exp): the 1,600
requests DistServe played in its OPT-13B ShareGPT runs, with their prompt and output lengths in OPT tokens. Its
dataset preparation (distserve/evaluation/2-benchmark-serving/0-prepare-dataset.py) joins a random number of a
conversation's leading turns into the prompt, takes the next turn as the output and drops a pair whose lengths
sum to 2,048 or more (OPT's context). The figures below are that file's quantiles, computed here:

- prompt: mean 758.7 tokens, median 680; quantiles below (`PROMPT_QUANTILES`);
- output: mean 186.3 tokens, median 76.5, heavy-tailed (p99 968, max 1,809);
- prompt + output <= 2,047 (the preparation's filter).

Assumed: prompt and output are drawn independently (the records' correlation is -0.12) from the piecewise-linear
quantile function through those points, and an output that would pass the context is cut at it (as a server
stops at its maximum length; drawing the pair again instead, as the preparation dropped it, would take 5% off
both means). Drawn so, the means are 756 and 184 tokens (200,000 draws). A session is one request (no system
prompt, no follow-up turn): DistServe's requests share no prefix.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

from agents_eval.workloads.arrivals import ToolGaps
from agents_eval.workloads.types import APPEND

QUANTILE_LEVELS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
PROMPT_QUANTILES = (2, 10, 25, 89, 244, 375, 512, 680, 857, 1042, 1272, 1543, 1723, 1922, 2031)
OUTPUT_QUANTILES = (1, 2, 6, 9, 15, 22, 36, 76, 158, 258, 349, 507, 648, 968, 1809)
PROMPT_MEAN = 758.7  # of the 1,600 records
OUTPUT_MEAN = 186.3
MAX_TOTAL_TOKENS = 2047  # prompt + output < 2,048
NO_GAPS = ToolGaps(median_s=1.0, sigma=0.0, cap_s=1.0)  # a session has one turn: never drawn


def _quantile(rng: random.Random, quantiles: tuple[int, ...]) -> int:
    """A draw from the piecewise-linear quantile function through (QUANTILE_LEVELS, quantiles)."""
    level = rng.random()
    upper = min(bisect.bisect_right(QUANTILE_LEVELS, level), len(QUANTILE_LEVELS) - 1)
    low_level, high_level = QUANTILE_LEVELS[upper - 1], QUANTILE_LEVELS[upper]
    share = (level - low_level) / (high_level - low_level)
    return max(1, round(quantiles[upper - 1] + share * (quantiles[upper] - quantiles[upper - 1])))


@dataclass(frozen=True)
class ShareGptShape:
    """A `SessionShape` (agents_eval.workloads.synthetic) of one-turn chat sessions; `length_scale` multiplies
    the prompt (the output is what the user asked for, as in the swe shape)."""

    name: str = "sharegpt"
    history: str = APPEND
    gaps: ToolGaps = NO_GAPS
    tool: str = "none"

    def system_tokens(self, length_scale: float) -> int:
        return 0

    def turn_count(self, rng: random.Random) -> int:
        return 1

    def turn_sizes(self, rng: random.Random, phase: str, length_scale: float) -> tuple[int, int]:
        prompt, output = _quantile(rng, PROMPT_QUANTILES), _quantile(rng, OUTPUT_QUANTILES)
        return max(1, round(prompt * length_scale)), max(1, min(output, MAX_TOTAL_TOKENS - prompt))

    def settings(self, length_scale: float) -> dict[str, object]:
        return {"source": "DistServe artifact, OPT-13B ShareGPT request records (1,600)",
                "quantile_levels": QUANTILE_LEVELS, "prompt_quantiles": PROMPT_QUANTILES,
                "output_quantiles": OUTPUT_QUANTILES, "prompt_mean": PROMPT_MEAN, "output_mean": OUTPUT_MEAN,
                "max_total_tokens": MAX_TOTAL_TOKENS, "prompt_scaled_by": length_scale}
