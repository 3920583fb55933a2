"""Coding agents shaped by the GitHub Copilot coding-agent traces (Azure's public dataset, June 2026: 301,026
sessions, metadata only; `analysis/GitHubCopilotCodingAgents/DATASET_CARD.md` of `Azure/AzurePublicDataset`):
a session is a few user requests, each worked through by a run of LLM calls, nearly every one calling a tool
whose output is the next call's new message.

What the card gives and what is kept:
- 3.95 user turns per session: 1 + a geometric number of follow-ups (mean 3.95 in all);
- 7.83 LLM calls per user turn: lognormal, median 6.5, sigma 0.6 (mean 7.8), clipped to [1, 30]; every call
  but a user turn's last answers a tool call (7.3 tool calls per turn on the card, 6.8 here: parallel calls
  come as one observation);
- prompt to completion tokens 128:1: replies of 12-36 tokens (a call's JSON, or a short answer) over histories
  that grow by ~150 tokens a call, so the mean prompt is ~2.6k tokens (107:1 at seed 0);
- 85.7% of prompt tokens cached: not imposed, it is what a server reuses (the report measures it); with every
  prefix reused only ~4% of prompt tokens are new.

Scaled to SmolLM2's 8,192-token context (length_scale 1; 0.25 fits the `tiny` model's 2,048): system prompt
and tool docs 800 tokens; a user request lognormal median 50; an observation from the quality bench's
generators (shell listings and logs; `observations`), lognormal sigma 0.6, median 100 in a think turn (a file
view, a test log), 30 in an act turn (an edit applied, a short command), capped at 1,200; the chat template's
~56 tokens a call on top. Sessions outgrowing the context lose their last calls (seed 0: 24.5 calls and 3.2
user turns a session are left of 31 and 3.95; settings["context_fit"]). Time, scaled to this host: tool gaps
lognormal median 0.5 s (as swe), a user's follow-up after a median 5 s (the agent works unattended; a person
reads its answer). Calls use chat function calling with a `shell` tool, as the Agents SDK sends them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from agents_eval.workloads.arrivals import ToolGaps
from agents_eval.workloads.swe import TOOL_GAPS
from agents_eval.workloads.swing import Swing
from agents_eval.workloads.synthetic import (
    SyntheticOptions,
    Texts,
    build_synthetic,
    observation_message,
    scaled_tokens,
    token_text,
    tool_schema,
)
from agents_eval.workloads.text import TokenText
from agents_eval.workloads.types import APPEND, THINK, TOOL_OBSERVATIONS, SessionScript, Turn, Workload
from engine.model.tokenizer import Tokenizer

CONTEXT = 8192  # the context the sizes are drawn for (SmolLM2's)
SYSTEM_TOKENS = 800
USER_TURNS_MEAN = 3.95
CALLS_MEDIAN = 6.5
CALLS_SIGMA = 0.6
CALLS_RANGE = (1, 30)
USER_MESSAGE_MEDIAN = 50
THINK_OBSERVATION_MEDIAN = 100
ACT_OBSERVATION_MEDIAN = 30
OBSERVATION_SIGMA = 0.6
OBSERVATION_CAP = 1200
OUTPUT = (12, 36)
USER_GAPS = ToolGaps(median_s=5.0, sigma=1.0, cap_s=120.0)


@dataclass(frozen=True)
class CodingAgentShape:
    name: str = "coding-agent"
    history: str = APPEND
    gaps: ToolGaps = TOOL_GAPS
    tool: str = "shell"

    def system_tokens(self, length_scale: float) -> int:
        return scaled_tokens(SYSTEM_TOKENS, length_scale)

    def turn_count(self, rng: random.Random) -> int:
        return sum(self.calls_per_request(rng) for _ in range(self.user_requests(rng)))

    def user_requests(self, rng: random.Random) -> int:
        count = 1
        while rng.random() > 1 / USER_TURNS_MEAN:
            count += 1
        return count

    def calls_per_request(self, rng: random.Random) -> int:
        drawn = round(rng.lognormvariate(math.log(CALLS_MEDIAN), CALLS_SIGMA))
        return min(CALLS_RANGE[1], max(CALLS_RANGE[0], drawn))

    def turn_sizes(self, rng: random.Random, phase: str, length_scale: float) -> tuple[int, int]:
        median = THINK_OBSERVATION_MEDIAN if phase == THINK else ACT_OBSERVATION_MEDIAN
        drawn = min(OBSERVATION_CAP, rng.lognormvariate(math.log(median), OBSERVATION_SIGMA))
        return scaled_tokens(drawn, length_scale), rng.randint(*OUTPUT)

    def request_tokens(self, rng: random.Random, length_scale: float) -> int:
        return scaled_tokens(rng.lognormvariate(math.log(USER_MESSAGE_MEDIAN), OBSERVATION_SIGMA), length_scale)

    def settings(self, length_scale: float) -> dict[str, object]:
        return {"source": "GitHub Copilot coding-agent traces (Azure public dataset, metadata)",
                "system_tokens": self.system_tokens(length_scale), "user_turns_mean": USER_TURNS_MEAN,
                "calls_per_user_turn": {"distribution": "lognormal", "median": CALLS_MEDIAN, "sigma": CALLS_SIGMA,
                                        "range": CALLS_RANGE},
                "user_message": {"distribution": "lognormal", "median": USER_MESSAGE_MEDIAN,
                                 "sigma": OBSERVATION_SIGMA, "scaled_by": length_scale},
                "observation": {"distribution": "lognormal", "think_median": THINK_OBSERVATION_MEDIAN,
                                "act_median": ACT_OBSERVATION_MEDIAN, "sigma": OBSERVATION_SIGMA,
                                "cap": OBSERVATION_CAP, "scaled_by": length_scale},
                "output": OUTPUT, "user_gaps": USER_GAPS.settings(1.0), "history": self.history}

    def session(self, options: SyntheticOptions, texts: Texts, index: int, start: float, system: str,
                system_tokens: int) -> SessionScript:
        """One session: user requests, each followed by its run of tool-calling calls; a follow-up request
        comes after the previous run's answer and a user's gap, an observation after a tool's gap."""
        rng = random.Random(f"{options.seed}:{self.name}:{index}")
        session_id = f"{self.name}-{options.seed}-{index:05d}"
        tools = (tool_schema(self.tool),) if options.observations == TOOL_OBSERVATIONS else ()
        turns: list[Turn] = []
        at = start
        for _ in range(self.user_requests(rng)):
            for call in range(self.calls_per_request(rng)):
                turns.append(self._turn(rng, options, texts, session_id, len(turns), call == 0, at, tools))
                at = (turns[-1].planned_at_s or at) + options.assumed_reply_s
        return SessionScript(session_id, start, system, tuple(turns), system_tokens)

    def _turn(self, rng: random.Random, options: SyntheticOptions, texts: Texts, session_id: str, step: int,
              asks: bool, at: float, tools: tuple[dict[str, object], ...]) -> Turn:
        gap = 0.0 if step == 0 else (USER_GAPS if asks else self.gaps).draw(rng, options.time_scale)
        at += gap if step else 0.0
        phase = options.swing.draw(rng, at)
        new_tokens, output_tokens = self.turn_sizes(rng, phase, options.length_scale)
        if asks:
            new_tokens = self.request_tokens(rng, options.length_scale)
            message = {"role": "user", "content": texts.words.block((session_id, step), new_tokens)}
        else:
            content = texts.outputs.text(self.tool, (session_id, step), new_tokens)
            message = observation_message(step, content, self.tool, bool(tools))
        return Turn(at if step == 0 else None, gap, (message,), new_tokens, output_tokens, THINK if asks else phase,
                    self.history, at, tools)


def build(*, seed: int = 0, rate: float = 0.05, duration_s: float = 120.0, max_sessions: int | None = None,
          max_requests: int | None = 400, length_scale: float | None = None, time_scale: float = 1.0,
          tokenizer: Tokenizer | TokenText | None = None, max_model_len: int | None = 8192,
          swing: Swing | None = None, assumed_reply_s: float = 1.0, observations: str = TOOL_OBSERVATIONS) -> Workload:
    """Coding-agent sessions arriving at `rate` per second for `duration_s`, sized for an 8,192-token context at
    length_scale 1; by default (None) the sizes scale with max_model_len (0.25 for the `tiny` model's 2,048).
    Sessions that outgrow max_model_len lose their last calls (settings["context_fit"])."""
    scale = length_scale if length_scale is not None else min(1.0, (max_model_len or CONTEXT) / CONTEXT)
    options = SyntheticOptions(seed, rate, duration_s, max_sessions, max_requests, scale, time_scale,
                               max_model_len, swing or Swing(), assumed_reply_s, observations)
    shape = CodingAgentShape()
    return build_synthetic(shape, options, token_text(tokenizer, seed), shape.session)
